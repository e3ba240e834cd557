"""Screenshots of the credit in the traces (docs/review.md): a Turn-PPO and an RTPO step in the real MLflow UI.

    python scripts/credit_screenshots.py            # writes docs/images/review-credit*.png

What it does: trains one RL step of Turn-PPO and one of RTPO in this process with the tiny random model on the
tests' `LetterAgent` (a per-turn reward for ASCII letters, which a random byte-level model moves, so advantages
are not all zero), logging every episode to a sqlite store in a temporary folder; starts ``mlflow server`` on
127.0.0.1 over it and drives headless Chromium (`review_screenshots.Browser`) to

* ``review-credit-turn.png``: a Turn-PPO turn span's attributes (advantage, critic value, GAE return, trained);
* ``review-credit-rtpo-sibling.png``: an RTPO sibling of depth 1, its root span naming its tree, role, depth,
  sibling group and its trunk's trace id;
* ``review-credit-rtpo-branch.png``: that sibling's branch turn (turn 1): its depth-1 sibling advantage;
* ``review-credit-rtpo-trunk.png``: its trunk's tags: its own trace id, its tree and its siblings' trace ids.

Each page is opened by URL (``#/experiments/<id>/traces?selectedEvaluationId=<trace id>``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from review_screenshots import Browser, chromium  # noqa: E402
from tests.support.mlflow_server import start_mlflow_server  # noqa: E402

EXPERIMENT = "agentrl-credit"


def train(folder: Path) -> None:
    """One RL step of Turn-PPO and one of RTPO, traced (RTPO: one whole tree, a trunk and 2 siblings per depth)."""
    from tests.training.helpers import fit, letter_data, make_module

    from agentrl.tracking import MLflowLogger
    from agentrl.tracking.review import TrajectoryLogger
    from agentrl.training.schedules.rtpo import RTPO
    from agentrl.training.schedules.turn_ppo import TurnPPO

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    # the critic's warm-up gives the Turn-PPO turns non-zero values (a fresh critic says V = 0)
    for name, schedule in (("turn-ppo", TurnPPO(group_size=2, value_warmup_epochs=4)), ("rtpo", RTPO(group_size=3))):
        logger = MLflowLogger(experiment_name=EXPERIMENT, run_name=name, tracking_uri=uri,
                              fallback_uri=f"sqlite:///{folder / 'fallback.db'}")
        callback = TrajectoryLogger(every_n_steps=1, max_trajectories=8, log_final_model=False)
        fit(make_module(schedule), letter_data(batch_size=4, steps=1), callbacks=[callback], logger=logger)


def _traces(client: Any, eid: str, run_id: str) -> list[Any]:
    return list(client.search_traces(locations=[eid], run_id=run_id, max_results=100))


def _trained(trace: Any, turn: int) -> bool:
    return any(s.name == f"turn {turn}" and s.attributes.get("agentrl.credit.trained") for s in trace.data.spans)


def _sibling(client: Any, eid: str, run_id: str) -> Any:
    """An RTPO sibling of depth 1, one whose branch turn was trained if there is one."""
    siblings = [t for t in _traces(client, eid, run_id) if t.info.tags.get("agentrl.rtpo.depth") == "1"]
    return next((t for t in siblings if _trained(t, 1)), siblings[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the runs here (default: a temporary folder); an existing store there is reused")
    args = parser.parse_args()
    binary = chromium()
    with tempfile.TemporaryDirectory() as tmp:
        folder = (args.workdir or Path(tmp)).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "mlflow.db").exists():
            train(folder)
        server = start_mlflow_server(f"sqlite:///{folder / 'mlflow.db'}", folder)
        try:
            from mlflow import MlflowClient

            client = MlflowClient(server.url)
            (exp,) = [e for e in client.search_experiments() if e.name == EXPERIMENT]
            runs = {r.info.run_name: r.info.run_id for r in client.search_runs([exp.experiment_id])}
            eid, base = exp.experiment_id, server.url
            turn_trace = next(t for t in _traces(client, eid, runs["turn-ppo"]) if _trained(t, 1))
            sibling = _sibling(client, eid, runs["rtpo"])
            traces = f"{base}/#/experiments/{eid}/traces?selectedEvaluationId="
            browser = Browser(binary, (1600, 1000))
            try:
                browser.open(f"{base}/#/experiments/{eid}/traces", wait=30)  # the first load is the slowest
                browser.click_text("Got it", wait=1)
                shoot_span(browser, traces + turn_trace.info.trace_id, "turn 1", args.out / "review-credit-turn.png")
                shoot_span(browser, traces + sibling.info.trace_id, "episode",
                           args.out / "review-credit-rtpo-sibling.png")
                shoot_span(browser, traces + sibling.info.trace_id, "turn 1",
                           args.out / "review-credit-rtpo-branch.png")
                shoot_trunk_tags(browser, traces + sibling.info.tags["agentrl.rtpo.trunk_trace"],
                                 args.out / "review-credit-rtpo-trunk.png")
            finally:
                browser.close()
        finally:
            server.stop()


def mouse_click(browser: Browser, selector: str, pattern: str, what: str) -> None:
    """Click, as a mouse would (tabs and popovers react to pointer events, not to a scripted ``click()``), the
    last visible element matching ``selector`` whose text matches the regular expression ``pattern``."""
    js = f"""(() => {{ const all = [...document.querySelectorAll({selector!r})]
      .filter(e => e.offsetParent !== null && new RegExp({pattern!r}).test(e.innerText.trim()));
      const t = all[all.length - 1]; if (!t) return null;
      const r = t.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"""
    xy = browser.send("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value")
    if not xy:
        raise SystemExit(f"no {what} on the page")
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        browser.send("Input.dispatchMouseEvent", type=kind, x=xy[0], y=xy[1], button="left", clickCount=1)
    time.sleep(4)


def click_tab(browser: Browser, name: str) -> None:
    mouse_click(browser, "[role=tab]", f"^{name}$", f"{name!r} tab")


def shoot_trunk_tags(browser: Browser, url: str, out: Path) -> None:
    """Open a trunk's trace and its root span's tags (its own id, its tree, its siblings' trace ids)."""
    browser.open(url, wait=12)
    browser.click_text("Got it", wait=1)
    if not browser.click_text("episode", wait=4):
        raise SystemExit(f"no episode span in {url}")
    mouse_click(browser, "span, div, button", "^[0-9]+ tags$", "tags button")
    browser.shoot(out, (0, 0, 1120, 460))


def shoot_span(browser: Browser, url: str, span: str, out: Path) -> None:
    """Open a trace, select the span whose name starts with ``span`` and its Attributes tab, and save the view
    (the trace drawer, without the assistant panel)."""
    browser.open(url, wait=12)
    browser.click_text("Got it", wait=1)
    if not browser.click_text(span, wait=4):
        raise SystemExit(f"no span {span!r} in {url}")
    click_tab(browser, "Attributes")
    browser.shoot(out, (0, 0, 1120, 1000))


if __name__ == "__main__":
    main()
