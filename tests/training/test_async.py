"""Bounded-staleness collection (issue 28): s = 0 is the synchronous loop; s = 1 overlaps generation with the update
(a real `agentrl serve` process over HTTP on 127.0.0.1) and never trains on a turn more than one version old."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.specs import HFEngineSpec
from agentrl.engines.vllm import VLLMEngine, VLLMEngineSpec
from agentrl.models.policy import LoRASettings, Policy
from agentrl.training.rollout.async_collect import check_async, staleness, too_stale
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory, Turn
from tests.support.server import LORA_ARGS, Server, start_server
from tests.training.helpers import fit, letter_data, make_module

LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


class Metrics(pl.Callback):
    """Every step's logged metrics, timings left out (they are the only thing allowed to differ)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        self.steps.append({k: v for k, v in pl_module.last_metrics.items()
                           if k.startswith(("rollout/", "train/", "rtpo/")) or k == "perf/generated_tokens"})


# ---------------------------------------------------------------------------------------------------- s = 0


@pytest.mark.parametrize("schedule", [lambda: GRPO(group_size=2), TurnPPO, RTPO],
                         ids=["grpo", "turnppo", "rtpo"])
def test_max_staleness_zero_is_the_synchronous_loop(schedule: Any) -> None:
    """Per-step rewards, losses and every rollout/train metric of a tiny-model run are identical with
    ``max_staleness`` absent and 0 (and equal, by a run of main's code outside the suite, to the loop before
    this change)."""
    runs = []
    for kw in ({}, {"max_staleness": 0}):
        rec = Metrics()
        fit(make_module(schedule()), letter_data(batch_size=4, steps=3, **kw), [rec])
        runs.append(rec.steps)
    assert len(runs[0]) == 3 and all("rollout/reward" in m for m in runs[0])
    assert runs[0] == runs[1]
    assert all(m["rollout/staleness_max"] == 0 for m in runs[1])


# ---------------------------------------------------------------------------------------------------- the bound


def _episode(*versions: int, forced: tuple[int, ...] = ()) -> Trajectory:
    turns = [Turn(prompt_ids=[1], response_ids=[2], logprobs=[-0.5], index=n, policy_version=v, forced=n in forced)
             for n, v in enumerate(versions)]
    return Trajectory(task_id="t", turns=turns)


def test_a_turn_more_than_s_versions_behind_drops_its_episode() -> None:
    """At trainer version 5 and s = 1: versions 4 and 5 are kept, one turn of version 3 drops the episode; a
    replayed (forced) turn is not a sampled turn and never counts; s = 2 keeps version 3."""
    eps = [_episode(4, 5), _episode(5, 5), _episode(3, 4, 5), _episode(3, 5, forced=(0,))]
    assert too_stale(eps, 5, 1) == [False, False, True, False]
    assert too_stale(eps, 5, 2) == [False, False, False, False]
    assert too_stale(eps, 5, 0) == [True, False, True, False]
    assert staleness(eps[:2], 5, "rollout/staleness") == {"rollout/staleness_mean": 0.25,
                                                          "rollout/staleness_max": 1.0}


def test_bad_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="data.max_staleness must be an integer >= 0"):
        letter_data(max_staleness=-1)
    with pytest.raises(ValueError, match=r"model.engine.init_args.weights: copy"):
        check_async(1, HFEngineSpec(weights="shared"), PPOSettings())
    default = HFEngineSpec()
    check_async(1, default, PPOSettings())  # the default (weights: auto) resolves to the engine's own copy
    assert default.weights == "copy"
    check_async(0, HFEngineSpec(weights="shared"), PPOSettings())  # the synchronous loop shares them safely
    remote = VLLMEngineSpec(["http://127.0.0.1:1"])
    check_async(2, remote, PPOSettings())
    with pytest.raises(ValueError, match="recompute_old_logprobs must not be false"):
        check_async(1, remote, PPOSettings(recompute_old_logprobs=False))
    with pytest.raises(ValueError, match="correction must not be null"):
        check_async(1, remote, PPOSettings(correction=None))


def test_stale_turns_always_recompute_old_logprobs(tiny_policy: Policy) -> None:
    """The embedded fp32 engine is the trainer (no recompute of π_old at version 3 for version-3 turns), but one
    turn of version 2 makes the update recompute π_old (and so correct it with TIS) all the same; forced (replayed)
    turns do not count."""
    from agentrl.training.update.mismatch import needs_old_logprobs

    spec, ppo = HFEngineSpec(), PPOSettings()
    assert not needs_old_logprobs(ppo, spec, tiny_policy, [_episode(3, 3)], 3)
    assert not needs_old_logprobs(ppo, spec, tiny_policy, [_episode(2, 3, forced=(0,))], 3)
    assert needs_old_logprobs(ppo, spec, tiny_policy, [_episode(3, 3), _episode(2, 3)], 3)


def test_progress_line_shows_staleness_when_collection_runs_ahead() -> None:
    from agentrl.training.command.progress import _staleness

    assert _staleness({"rollout/staleness_max": 1.0}) == "  stale 1"
    assert _staleness({"rollout/staleness_max": 0.0}) == ""  # the synchronous line is unchanged
    assert _staleness({"rollout/staleness_max": 0.0, "rollout/trunk_lag_max": 3.0}) == "  stale 0"  # RTPO ahead
    assert _staleness({"rollout/staleness_max": 0.0, "rollout/trunk_lag_max": 0.0}) == ""  # RTPO, s = 0


def test_embedded_engine_with_shared_weights_is_refused_at_setup() -> None:
    with pytest.raises(ValueError, match=r"max_staleness=1 .*weights: copy"):
        fit(make_module(GRPO(group_size=2), engine=HFEngineSpec(weights="shared")),
            letter_data(batch_size=4, steps=1, max_staleness=1))


# ---------------------------------------------------------------------------------------------------- s = 1


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("async-serve")
    server = start_server(root, *LORA_ARGS, lora_root=root)
    yield server, root
    server.stop()


class SlowedUpdateModule(AgentRLModule):
    """Test-only: an update slowed on purpose by ``delay`` seconds, recording what it trained and when.

    ``trained``: per update, the trainer's version and the (version, started_ns, ended_ns) of every trained turn;
    ``windows``: per update, its (start_ns, end_ns) wall-clock span, sleep included.
    """

    delay = 1.0

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.trained: list[tuple[int, str, list[tuple[int, int, int]]]] = []
        self.windows: list[tuple[int, int]] = []

    def update(self, trajectories: Any, targets: dict[TurnKey, TurnTargets], ppo: PPOSettings, *,
               tag: str = "") -> dict[str, float]:
        start = time.time_ns()
        turns = [trajectories[b].turns[n] for b, n in targets]
        self.trained.append((self.policy_version, tag,
                             [(t.policy_version, t.started_ns or 0, t.ended_ns or 0) for t in turns if t.response_ids]))
        time.sleep(self.delay)
        out = super().update(trajectories, targets, ppo, tag=tag)
        self.windows.append((start, time.time_ns()))
        return out


def _remote_fit(server: Server, root: Path, tmp: str, schedule: Schedule, steps: int,
                max_staleness: int) -> tuple[SlowedUpdateModule, Metrics]:
    pl.seed_everything(0, verbose=False)
    engine = VLLMEngineSpec([server.url], adapter_dir=str(root / tmp), logprobs_mode="processed_logprobs",
                            timeout=60)
    module = SlowedUpdateModule(Policy("tiny-random", lora=LORA, seed=0), schedule, engine=engine, peak_flops=1e11)
    rec = Metrics()
    fit(module, letter_data(batch_size=4, steps=steps, max_staleness=max_staleness), [rec])
    return module, rec


def _overlapping(module: SlowedUpdateModule) -> int:
    """Trained turns whose engine call ran during an update (sleep included)."""
    return sum(any(s < end and e > start for start, end in module.windows)
               for _, _, turns in module.trained for _, s, e in turns)


@pytest.mark.slow
def test_s1_trains_no_turn_older_than_one_version_and_generates_during_updates(
        lora_server: tuple[Server, Path]) -> None:
    """GRPO through a real `agentrl serve` process, the update slowed by 1 s: with s = 1 every trained turn is at
    most one version behind the trainer (from the turns' recorded versions), some are exactly one behind (the
    overlap is real), and trained turns were generated while an update ran (engine-call timestamps inside the
    updates' spans). With s = 0 no trained turn is behind and none was generated during an update."""
    server, root = lora_server
    module, rec = _remote_fit(server, root, "grpo-s1", GRPO(group_size=2), steps=4, max_staleness=1)
    lags = [version - v for version, _, turns in module.trained for v, _, _ in turns]
    assert len(module.trained) == 4 and lags
    assert max(lags) <= 1, lags
    assert lags.count(1) > 0
    assert _overlapping(module) > 0
    assert [m["rollout/staleness_max"] for m in rec.steps][1:] == [1.0, 1.0, 1.0]
    assert all(m["rollout/stale_dropped_episodes"] == 0 for m in rec.steps)
    assert all(m["rollout/recomputed_tokens"] > 0 for m in rec.steps)  # stale turns: π_old recomputed, TIS applied
    sync, _ = _remote_fit(server, root, "grpo-s0", GRPO(group_size=2), steps=3, max_staleness=0)
    assert {version - v for version, _, turns in sync.trained for v, _, _ in turns} == {0}
    assert _overlapping(sync) == 0


class SlowDecodeCopySpec(HFEngineSpec):
    """Test-only: the embedded engine on its fp32 weight copy, every decode step slowed by 0.1 s so that episodes
    are still decoding when the trainer pushes; ``in_flight`` records, per push, the requests in flight, and
    ``releases`` the requests in flight whenever the trainer asked the engine to free its copy."""

    def __init__(self) -> None:
        super().__init__(weights="copy", decode_dtype="float32")
        self.in_flight: list[int] = []
        self.releases: list[int] = []

    def build(self, policy: Any) -> Any:
        engine = super().build(policy)
        assert isinstance(engine, HFEngine)  # the embedded engine: its methods are wrapped below
        decode, push, release = engine._decode_step, engine.update_weights, engine.release_weights

        async def counted_release() -> int:
            self.releases.append(len(engine._active) + len(engine._admitting) + len(engine._waiting))
            return await release()

        engine.release_weights = counted_release  # type: ignore[method-assign]  # wrapped on purpose

        def slow_decode() -> None:
            time.sleep(0.1)
            decode()

        async def counted_push(*args: Any, **kw: Any) -> None:
            self.in_flight.append(len(engine._active) + len(engine._admitting))
            await push(*args, **kw)

        engine._decode_step, engine.update_weights = slow_decode, counted_push  # type: ignore[method-assign]
        return engine


@pytest.mark.slow
def test_s1_with_the_embedded_weight_copy_pushes_mid_episode_and_keeps_the_bound() -> None:
    """The default engine (the embedded one, on its own weight copy) at s = 1: pushes land while the next step's
    episodes are decoding (the copy is refreshed between two model steps), the turns keep the oldest version that
    sampled them, and no trained turn is more than one version behind; some were generated during an update."""
    pl.seed_everything(0, verbose=False)
    engine = SlowDecodeCopySpec()
    module = SlowedUpdateModule(Policy("tiny-random", seed=0), GRPO(group_size=2), engine=engine, peak_flops=1e11)
    rec = Metrics()
    fit(module, letter_data(batch_size=4, steps=4, max_staleness=1), [rec])
    assert any(n > 0 for n in engine.in_flight), engine.in_flight  # a push came while episodes were decoding
    # the copy is freed for an update only when no collection runs ahead (between two turns of an episode the
    # engine may hold no request, yet the episode's next turn is coming)
    assert engine.releases and engine.releases.count(0) == len(engine.releases), engine.releases
    lags = [version - v for version, _, turns in module.trained for v, _, _ in turns]
    assert len(module.trained) == 4 and lags
    assert max(lags) <= 1 and lags.count(1) > 0, lags
    assert _overlapping(module) > 0
    assert all(m["rollout/stale_dropped_episodes"] == 0 for m in rec.steps)


@pytest.mark.slow
def test_rtpo_s1_runs_trunks_ahead_and_keeps_siblings_on_policy(lora_server: tuple[Server, Path]) -> None:
    """RTPO with s = 1: the next step's trunks are collected while the depths update (trunks lag the trainer by
    at least one version), while every trained sibling turn carries exactly the version of the weights its
    depth's update starts from (sampled after the previous depth's push)."""
    server, root = lora_server
    module, rec = _remote_fit(server, root, "rtpo-s1", RTPO(group_size=3), steps=3, max_staleness=1)
    assert module.trained and all(turns for _, _, turns in module.trained)
    assert all(v == version for version, _, turns in module.trained for v, _, _ in turns)
    assert all(m["rollout/staleness_max"] == 0 for m in rec.steps)
    assert max(m.get("rollout/trunk_lag_max", 0.0) for m in rec.steps[1:]) >= 1


# ---------------------------------------------------------------------------------------------------- weight push


class SlowAnsweredPushEngine(VLLMEngine):
    """Test-only: the answer to the load of adapter ``agentrl-v2`` reaches the client 0.5 s after the server loaded
    it (a slow network), so requests sent meanwhile name the replaced adapter ``agentrl-v1``."""

    async def _load(self, url: str, name: str, path: Path, *, replace: bool = True) -> None:
        await super()._load(url, name, path, replace=replace)
        if name == "agentrl-v2":
            await asyncio.sleep(0.5)


@pytest.mark.slow
def test_push_while_requests_are_in_flight_is_safe(lora_server: tuple[Server, Path]) -> None:
    """Generations sent every 20 ms while adapter v2 is pushed over v1 (`agentrl serve` over HTTP): every one
    completes; requests the load overtook (sent naming v1 while the push was under way, answered 404) are sent
    again naming v2 and stamped 2 — some are; the replaced adapter is never loaded back (one load of v1 in the
    server's log); requests after the push are served v2."""
    server, root = lora_server
    policy = Policy("tiny-random", lora=LORA, seed=0)
    engine = SlowAnsweredPushEngine([server.url], adapter_dir=str(root / "push"), logprobs_mode="processed_logprobs",
                                    timeout=60, retries=0)
    sampling = SamplingParams(max_tokens=16, stop_token_ids=(0,))
    loads_before = server.output(tail=None).count('"POST /v1/load_lora_adapter')

    async def scenario() -> tuple[list[tuple[int, Any]], Any]:
        await engine.update_weights(policy, version=1)
        push = asyncio.ensure_future(engine.update_weights(policy, version=2))
        sent: list[tuple[int, asyncio.Future[Any]]] = []
        while not push.done():
            sent.append((engine.version, asyncio.ensure_future(
                engine.generate([5 + len(sent), 6, 7], sampling.with_seed(len(sent)), session=str(len(sent))))))
            await asyncio.sleep(0.02)
        await push
        done = [(named, await f) for named, f in sent]
        after = await engine.generate([5, 6, 7], sampling.with_seed(0), session="after")
        await engine.shutdown()
        return done, after

    done, after = asyncio.run(scenario())
    assert done and all(c.token_ids for _, c in done)
    assert {c.policy_version for _, c in done} <= {1, 2} and after.policy_version == 2
    assert any(named == 1 and c.policy_version == 2 for named, c in done)  # overtaken, sent again naming v2
    log = server.output(tail=None)
    assert log.count('"POST /v1/load_lora_adapter') - loads_before == 2  # v1, v2: v1 never loaded back


def test_preflight_refuses_s1_with_the_embedded_engine_before_any_work(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``agentrl fit`` with ``data.max_staleness: 1`` and the embedded engine on the trainer's own weights
    (``weights: shared``, set) stops in preflight, naming the key to set, before an MLflow store is created."""
    import agentrl
    from agentrl.training.command.preflight import ConfigError
    from tests.training.test_cli_ux import SMOKE

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("agentrl.training.command.cli.quiet_libraries", lambda: None)
    with pytest.raises(ConfigError, match=r"model.engine.init_args.weights: copy"):
        agentrl.fit(SMOKE, data={"max_staleness": 1},
                    model={"engine": {"class_path": "agentrl.engines.specs.HFEngineSpec",
                                      "init_args": {"weights": "shared"}}})
    assert not (tmp_path / "mlflow.db").exists()
