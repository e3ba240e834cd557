"""`VLLMEngine` over real HTTP against `agentrl serve`: the same tokens and log-probs as the in-process engine, LoRA
weight sync that moves the served log-probs to the trainer's, auth, a dead server, and `agentrl fit` end to end."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

from agentrl.agents.base import Outcome, Task
from agentrl.agents.llm import LLMClient
from agentrl.collect.collector import CollectionError, Collector
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.vllm import (
    EngineRequestError,
    EngineUnavailable,
    FullWeightSyncUnsupported,
    VLLMEngine,
    VLLMEngineSpec,
)
from agentrl.models.policy import LoRASettings, Policy
from tests.support.processes import free_port
from tests.support.server import LORA_ARGS, Server, start_server

ROOT = Path(__file__).resolve().parents[2]
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 259, (n,), generator=g).tolist()


def _engine(server: Server, **kw: object) -> VLLMEngine:
    return VLLMEngine([server.url], api_key=server.api_key, retries=0, **kw)  # type: ignore[arg-type]


def _trainer_logprobs(policy: Policy, prompt: list[int], out: Completion) -> torch.Tensor:
    ids = torch.tensor([prompt + out.token_ids])
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, len(prompt):] = True
    with torch.no_grad():
        return policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs[pos]


def test_http_rollouts_equal_the_in_process_engine(served: Server, tiny_policy: Policy) -> None:
    prompts = [_prompt(6 + 5 * i, i) for i in range(4)]
    greedy = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=())
    cases = [SamplingParams(max_tokens=16, seed=i, stop_token_ids=()) for i in range(4)] + [
        SamplingParams(max_tokens=24, seed=11),  # the model's stop tokens
        SamplingParams(max_tokens=12, seed=3, top_k=7, top_p=0.8, temperature=0.9, stop_token_ids=(40, 77)),
        greedy,
    ]
    remote, local = _engine(served, logprobs_mode="processed_logprobs"), HFEngine(tiny_policy)  # serve: after T

    async def run(engine: VLLMEngine | HFEngine) -> list[Completion]:
        jobs = [engine.generate(prompts[i % 4], sp, session=f"ep{i}") for i, sp in enumerate(cases)]
        return list(await asyncio.gather(*jobs))

    over_http, in_process = asyncio.run(run(remote)), asyncio.run(run(local))
    for a, b in zip(over_http, in_process, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.policy_version == 0 and a.prompt_len == b.prompt_len
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    assert remote.max_context == tiny_policy.max_context and remote.model == "tiny-random"


def test_lora_push_moves_served_logprobs_to_the_trainers(served: Server, tmp_path: Path) -> None:
    policy = Policy("tiny-random", lora=LORA, seed=0).eval()
    engine = _engine(served, adapter_dir=str(tmp_path))
    prompt, sp = _prompt(20, 5), SamplingParams(max_tokens=12, seed=7, stop_token_ids=())

    async def push_and_sample(version: int) -> Completion:
        await engine.update_weights(policy, version=version)
        return await engine.generate(prompt, sp, session="lora")

    before = asyncio.run(engine.generate(prompt, sp, session="lora"))
    for version, seed in ((1, 0), (2, 1)):
        with torch.no_grad():  # "training": move every LoRA weight
            g = torch.Generator().manual_seed(seed)
            for name, p in policy.model.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
        out = asyncio.run(push_and_sample(version))
        assert out.policy_version == version and engine.version == version and engine.model == f"agentrl-v{version}"
        served_lp, trainer_lp = torch.tensor(out.logprobs), _trainer_logprobs(policy, prompt, out)
        assert torch.allclose(served_lp, trainer_lp, atol=1e-4, rtol=0), (served_lp - trainer_lp).abs().max()
        with policy.adapter_disabled():
            base_lp = _trainer_logprobs(policy, prompt, out)
        assert (served_lp - base_lp).abs().max() > 1e-2  # and they are not the base model's any more
    assert not torch.allclose(torch.tensor(before.logprobs), _trainer_logprobs(policy, prompt, before), atol=1e-3)
    # the previous adapter is unloaded and its folder removed; the pushed one is what the trainer holds
    assert engine.push_dir is not None and engine.push_dir.parent == tmp_path  # a folder of this engine's own
    assert sorted(p.name for p in engine.push_dir.iterdir()) == ["agentrl-v2"]
    saved = load_file(str(engine.push_dir / "agentrl-v2" / "adapter_model.safetensors"))
    live = dict(policy.model.named_parameters())
    for key, tensor in saved.items():
        assert torch.equal(tensor, live[key.replace(".weight", ".default.weight")].detach())
    ids = [m["id"] for m in httpx.get(served.url + "/v1/models", headers=served.headers).json()["data"]]
    assert ids == ["tiny-random", "agentrl-v2"]


def test_errors_name_the_server_and_what_to_do(served: Server, tmp_path: Path) -> None:
    wrong = VLLMEngine([served.url], api_key="wrong", retries=0)
    with pytest.raises(EngineRequestError, match=r"answered 401.*api_key"):
        asyncio.run(wrong.generate([1, 2, 3], SamplingParams(max_tokens=2)))
    with pytest.raises(FullWeightSyncUnsupported, match="weight-transfer API"):
        asyncio.run(_engine(served, adapter_dir=str(tmp_path)).update_weights(Policy("tiny-random")))
    too_long = VLLMEngine(["http://127.0.0.1:9"], max_context=8, model="m")  # answered locally, no HTTP
    out = asyncio.run(too_long.generate(list(range(3, 11)), SamplingParams()))
    assert out.finish_reason == "length" and out.token_ids == []
    bads: list[dict[str, Any]] = [{"base_urls": []}, {"base_urls": ["127.0.0.1:8000"]},
                                  {"base_urls": ["http://x"], "retries": -1}, {"base_urls": ["http://x"], "timeout": 0}]
    for bad in bads:
        with pytest.raises(ValueError, match="engine\\."):
            VLLMEngineSpec(**bad)


def test_sessions_are_pinned_to_one_server() -> None:
    urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    a, b = VLLMEngine(urls), VLLMEngine(list(urls))
    picks = {s: a._url_for(s) for s in (f"step0/task{i}/g0" for i in range(30))}
    assert all(b._url_for(s) == u and a._url_for(s) == u for s, u in picks.items())  # stable across engines
    assert set(picks.values()) == set(urls)  # and spread over every server


def test_unreachable_server_raises_engine_unavailable_after_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    engine = VLLMEngine([url], retries=2, backoff=0.1, max_context=64, model="m")
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float) -> None:
        waits.append(delay)
        await real_sleep(0)

    monkeypatch.setattr("agentrl.engines.vllm.asyncio.sleep", recording_sleep)
    with pytest.raises(EngineUnavailable, match=rf"{url} is unavailable after 3 attempt"):
        asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_tokens=2)))
    assert waits == [0.1, 0.2]  # exponential backoff between the three attempts


class _KillingAgent:
    """Two LLM calls per episode; before task ``kill_at`` starts, the server is killed."""

    def __init__(self, server: Server, kill_at: str) -> None:
        self.server, self.kill_at = server, kill_at

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        if task.id == self.kill_at and self.server.proc.poll() is None:
            self.server.proc.kill()
            self.server.proc.wait(timeout=30)
        reply = await llm.chat([{"role": "user", "content": f"task {task.id}"}])
        await llm.chat([{"role": "user", "content": f"task {task.id}"}, reply.message(),
                        {"role": "user", "content": "again"}])
        return Outcome(1.0, info={"success": True})


def test_killed_server_fails_episodes_by_name_and_keeps_finished_ones(tmp_path: Path, tiny_policy: Policy) -> None:
    """What a user wants when a server dies mid-collection: episodes already finished are kept whole; the
    others end as failed with an error that names the server; once too many fail, `CollectionError` names it
    too and still carries every trajectory (nothing completed is lost)."""
    server = start_server(tmp_path)
    try:
        engine = VLLMEngine([server.url], retries=1, backoff=0.05, timeout=30)
        collector = Collector(engine, _KillingAgent(server, kill_at="t2"), tiny_policy.tokenizer,
                              sampling=SamplingParams(max_tokens=4), concurrency=1, max_failed_fraction=0.5)
        tasks = [Task(id=f"t{i}", seed=i) for i in range(4)]
        trajs = asyncio.run(collector.collect_groups(tasks, 1, step=0))
        done, failed = trajs[:2], trajs[2:]
        assert all(not t.failed and t.num_turns == 2 and t.reward == 1.0 for t in done)
        assert all(t.failed and t.error and "EngineUnavailable" in t.error and server.url in t.error for t in failed)

        with pytest.raises(CollectionError, match=server.url) as info:
            asyncio.run(collector.collect_groups(tasks[:2], 1, step=1))
        assert len(info.value.trajectories) == 2 and all(t.failed for t in info.value.trajectories)
    finally:
        server.stop()


@pytest.mark.slow
def test_fit_trains_through_agentrl_serve(tmp_path: Path) -> None:
    server = start_server(tmp_path, *LORA_ARGS)
    try:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run(
            [sys.executable, "-m", "agentrl.cli", "fit", "--config", str(ROOT / "configs/smoke/rtpo_serve.yaml"),
             "--model.engine.init_args.base_urls", f"[{server.url}]"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:] + server.output()
        state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")
        assert state["agentrl"]["rl_step"] == 3
        version = state["agentrl"]["policy_version"]
        assert version >= 3  # RTPO pushes before every boundary
        lora = {k: v for k, v in state["state_dict"].items() if "lora_B" in k}
        assert lora and all(v.abs().sum() > 0 for v in lora.values())  # LoRA B starts at zero: it trained
        models = httpx.get(server.url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["tiny-random", f"agentrl-v{version}"]  # the server serves the last push
        [run] = (tmp_path / "adapters").iterdir()  # the run's own push folder (VLLMEngine.push_dir)
        pushed = load_file(str(run / f"agentrl-v{version}" / "adapter_model.safetensors"))
        for key, tensor in pushed.items():
            trained = state["state_dict"]["policy.model." + key.replace(".weight", ".default.weight")]
            assert torch.equal(tensor, trained)
        assert server.output(tail=None).count("POST /v1/load_lora_adapter HTTP/1.1\" 200") == version + 1
    finally:
        server.stop()
