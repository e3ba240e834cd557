"""``agentrl fit`` whose every weight push after the first writes the first push's adapter under the new name: a
server that answers 200 to each load but keeps serving the first weights (a stale shared folder). Run as
``python tests/vllm/stale_fit.py <agentrl fit arguments>`` by the real-vLLM tier."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import agentrl.engines.vllm as vllm_engine
from agentrl.cli import main

_real_save = vllm_engine._save_adapter
_first: list[Path] = []


def _stale_save(policy: Any, path: Path) -> None:
    if not _first:
        _real_save(policy, path)
        stash = path.parent / "first-push"
        shutil.rmtree(stash, ignore_errors=True)
        shutil.copytree(path, stash)
        _first.append(stash)
        return
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(_first[0], path)


if __name__ == "__main__":
    vllm_engine._save_adapter = _stale_save
    raise SystemExit(main(["fit", *sys.argv[1:]]))
