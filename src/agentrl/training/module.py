"""`AgentRLModule`: the policy, the turn critic and an algorithm schedule, trained with live rollouts.

One training step is one RL iteration: the schedule collects rollouts with the current weights (through the
data module's collector), computes advantages, runs PPO epochs over minibatches (manual optimization), and
pushes the new weights to the rollout engine. Rollouts are collected *inside* the step, so Lightning's
prefetching of the next batch (a list of tasks) can never run an episode with stale weights; every turn is
stamped with the policy version, and the step checks the stamps.

The schedule (`agentrl.training.schedules`) decides *what* to collect and *which* turns to train with which
advantages; this module owns *how*: packing turns into rows, micro-batching, the losses, optimizers, gradient
clipping, the non-finite-update guard, metrics, and the engine.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import lightning.pytorch as pl
import torch
from torch import Tensor

from agentrl.agents.base import Task
from agentrl.collect.collector import CollectStats
from agentrl.collect.runtime import RolloutRuntime
from agentrl.engines.specs import EngineSpec, HFEngineSpec
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.seeding import derive_seed
from agentrl.training import distributed, evaluation, memory, mismatch, sharding
from agentrl.training.batching import (
    Row,
    TurnKey,
    TurnTargets,
    collate,
    context_targets,
    micro_batches,
    pack_rows,
    score_turns,
    token_counts,
)
from agentrl.training.callbacks import DetachOnException
from agentrl.training.metrics import reduce_across_ranks
from agentrl.training.objective import (
    aggregation_divisor,
    clip_gradients,
    has_signal,
    minibatch_units,
    ppo_objective,
    value_units,
)
from agentrl.training.perf import measure_peak_flops, step_perf_metrics, train_flops
from agentrl.training.settings import CriticSettings, OptimSettings, PPOSettings
from agentrl.training.sharding import ShardedTraining
from agentrl.types import Trajectory, TurnBatch

if TYPE_CHECKING:
    from agentrl.collect.collector import Collector
    from agentrl.engines.base import RolloutEngine
    from agentrl.training.schedules import Schedule

log = logging.getLogger(__name__)
T = TypeVar("T")


class NonFiniteUpdateError(RuntimeError):
    """Too many consecutive updates had a non-finite loss or gradient."""


class AgentRLModule(ShardedTraining, pl.LightningModule):
    """Policy + turn critic + schedule.

    Args:
        policy: The policy (model, LoRA, dtype).
        algorithm: The schedule: `GRPO`, `TurnPPO`, `TokenPPO` or `RTPO` (``class_path`` in the config).
        engine: How rollouts are generated: the embedded engine (default) or a vLLM server.
        optim: Optimizer settings of the policy and the critic.
        critic: Critic settings (used by schedules that need a critic).
        micro_batch_tokens: Padded-token budget of one forward/backward (memory knob; results do not depend on it).
        pack_turns: Pack the turns of a trajectory that share an exact prefix into one row.
        peak_flops: Peak FLOP/s of one device for ``perf/mfu``; None measures a matmul at start.
        seed: Seed of minibatch shuffling (rollout seeds come from the data module).
    """

    def __init__(
        self,
        policy: Policy,
        algorithm: Schedule,
        *,
        engine: EngineSpec | None = None,
        optim: OptimSettings | None = None,
        critic: CriticSettings | None = None,
        micro_batch_tokens: int = 256,
        pack_turns: bool = True,
        peak_flops: float | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.check_args(policy.uses_lora, algorithm, micro_batch_tokens)
        self.automatic_optimization = False
        self.policy = policy
        self.algorithm = algorithm
        self.engine_spec = engine or HFEngineSpec()
        self.optim = optim or OptimSettings()
        self.critic_settings = critic or CriticSettings()
        self.critic: TurnCritic | None = None
        if algorithm.needs_critic:
            self.critic = TurnCritic(policy, shared_backbone=self.critic_settings.shared_backbone)
        self.micro_batch_tokens = micro_batch_tokens
        self.pack_turns = pack_turns
        self.peak_flops = peak_flops
        self.seed = seed
        self.rl_step = 0
        self.generated_tokens = 0  # sampled for training, all ranks, over the run (the learning budget's axis)
        self.policy_version = 0
        self.temperature = 1.0
        self._bad_updates = 0
        self._runtime: RolloutRuntime | None = None
        self._engine: RolloutEngine | None = None
        self._collector: Collector | None = None
        self._step_stats: dict[str, float] = defaultdict(float)
        self.last_trajectories: list[Trajectory] = []
        self.last_metrics: dict[str, float] = {}
        self._full_policy: list[Policy] = []
        self.last_eval: dict[str, float] = {}
        self.base_eval: dict[str, float] = {}  # the held-out evaluation of the starting weights (not on resume)

    @staticmethod
    def check_args(uses_lora: bool, algorithm: Schedule, micro_batch_tokens: int) -> None:
        """The checks across arguments (also run by `agentrl.training.preflight` before the model loads)."""
        if micro_batch_tokens < 1:
            raise ValueError(f"model.micro_batch_tokens must be >= 1, got {micro_batch_tokens}")
        if algorithm.needs_reference and not uses_lora:
            raise ValueError("algorithm.ppo.kl_coef > 0 needs a LoRA policy (policy.lora): the base is the reference")

    # ------------------------------------------------------------------ lifecycle

    def train(self, mode: bool = True) -> AgentRLModule:
        """Lightning switches the module to training mode; the policy and critic still score in eval mode (no
        dropout), as the engine sampled, so PPO's first ratio is exactly 1 even for a hub model with dropout."""
        super().train(mode)
        self.policy.eval()
        if self.critic is not None:
            self.critic.eval()
        return self

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        o = self.optim
        opts: list[torch.optim.Optimizer] = [torch.optim.AdamW(
            self.policy.trainable_parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)]
        if self.critic is not None:
            opts.append(torch.optim.AdamW(self.critic.trainable_parameters(), lr=o.critic_lr,
                                          betas=(o.beta1, o.beta2), weight_decay=o.weight_decay))
        return opts

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule  # type: ignore[attr-defined]
        if dm is None or not hasattr(dm, "make_collector"):
            raise ValueError("AgentRLModule needs a RolloutDataModule (config key 'data')")
        dm.configure(self.algorithm.episodes_per_task)  # a bad batch size stops here, before any work

    def on_fit_start(self) -> None:
        # after checkpoint restore and device placement: the engine starts at the restored policy version
        self.attach(self.trainer.datamodule.make_collector)  # type: ignore[attr-defined]
        if self.peak_flops is None:
            self.peak_flops = measure_peak_flops(self.device, self.policy.compute_dtype)
        for logger in self.trainer.loggers:  # what `compute_dtype: auto` chose on this machine, for review
            logger.log_hyperparams({"resolved/compute_dtype": str(self.policy.compute_dtype)[6:]})

    def on_train_start(self) -> None:
        # here, not in on_fit_start: a sharded checkpoint is restored after that hook, when rl_step was still 0
        if self.rl_step == 0:
            self.base_eval = self.evaluate("base")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        evaluation.after_step(self, self.generated_tokens - int(self.last_metrics.get("perf/generated_tokens", 0)))

    def on_train_end(self) -> None:
        evaluation.at_end(self)

    def attach(self, make_collector: Any) -> None:
        """Start the rollout loop and the engine, connect the collector, and push the current weights."""
        self.detach()
        self._runtime = RolloutRuntime()
        serving = self._serve_policy()
        self._engine = self.engine_spec.build(serving)
        self._collector = make_collector(self._engine, self.policy.tokenizer)
        self.run_async(mismatch.engine_preflight(self._engine, self._collector.sampling))  # e.g. vLLM log-prob mode
        self.temperature = self._collector.sampling.temperature or 1.0
        self.run_async(self._engine.update_weights(serving, version=self.policy_version))

    def evaluate(self, label: str) -> dict[str, float]:
        """Play the held-out tasks with the current weights; logs ``eval/*`` (see `agentrl.training.evaluation`)."""
        return evaluation.evaluate(self, label)

    def on_fit_end(self) -> None:
        self.detach()

    def configure_callbacks(self) -> list[pl.Callback]:
        # Lightning tells callbacks, not the module, about exceptions: stop the engine and loop through one
        return [DetachOnException()]

    def detach(self) -> None:
        if self._runtime is not None:
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                self._runtime.run(shutdown())
            self._runtime.close()
        self._runtime = self._engine = self._collector = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["agentrl"] = {"rl_step": self.rl_step, "policy_version": self.policy_version,
                                 "generated_tokens": self.generated_tokens}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("agentrl", {})
        self.rl_step = int(state.get("rl_step", 0))
        self.policy_version = int(state.get("policy_version", 0))
        self.generated_tokens = int(state.get("generated_tokens", 0))
        if self._engine is not None:  # restored after the engine started (sharded checkpoints): serve these weights
            self.run_async(self._engine.update_weights(self._serve_policy(), version=self.policy_version))

    # ------------------------------------------------------------------ rollouts (used by schedules)

    @property
    def collector(self) -> Collector:
        if self._collector is None:
            raise RuntimeError("the module is not attached to a collector (fit not started)")
        return self._collector

    @property
    def engine(self) -> RolloutEngine:
        if self._engine is None:
            raise RuntimeError("the module has no engine yet (fit not started)")
        return self._engine

    def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runtime is None:
            raise RuntimeError("rollout runtime not started")
        return self._runtime.run(coro)

    def collect(self, coro: Coroutine[Any, Any, list[Trajectory]]) -> list[Trajectory]:
        """Run one collection with the current weights, check the version stamps, and account for its cost."""
        if self.engine.version != self.policy_version:
            raise RuntimeError(f"engine serves version {self.engine.version} but the policy is at "
                               f"{self.policy_version}: push the weights before collecting")
        trajs = self.run_async(coro)
        self.last_trajectories = trajs
        stale = {t.policy_version for tr in trajs for t in tr.turns if not t.forced} - {self.policy_version}
        if stale:
            raise RuntimeError(f"rollouts used stale weights (versions {sorted(stale)}, current "
                               f"{self.policy_version})")
        stats: CollectStats = self.collector.reset_stats()
        s = self._step_stats
        s["episodes"] += stats.episodes
        s["failed"] += stats.failed
        s["generated_tokens"] += stats.generated_tokens
        s["sampled_turns"] += stats.sampled_turns
        s["rollout_seconds"] += stats.seconds
        return trajs

    def push_weights(self) -> None:
        """Serve the updated weights: every later rollout uses them."""
        self.policy_version += 1
        self.run_async(self.engine.update_weights(self._serve_policy(), version=self.policy_version))

    # ------------------------------------------------------------------ scoring (used by schedules)

    @torch.no_grad()
    def values(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        """Critic values at each response token of the named turns; the first entry is V(s_n)."""
        critic = self.critic
        if critic is None:
            raise RuntimeError("this schedule has no critic")
        scored = self._score(trajectories, keys, lambda b: critic(b.input_ids, b.attention_mask))
        return {key: v.tolist() for key, v in scored.items()}

    @torch.no_grad()
    def logprobs(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        """The current policy's log-probs of the named turns' response tokens."""
        scored = self._score(trajectories, keys,
                             lambda b: self.policy.logprobs(b, temperature=self.temperature).logprobs)
        return {key: v.tolist() for key, v in scored.items()}

    def _score(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey],
               fn: Callable[[TurnBatch], Tensor]) -> dict[TurnKey, Tensor]:
        rows = pack_rows(trajectories, context_targets(keys), pack=self.pack_turns)
        if not self._sharded:
            return score_turns(rows, self.micro_batch_tokens, self._pad_id, self.device, fn)
        # forwards are collectives: as many as the rank with the most micro-batches. The ranks agree on that count
        # (itself a collective) before any forward, so that no rank's count meets another's forward.
        padding = self._micro_batches(rows)[len(micro_batches(rows, self.micro_batch_tokens)):]
        out = score_turns(rows, self.micro_batch_tokens, self._pad_id, self.device, fn)
        for micro in padding:
            fn(collate(micro, self._pad_id).to(self.device))
        return out

    def sync_max(self, value: int) -> int:
        return distributed.sync_max(value, self.device)

    def all_sum(self, values: Tensor) -> Tensor:
        return distributed.sum_tensor(values, self.device)

    @property
    def _pad_id(self) -> int:
        pad = self.policy.tokenizer.pad_token_id
        return int(pad if pad is not None else self.policy.tokenizer.eos_token_id)

    # ------------------------------------------------------------------ the update

    def update(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets],
               ppo: PPOSettings, *, tag: str = "") -> dict[str, float]:
        """PPO epochs × minibatches over the selected turns. Returns the ``train/*`` metrics (averaged over the
        optimizer steps; ``train/skipped_updates`` counted).

        On several ranks this is the update one process would make over every rank's turns: each minibatch's
        unit counts are summed over the ranks, every micro-batch's loss is scaled by its share of the *global*
        units, and gradients are summed (not averaged) across ranks before the optimizer step. Every rank runs
        the same number of optimizer steps, with or without rows of its own.
        """
        memory.before_update(self)
        rows = pack_rows(trajectories, targets, pack=self.pack_turns)
        rows = [r for r in rows if any(t.response_ids for _, t, _ in r.turns)]
        most_rows = distributed.sync_max(len(rows), self.device)
        if most_rows == 0:
            return {"train/skipped_updates": 1.0}
        rows, behaviour_stats = mismatch.prepare_update(self, trajectories, rows, ppo)  # π_old, TIS/MIS, metrics
        packed, unpacked = token_counts(rows)
        self._step_stats["packed_tokens"] += packed
        self._step_stats["unpacked_tokens"] += unpacked
        gen = torch.Generator().manual_seed(derive_seed(self.seed, self.rl_step, "minibatches", tag))
        size = ppo.minibatch_size or max(len(rows), 1)
        n_minibatches = 1 if ppo.minibatch_size is None else -(-most_rows // size)
        totals: dict[str, float] = defaultdict(float)
        start = time.perf_counter()
        for _ in range(ppo.epochs):
            order = torch.randperm(len(rows), generator=gen).tolist()
            for m in range(n_minibatches):
                stats = self._minibatch_step([rows[i] for i in order[m * size : (m + 1) * size]], ppo)
                for k, v in stats.items():
                    totals[k] += v
        self._step_stats["train_seconds"] += time.perf_counter() - start
        memory.after_update(self)
        steps = ppo.epochs * n_minibatches
        out = {k: v / steps for k, v in totals.items()}
        out["train/skipped_updates"] = totals.get("train/skipped_updates", 0.0)
        return out | behaviour_stats

    def _minibatch_step(self, rows: list[Row], ppo: PPOSettings) -> dict[str, float]:
        local = torch.tensor([minibatch_units(rows, ppo), value_units(rows), float(has_signal(rows, ppo))],
                             dtype=torch.float64)
        units, v_units, signal = distributed.sum_tensor(local, self.device).tolist()
        if signal == 0:  # no rank has a gradient signal: an AdamW step would still move the weights
            return {"train/skipped_updates": 1.0}
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        stats: dict[str, float] = defaultdict(float)
        for micro in self._micro_batches(rows):
            batch = collate(micro, self._pad_id).to(self.device)
            share = aggregation_divisor(micro, ppo) / max(units, 1e-12)
            loss, micro_stats = ppo_objective(self.policy, self.critic, batch, ppo, temperature=self.temperature,
                                              vf_coef=self.critic_settings.vf_coef, share=share,
                                              value_units=v_units, lockstep=self._sharded)
            self.manual_backward(loss)
            for k, v in micro_stats.items():
                stats[k] += v * share
            self._step_stats["train_tokens"] += float(batch.attention_mask.sum())
            self._step_stats["scored_tokens"] += float(batch.response_mask.sum())
        return self._step_optimizers(opts, stats)

    def _step_optimizers(self, opts: list[Any], stats: dict[str, float]) -> dict[str, float]:
        """Clip gradients, guard against non-finite updates, step the optimizers."""
        o = self.optim
        params = self.policy.trainable_parameters()
        critic_params = self.critic.trainable_parameters() if self.critic is not None else []
        if self._sharded:
            sharding.sum_gradients(params + critic_params)  # FSDP shards: reduce-scattered (averaged) already
        else:
            distributed.sum_gradients(params + critic_params)  # one all-reduce for both
        norm = clip_gradients(params, o.max_grad_norm)
        stats["train/grad_norm"] = norm
        finite = math.isfinite(norm) and all(math.isfinite(v) for v in stats.values())
        if self.critic is not None:
            c_norm = clip_gradients(critic_params, o.critic_max_grad_norm)
            stats["train/critic_grad_norm"] = c_norm
            finite = finite and math.isfinite(c_norm)
        finite = distributed.sync_all(finite, self.device)  # every rank skips, or none does
        if not finite:
            self._bad_updates += 1
            stats["train/skipped_updates"] = 1.0
            log.warning("non-finite loss or gradient: update skipped (%d in a row)", self._bad_updates)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            if self._bad_updates >= o.max_bad_updates:
                raise NonFiniteUpdateError(
                    f"{self._bad_updates} non-finite updates in a row (optim.max_bad_updates="
                    f"{o.max_bad_updates}); lower optim.lr or check the rewards")
            return {k: (0.0 if not math.isfinite(v) else v) for k, v in stats.items()}
        self._bad_updates = 0
        for opt in opts:
            opt.step()
        return dict(stats)

    # ------------------------------------------------------------------ the training step

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # a list of tasks: nothing to move; rollouts are made on the right device later

    def training_step(self, tasks: list[Task], batch_idx: int) -> None:
        start = time.perf_counter()
        self._step_stats = defaultdict(float)
        # under DDP, backward passes only accumulate locally; `_step_optimizers` averages the gradients itself
        # (ranks run different numbers of backward passes: see agentrl.training.distributed)
        block_sync = getattr(self.trainer.strategy, "block_backward_sync", contextlib.nullcontext)
        with block_sync():
            metrics = self.algorithm.step(self, list(tasks))
        if not self._sharded:  # sharded ranks hold different shards by design
            distributed.check_in_sync(self.policy.trainable_parameters(), self.device)
        self.rl_step += 1
        metrics.update(step_perf_metrics(self._step_stats, time.perf_counter() - start, self.policy_version,
                                         mfu=self._mfu))
        metrics = reduce_across_ranks(metrics)  # every rank's episodes and turns, not rank 0's
        self.generated_tokens += int(metrics.get("perf/generated_tokens", 0))
        metrics["perf/generated_tokens_total"] = float(self.generated_tokens)
        self.last_metrics = metrics
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=len(tasks))
        reward = metrics.get("rollout/reward", float("nan"))
        self.log("reward", reward, prog_bar=True, on_step=True, batch_size=len(tasks), logger=False)
        self.log("step_s", metrics["perf/step_seconds"], prog_bar=True, on_step=True, batch_size=len(tasks),
                 logger=False)
        log.info("step %d: reward %.3f, success %.3f, %.1f s", self.rl_step, reward,
                 metrics.get("rollout/success", float("nan")), metrics["perf/step_seconds"])


    def _mfu(self, train_seconds: float) -> float | None:
        """MFU of the step's update: FLOPs / seconds / peak (None without a peak)."""
        s = self._step_stats
        if not self.peak_flops:
            return None
        flops = train_flops(self.policy, self.critic, s["train_tokens"], s["scored_tokens"])
        return flops / train_seconds / self.peak_flops
