"""Screenshots of docs/review.md: a smoke run reviewed in the real MLflow UI (a docs tool, not part of CI).

    python scripts/review_screenshots.py            # writes docs/images/review-*.png

What it does: trains the LangChain RTPO smoke config (tiny random model, CPU, ~1 minute) in a temporary folder with
a trace every step and the final model registered, starts ``mlflow server`` on 127.0.0.1 over that store, and
drives headless Chromium (Debian's ``chromium``; installed here with ``apt-get install -y chromium`` when missing)
to the run page, the metric charts, a trace's chat view and the Models tab. Each page is cropped and saved small.
"""

from __future__ import annotations

import argparse
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

CONFIG = ROOT / "configs/smoke/langchain_rtpo.yaml"
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


def train(folder: Path, steps: int) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "agentrl.cli", "fit", "--config", str(CONFIG), "--data.steps", str(steps),
           "--tracking.every_n_steps", "1", "--tracking.register_model", MODEL]
    subprocess.run(cmd, cwd=folder, env=env, check=True)


def shoot(browser: str, url: str, out: Path, size: tuple[int, int], crop: tuple[int, int, int, int] | None) -> None:
    """Load ``url`` (the UI is a single-page app: give its scripts virtual time) and save a cropped PNG."""
    from PIL import Image

    raw = out.with_suffix(".raw.png")
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=20000",
                    f"--screenshot={raw}", url], check=True, capture_output=True, timeout=180)
    image = Image.open(raw).convert("RGB")
    if crop:
        image = image.crop(crop)
    image = image.quantize(colors=128)  # UI screenshots have few colours: small PNGs
    image.save(out, optimize=True)
    raw.unlink()
    print(f"{out.relative_to(ROOT)}: {out.stat().st_size // 1024} KB  <- {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="RL steps of the smoke run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images")
    args = parser.parse_args()
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        train(folder, args.steps)
        server = start_mlflow_server(f"sqlite:///{folder / 'mlflow.db'}", folder)
        try:
            from mlflow import MlflowClient

            client = MlflowClient(server.url)
            (exp,) = [e for e in client.search_experiments() if e.name == "agentrl-smoke"]
            (run,) = client.search_runs([exp.experiment_id])
            trace = client.search_traces(locations=[exp.experiment_id], run_id=run.info.run_id)[0]
            base, eid, rid = server.url, exp.experiment_id, run.info.run_id
            time.sleep(1)
            pages = {
                "review-run.png": (f"{base}/#/experiments/{eid}/runs/{rid}", (1400, 1000), None),
                "review-metrics.png": (f"{base}/#/experiments/{eid}/runs/{rid}/model-metrics", (1400, 1000), None),
                "review-trace.png": (f"{base}/#/experiments/{eid}/traces?selectedEvaluationId="
                                     f"{trace.info.trace_id}", (1400, 1000), None),
                "review-models.png": (f"{base}/#/models/{MODEL}", (1400, 700), None),
            }
            for name, (url, size, crop) in pages.items():
                shoot(browser, url, args.out / name, size, crop)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
