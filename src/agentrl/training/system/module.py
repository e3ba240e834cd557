"""`AgentRLModule`: the policy, the turn critic and an algorithm schedule, trained with live rollouts.

One training step is one RL iteration: the schedule collects rollouts with the current weights, computes
advantages, runs PPO updates and pushes the new weights, talking to this module through the `Learner` protocol.
Rollouts are collected inside the step, so no episode runs on stale weights unless ``data.max_staleness`` allows
it. The module adapts Lightning to the parts it owns: the rollout session, the `PPOUpdate` and `TurnScorer`, the
`Evaluator`, the `StepMeter` and the `RunCounters`; it answers the `RunView` that callbacks read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from agentrl.agents.base import Task
from agentrl.credit import StepRecord
from agentrl.engines.specs import EngineSpec, HFEngineSpec
from agentrl.models.critic import TurnCritic
from agentrl.models.memory import PeakRise
from agentrl.models.policy import Policy
from agentrl.runview import StepProgress
from agentrl.training.rollout.async_collect import Lookahead, MakeBatch, check_async, no_lookahead
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.rollout.session import RolloutSession
from agentrl.training.system.callbacks import DetachOnException
from agentrl.training.system.counters import Counted, RunCounters, report_cancelled, warn_recollecting
from agentrl.training.system.evaluation import EvalPlan, Evaluator, continue_finished_run
from agentrl.training.system.health import health_metrics, step_health
from agentrl.training.system.metrics import StepMeter, publish_step
from agentrl.training.system.view import ModuleRunView
from agentrl.training.update import distributed, memory, sharding
from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.training.update.mismatch import needs_old_logprobs
from agentrl.training.update.ppo import NonFiniteUpdateError, PPOUpdate
from agentrl.training.update.rowplan import RowPlan
from agentrl.training.update.scoring import TurnScorer
from agentrl.training.update.settings import CriticSettings, OptimSettings, PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.collect.collector import Collector
    from agentrl.training.schedules.base import Schedule

__all__ = ["AgentRLModule", "NonFiniteUpdateError"]


class AgentRLModule(pl.LightningModule, ModuleRunView):
    """Policy + turn critic + schedule.

    Args:
        policy: The policy (model, LoRA, dtype).
        algorithm: The schedule: `GRPO`, `TurnPPO`, `TokenPPO` or `RTPO` (``class_path`` in the config).
        engine: How rollouts are generated: the embedded engine (default) or a vLLM server.
        optim: Optimizer settings of the policy and the critic.
        critic: Critic settings (used by schedules that need a critic).
        micro_batch_tokens: Padded-token budget of one forward/backward (memory knob; results do not depend on it).
        pack_turns: Pack the turns of a trajectory that share an exact prefix into one row.
        share_prefixes: Turns of different episodes with the same context share it in one row of a micro-batch
            (RTPO's siblings, a GRPO group's first prompt): fewer tokens forwarded, the same update up to rounding.
        peak_flops: Peak FLOP/s of one device for ``perf/mfu``; None measures a matmul at start.
        seed: Seed of minibatch shuffling (rollout seeds come from the data module).
    """

    rl_step, policy_version, generated_tokens = Counted(), Counted(), Counted()  # kept in ``counters``

    def __init__(self, policy: Policy, algorithm: Schedule, *, engine: EngineSpec | None = None,
                 optim: OptimSettings | None = None, critic: CriticSettings | None = None,
                 micro_batch_tokens: int = 256, pack_turns: bool = True, share_prefixes: bool = False,
                 peak_flops: float | None = None, seed: int = 0) -> None:
        super().__init__()
        self.check_args(policy.uses_lora, algorithm, micro_batch_tokens)
        self.automatic_optimization = False
        self.policy, self.algorithm, self.engine_spec = policy, algorithm, engine or HFEngineSpec()
        self.optim, self.critic_settings = optim or OptimSettings(), critic or CriticSettings()
        self.critic: TurnCritic | None = (TurnCritic(policy, shared_backbone=self.critic_settings.shared_backbone)
                                          if algorithm.needs_critic else None)
        self.micro_batch_tokens = micro_batch_tokens
        self.pack_turns, self.share_prefixes = pack_turns, share_prefixes
        self.counters = RunCounters()
        self.step_progress = StepProgress()  # what the step is doing now (the progress display reads it)
        self.peak_rise = PeakRise()  # which phase raised the process's peak RSS (``perf/*_peak_rise_mib``)
        self.step_progress.on_boundary(self.peak_rise.boundary)
        self.session = RolloutSession(self.engine_spec, self.step_progress)
        self.lookahead: Lookahead | None = None  # the batches launched ahead (data.max_staleness >= 1), per fit
        self.ppo_update = PPOUpdate(policy, self.critic, self.optim, self.critic_settings, seed, self.step_progress)
        self.meter = StepMeter(self.session, self.ppo_update, self.peak_rise, peak_flops)
        self.evaluator = Evaluator(self.session, self.peak_rise)
        self.scorer = TurnScorer(policy, self.critic, self.step_progress)
        self.last_trajectories: list[Trajectory] = []
        self.step_record = StepRecord()  # the last step's episodes and per-turn credit (for the traces)
        self.last_metrics: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.base_eval: dict[str, float] = {}  # the held-out evaluation of the starting weights (not on resume)
        self._full_policy: list[Policy] = []  # sharded training: the engine's unsharded copy (a list: no submodule)

    @staticmethod
    def check_args(uses_lora: bool, algorithm: Schedule, micro_batch_tokens: int) -> None:
        """The checks across arguments (also run by `agentrl.training.command.preflight` before the model loads)."""
        if micro_batch_tokens < 1:
            raise ValueError(f"model.micro_batch_tokens must be >= 1, got {micro_batch_tokens}")
        if algorithm.needs_reference and not uses_lora:
            raise ValueError("algorithm.ppo.kl_coef > 0 needs a LoRA policy (policy.lora): the base is the reference")

    def train(self, mode: bool = True) -> AgentRLModule:
        """Lightning switches the module to training mode; the policy and critic still score in eval mode (no
        dropout), as the engine sampled, so PPO's first ratio is exactly 1 even for a hub model with dropout."""
        super().train(mode)
        self.policy.eval()
        if self.critic is not None:
            self.critic.eval()
        return self

    def configure_model(self) -> None:
        """Under `ModelParallelStrategy`: shard the policy and the critic (FSDP2), keeping an unsharded copy of
        the policy for the engine (`agentrl.training.update.sharding`). Nothing to do under other strategies."""
        mesh = getattr(self, "_device_mesh", None)  # set by ModelParallelStrategy only
        if mesh is not None and not self._full_policy:
            self._full_policy = [sharding.shard_for_training(self.policy, self.critic, mesh["data_parallel"])]

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return self.ppo_update.build_optimizers()

    def configure_callbacks(self) -> list[pl.Callback]:
        # Lightning tells callbacks, not the module, about exceptions: stop the engine and loop through one
        return [DetachOnException()]

    @property
    def data(self) -> RolloutDataModule:
        """The trainer's data module (a `RolloutDataModule`: tasks, the agent, sampling, evaluation settings)."""
        dm = self.trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at fit, not declared
        if not isinstance(dm, RolloutDataModule):
            raise ValueError("AgentRLModule needs a RolloutDataModule (config key 'data')")
        return dm

    def setup(self, stage: str) -> None:
        self.data.configure(self.algorithm.episodes_per_task)  # a bad batch size stops here, before any work
        check_async(self.data.max_staleness, self.engine_spec, self.algorithm.ppo)
        if stage == "fit":  # fit evaluates by itself (base, eval_every, final): no Lightning validation loop on top
            self.trainer.limit_val_batches = 0

    def on_fit_start(self) -> None:
        # after checkpoint restore and device placement: the engine starts at the restored policy version
        self.attach(self.data.make_collector)
        # s = 0 never asks for a later step's tasks (and a data module may hand Lightning any iterable)
        tasks_for = self.data.train_dataloader().tasks_for if self.data.max_staleness else no_lookahead
        self.lookahead = Lookahead(self.session, self.data.max_staleness, tasks_for, int(self.data.steps),
                                   self.algorithm.episodes_per_task)
        self.meter.fit_starts(self.trainer, self.policy, self.engine_spec, self.device)

    def on_train_start(self) -> None:
        # here, not in on_fit_start: a sharded checkpoint is restored after that hook, when rl_step was still 0
        if self.rl_step == 0:
            self.base_eval = self.evaluate("base")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        plan, tokens = EvalPlan.of(self.data), self.generated_tokens
        if plan.budget_spent(tokens):
            self.trainer.should_stop = True  # the final evaluation follows in on_train_end
        elif plan.due_after(self.rl_step, tokens - int(self.last_metrics.get("perf/generated_tokens", 0)), tokens):
            self.evaluate(f"step {self.rl_step} ({self.generated_tokens} tokens)")

    def on_train_end(self) -> None:
        if EvalPlan.of(self.data).final_due(self.rl_step, self.generated_tokens):
            self.evaluate("final")

    def on_fit_end(self) -> None:
        self.detach(ended=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["agentrl"] = self.counters.state(self.lookahead.launched() if self.lookahead else None)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.counters.restore(checkpoint.get("agentrl", {}))
        continue_finished_run(self._trainer, checkpoint, self.rl_step)  # a resume with more data.steps
        if self.session.started:  # restored after the engine started (sharded checkpoints): serve these weights
            self.session.push(self._serve_policy(), self.policy_version)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # a list of tasks: nothing to move; rollouts are made on the right device later

    def attach(self, make_collector: Any) -> None:
        """Start the rollout loop and the engine, connect the collector, and serve the current weights."""
        self.session.start(self._serve_policy(), make_collector, self.policy_version)

    def detach(self, *, ended: bool = False) -> None:
        """Cancel the batches launched ahead, stop the engine and the rollout loop (idempotent). ``ended``: the run
        finished (its steps or token budget), rather than stopped (a signal, an error)."""
        if self.lookahead is not None:
            report_cancelled(self.lookahead.cancel(), ended=ended, trainer=self._trainer)
        self.session.stop()

    def evaluate(self, label: str) -> dict[str, float]:
        """Play the held-out tasks with the current weights, log ``eval/*`` to every logger and print a line
        (rank 0; `agentrl.training.system.evaluation`). Returns the metrics ({} when nothing was played)."""
        metrics = self.evaluator.run(self.trainer, self.data, label, step=self.rl_step,
                                     generated_tokens=self.generated_tokens)
        self.last_eval = metrics or self.last_eval
        return metrics

    def on_validation_start(self) -> None:
        if self.trainer.validating:
            self.attach(self.data.make_collector)  # after the checkpoint's weights were loaded

    def validation_step(self, tasks: list[Task], batch_idx: int) -> None:
        ckpt = self.trainer.ckpt_path
        self.evaluate(f"step {self.rl_step} checkpoint" if ckpt else "model")

    def on_validation_end(self) -> None:
        if self.trainer.validating:
            self.detach()

    def _serve_policy(self) -> Policy:
        return sharding.served(self.policy, self._full_policy)

    @property
    def collector(self) -> Collector:
        return self.session.collector

    def collect(self, coro: Coroutine[Any, Any, list[Trajectory]]) -> list[Trajectory]:
        """Run one collection with the served weights; checks the version stamps and counts the cost."""
        return self._took(self.session.collect(coro, self.policy_version))

    def collect_batch(self, tasks: list[Task], make: MakeBatch, *, bounded: bool = True) -> list[Trajectory]:
        """The step's first collection, collected now or taken from the batch launched ahead (`Lookahead`)."""
        if self.lookahead is None:  # outside fit: collected now
            self.lookahead = Lookahead(self.session, 0, lambda step: [], 0)
        lost = self.counters.take_lost_ahead(self.rl_step)  # the first step of a resumed run
        if lost is not None and self.trainer.is_global_zero:
            warn_recollecting(lost, self.trainer.world_size)
        trajs, metrics = self.lookahead.batch(self.rl_step, tasks, make, self.policy_version, bounded=bounded)
        self.meter.batch_metrics = metrics
        return self._took(trajs)

    def _took(self, trajs: list[Trajectory]) -> list[Trajectory]:
        self.last_trajectories = trajs
        self.step_record.add_episodes(trajs)
        return trajs

    def push_weights(self) -> None:
        """Serve the updated weights: every later rollout uses them."""
        self.policy_version += 1
        self.session.push(self._serve_policy(), self.policy_version)

    def values(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        return self.scorer.values(self.row_plan, trajectories, keys)

    def logprobs(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        return self.scorer.logprobs(self.row_plan, trajectories, keys, self.session.temperature)

    def update(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets],
               ppo: PPOSettings, *, tag: str = "") -> dict[str, float]:
        """PPO epochs × minibatches over the selected turns (`PPOUpdate.run`; on several ranks, the update one process
        would make over every rank's turns)."""
        memory.before_update(lambda: self.session.before_update(self.lookahead is None or self.lookahead.idle))
        opts = self.optimizers()
        # one decision for every rank: scoring is collective under sharded weights (a rank alone would hang)
        stale = needs_old_logprobs(ppo, self.engine_spec, self.policy, trajectories, self.policy_version)
        score_old = self.logprobs if self.sync_max(int(stale)) else None
        with self.step_progress.phase("updating"):
            out = self.ppo_update.run(trajectories, targets, ppo, plan=self.row_plan,
                                      optimizers=opts if isinstance(opts, list) else [opts],
                                      backward=self.manual_backward, score_old=score_old,
                                      temperature=self.session.temperature, step=self.rl_step, tag=tag,
                                      record=self.step_record)
        memory.after_update(self.policy, self.critic)
        return out

    def sync_max(self, value: int) -> int:
        return distributed.sync_max(value, self.device)

    def all_sum(self, values: Tensor) -> Tensor:
        return distributed.sum_tensor(values, self.device)

    @property
    def row_plan(self) -> RowPlan:
        return RowPlan(self.micro_batch_tokens, self.pack_turns, self.scorer.pad_id, self.device,
                       lockstep=bool(self._full_policy), shared=self.share_prefixes)

    def training_step(self, tasks: list[Task], batch_idx: int) -> None:
        self.meter.start()
        self.step_record = StepRecord()
        # under DDP, backward passes only accumulate locally; the update sums the gradients itself
        # (ranks run different numbers of backward passes: see agentrl.training.update.distributed)
        block_sync = getattr(self.trainer.strategy, "block_backward_sync", contextlib.nullcontext)
        with block_sync():
            metrics = self.algorithm.step(self, list(tasks))
        if not self._full_policy:  # sharded ranks hold different shards by design
            distributed.check_in_sync(self.policy.trainable_parameters(), self.device)
        self.rl_step += 1
        metrics = self.meter.finish(metrics, self.policy, self.critic, self.policy_version)
        metrics |= health_metrics(step_health(self.step_record.episodes or self.last_trajectories, metrics))
        self.last_metrics = self.counters.count_tokens(metrics)
        publish_step(self, metrics, self.rl_step, len(tasks))


