"""Screenshots of docs/review.md: a smoke run reviewed in the real MLflow UI (a docs tool, not part of CI).

    python scripts/review_screenshots.py                   # writes docs/images/review-*.png
    python scripts/review_screenshots.py --part training   # only the training-run pictures (below)

What it does: trains the LangChain RTPO smoke config (tiny random model, CPU, ~1 minute) in a temporary folder with
a trace every step and the final model registered, starts ``mlflow server`` on 127.0.0.1 over that store, and
drives headless Chromium (Debian's ``chromium``; installed here with ``apt-get install -y chromium`` when missing)
over the DevTools protocol (the ``websockets`` package) to the run page, the metric charts, a trace's chat view
and the Models tab. Each page is cropped and saved in few colours (small PNGs).

The training-run pictures (``--part training``) come from a second run, ``configs/smoke/rtpo.yaml`` (GuessNumber,
whose rewards differ between siblings, so the credit has something to show) for 3 steps with a held-out
evaluation, opened in a real ``mlflow ui`` through the link agentrl prints (``?workflowType=machine_learning``):
the experiment's runs list, the run page, its metric charts (the ``Summary`` section first, then filtered to
``rtpo/depth0/``) and the ``credit.png`` artifact.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.mlflow_server import start_mlflow_server  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

CONFIG = ROOT / "configs/smoke/langchain_rtpo.yaml"
TRAINING_CONFIG = ROOT / "configs/smoke/rtpo.yaml"
MODEL = "smoke-policy"


def chromium() -> str:
    """Path of the Chromium binary, installing Debian's package when it is missing."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    subprocess.run(["apt-get", "install", "-y", "chromium"], check=True)
    found = shutil.which("chromium")
    if not found:
        raise SystemExit("chromium is not installed and apt-get could not install it")
    return found


def train(folder: Path, steps: int, config: Path = CONFIG, extra: tuple[str, ...] = ()) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "agentrl.cli", "fit", "--config", str(config), "--data.steps", str(steps),
           "--tracking.every_n_steps", "1", *(extra or ("--tracking.register_model", MODEL))]
    subprocess.run(cmd, cwd=folder, env=env, check=True)


def mlflow_ui(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``mlflow ui`` over ``folder/mlflow.db`` on a free port of 127.0.0.1, once ``/health`` answers."""
    from agentrl.serve.child_process import wait_healthy

    port = free_port()
    log = (folder / "mlflow-ui.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri",
                             f"sqlite:///{folder / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("mlflow ui", url, proc, 150.0, log=folder / "mlflow-ui.log")
    except RuntimeError as e:
        proc.terminate()
        raise SystemExit(str(e)) from None
    return proc, url


def training_shots(binary: str, folder: Path, out: Path) -> None:
    """The training run's pictures (see the module docstring), through the run link agentrl prints."""
    from mlflow import MlflowClient

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "mlflow.db").exists():
        train(folder, 3, TRAINING_CONFIG, ("--data.eval_episodes", "4"))
    proc, url = mlflow_ui(folder)
    try:
        from agentrl.tracking.store import run_page_url

        client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        (exp,) = [e for e in client.search_experiments() if e.name == "agentrl-smoke"]
        (run,) = client.search_runs([exp.experiment_id])
        page = run_page_url(exp.experiment_id, run.info.run_id, url)
        browser = Browser(binary, (1600, 1000))
        try:
            crop = (0, 0, 1236, 1000)
            browser.open(page, wait=15)  # the link: the Model training layout
            browser.shoot(out / "review-run.png", crop)
            browser.open(page.replace("?", "/model-metrics?"), wait=25)  # the charts load slowly on a busy CPU
            browser.shoot(out / "review-metrics.png", crop)
            browser.type_into("input[placeholder='Search metric charts']", "rtpo/depth0/", wait=6)
            browser.shoot(out / "review-metrics-depth.png", crop)
            browser.open(f"{url}/#/experiments/{exp.experiment_id}?workflowType=machine_learning", wait=10)
            browser.shoot(out / "review-runs.png", (0, 0, 1236, 420))
            browser.open(page.replace("?", "/artifacts/credit.png?"), wait=8)
            browser.shoot(out / "review-credit.png", crop)
        finally:
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class Browser:
    """Headless Chromium driven over the DevTools protocol: navigate, wait, click by visible text, screenshot."""

    def __init__(self, binary: str, size: tuple[int, int]) -> None:
        import httpx
        from websockets.sync.client import connect

        port = free_port()
        self.proc = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                      f"--remote-debugging-port={port}", "--remote-debugging-address=127.0.0.1",
                                      f"--window-size={size[0]},{size[1]}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
                break
            except (httpx.HTTPError, StopIteration):
                time.sleep(0.3)
        else:
            raise SystemExit("chromium did not start")
        self.ws = connect(url, max_size=None)
        self._id = 0
        self.send("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)

    def send(self, method: str, **params: object) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self._id:
                return reply.get("result", {})

    def open(self, url: str, wait: float) -> None:
        self.send("Page.navigate", url=url)
        time.sleep(wait)

    def click_text(self, text: str, wait: float = 2.0) -> bool:
        """Click the innermost visible element whose text starts with ``text``."""
        js = f"""(() => {{
          const all = [...document.querySelectorAll('button, a, span, div, td')]
            .filter(e => e.offsetParent !== null && e.innerText && e.innerText.trim().startsWith({json.dumps(text)}));
          const inner = all.filter(e => !all.some(o => o !== e && e.contains(o)));
          if (!inner.length) return false;
          inner[0].click(); return true; }})()"""
        found = bool(self.send("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value"))
        time.sleep(wait)
        return found

    def type_into(self, selector: str, text: str, wait: float) -> None:
        """Focus the element matching ``selector`` and type ``text`` as a user would."""
        self.send("Runtime.evaluate", expression=f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)
        time.sleep(wait)

    def shoot(self, out: Path, crop: tuple[int, int, int, int]) -> None:
        """Save the page, cropped (the MLflow Assistant panel on the right is left out), in few colours."""
        from PIL import Image

        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        image = Image.open(io.BytesIO(data)).convert("RGB").crop(crop).quantize(colors=128)
        image.save(out, optimize=True)
        print(f"{out.relative_to(ROOT)}: {out.stat().st_size // 1024} KB")

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="RL steps of the smoke run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the run here (default: a temporary folder); an existing run there is reused")
    parser.add_argument("--part", choices=["all", "training"], default="all",
                        help="training: only the training run's pictures")
    args = parser.parse_args()
    chromium_binary = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        training_shots(chromium_binary, (args.workdir or Path(tmp)).resolve() / "training", args.out)
        if args.part == "training":
            return
        folder = (args.workdir or Path(tmp)).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "mlflow.db").exists():
            train(folder, args.steps)
        server = start_mlflow_server(f"sqlite:///{folder / 'mlflow.db'}", folder)
        try:
            from mlflow import MlflowClient

            client = MlflowClient(server.url)
            (exp,) = [e for e in client.search_experiments() if e.name == "agentrl-smoke"]
            (run,) = client.search_runs([exp.experiment_id])
            trace = client.search_traces(locations=[exp.experiment_id], run_id=run.info.run_id)[0]
            base, eid, rid = server.url, exp.experiment_id, run.info.run_id
            question = trace.data.spans[0].inputs["messages"][-1]["content"]
            browser = Browser(chromium_binary, (1600, 1000))
            try:
                browser.open(f"{base}/#/experiments/{eid}/traces", wait=6)
                browser.click_text("Got it", wait=1)
                browser.click_text(question, wait=5)
                browser.click_text("turn 0", wait=4)  # the chat span: messages, reply, tools, tokens
                browser.shoot(args.out / "review-trace.png", (0, 0, 1120, 1000))
                browser.open(f"{base}/#/models/{MODEL}", wait=5)
                browser.shoot(args.out / "review-models.png", (0, 0, 1236, 520))
            finally:
                browser.close()
            figure = client.download_artifacts(rid, "rtpo_depths.png", str(folder))  # the run's own figure
            shutil.copyfile(figure, args.out / "review-rtpo-depths.png")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
