"""One ``agentrl fit``'s start of tracking, for the concurrent-start test: import, say ``ready``, wait for the
``GO`` file, then open the MLflow store and a run as `agentrl.tracking.MLflowLogger` does. Prints ``ok <store uri>``.

Usage: ``python store_start.py SQLITE_URI GO_FILE``."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

logging.basicConfig(level=logging.WARNING)


def main(uri: str, go: Path) -> None:
    from agentrl.tracking import MLflowLogger

    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    logger = MLflowLogger(experiment_name="race", tracking_uri=uri)
    logger.log_metrics({"x": 1.0}, step=0)
    print("ok", logger.tracking_uri, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
