"""`AgentRLModule`: the policy, the turn critic and an algorithm schedule, trained with live rollouts.

One training step is one RL iteration: the schedule collects rollouts with the current weights, computes
advantages, runs PPO updates, and pushes the new weights to the rollout engine. Rollouts are collected *inside*
the step, so Lightning's prefetching of the next batch (a list of tasks) can never run an episode with stale
weights; every turn is stamped with the policy version, and the session checks the stamps. With
``data.max_staleness`` >= 1 the next steps' batches run ahead while the trainer updates, within that bound
(`agentrl.training.rollout.async_collect`).

This module is the thin adapter between Lightning and the parts that do the work:

* the **schedule** (`agentrl.training.schedules`, `rtpo`) decides *what* to collect and *which* turns to train
  with which targets, talking to this module only through the `Learner` protocol;
* the **rollout session** (`agentrl.training.rollout.session`) owns the loop, the engine and the collector;
* the **PPO update** (`agentrl.training.update.ppo`) owns epochs, minibatches, micro-batches, optimizer steps,
  clipping and the non-finite guard; the **row plan** (`agentrl.training.update.rowplan`) packs and micro-batches turns;
* **evaluation** (`agentrl.training.system.evaluation`) says when to evaluate and plays the held-out tasks.

What stays here is what Lightning needs of a module (optimizers, hooks, checkpoint state, logging) and the
`RunView` (`agentrl.runview`) that callbacks read.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
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
from agentrl.runview import RunView, SavesModel, StepProgress
from agentrl.training.rollout.async_collect import LaunchedAhead, Lookahead, MakeBatch, check_async, no_lookahead
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.rollout.session import RolloutSession
from agentrl.training.system import evaluation
from agentrl.training.system.callbacks import DetachOnException
from agentrl.training.system.metrics import publish_step, reduce_across_ranks, resolved_params
from agentrl.training.system.perf import measure_peak_flops, peak_rise_metrics, step_perf_metrics, update_mfu
from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.training.update.mismatch import needs_old_logprobs
from agentrl.training.update import distributed, memory, sharding
from agentrl.training.update.ppo import NonFiniteUpdateError, PPOUpdate
from agentrl.training.update.rowplan import RowPlan
from agentrl.training.update.settings import CriticSettings, OptimSettings, PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.collect.collector import Collector
    from agentrl.training.schedules.base import Schedule

__all__ = ["AgentRLModule", "NonFiniteUpdateError"]
log = logging.getLogger(__name__)


class AgentRLModule(pl.LightningModule, RunView):
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
        share_prefixes: bool = False,
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
        self.micro_batch_tokens, self.peak_flops = micro_batch_tokens, peak_flops
        self.pack_turns, self.share_prefixes = pack_turns, share_prefixes
        self.rl_step = 0
        self.generated_tokens = 0  # sampled for training, all ranks, over the run (the learning budget's axis)
        self.policy_version = 0
        self.step_progress = StepProgress()  # what the step is doing now (the progress display reads it)
        self.peak_rise = PeakRise()  # which phase raised the process's peak RSS (``perf/*_peak_rise_mib``)
        self.step_progress.on_boundary(self.peak_rise.boundary)
        self.session = RolloutSession(self.engine_spec, self.step_progress)
        self.lookahead: Lookahead | None = None  # the batches launched ahead (data.max_staleness >= 1), per fit
        self._batch_metrics: dict[str, float] = {}  # the step's staleness metrics (`collect_batch`)
        self._lost_ahead = LaunchedAhead([], 0, 0)  # resumed: what the checkpointed run had launched ahead
        self.ppo_update = PPOUpdate(policy, self.critic, self.optim, self.critic_settings, seed, self.step_progress)
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

    # ------------------------------------------------------------------ Lightning: model, optimizers, hooks

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
        if self.peak_flops is None:
            self.peak_flops = measure_peak_flops(self.device, self.policy.compute_dtype)
        for logger in self.trainer.loggers:  # what the `auto` settings chose on this machine and why, for review
            logger.log_hyperparams(resolved_params(self.policy, self.engine_spec))

    def on_train_start(self) -> None:
        # here, not in on_fit_start: a sharded checkpoint is restored after that hook, when rl_step was still 0
        if self.rl_step == 0:
            self.base_eval = self.evaluate("base")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        plan, tokens = self._eval_plan, self.generated_tokens
        if plan.budget_spent(tokens):
            self.trainer.should_stop = True  # the final evaluation follows in on_train_end
        elif plan.due_after(self.rl_step, tokens - int(self.last_metrics.get("perf/generated_tokens", 0)), tokens):
            self.evaluate(f"step {self.rl_step} ({self.generated_tokens} tokens)")

    def on_train_end(self) -> None:
        if self._eval_plan.final_due(self.rl_step, self.generated_tokens):
            self.evaluate("final")

    def on_fit_end(self) -> None:
        self.detach(ended=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["agentrl"] = {"rl_step": self.rl_step, "policy_version": self.policy_version,
                                 "generated_tokens": self.generated_tokens,
                                 # not the episodes (a resume collects them again with the restored weights): how
                                 # many (rank 0's; every rank launches as many), so that the resume can say so
                                 "launched_ahead": self.lookahead.launched().state() if self.lookahead else {}}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("agentrl", {})
        self.rl_step = int(state.get("rl_step", 0))
        self.policy_version = int(state.get("policy_version", 0))
        self.generated_tokens = int(state.get("generated_tokens", 0))
        self._lost_ahead = LaunchedAhead.of(state.get("launched_ahead"))
        evaluation.continue_finished_run(self._trainer, checkpoint, self.rl_step)  # a resume with more data.steps
        if self.session.started:  # restored after the engine started (sharded checkpoints): serve these weights
            self.session.push(self._serve_policy(), self.policy_version)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # a list of tasks: nothing to move; rollouts are made on the right device later

    # ------------------------------------------------------------------ the rollout session

    def attach(self, make_collector: Any) -> None:
        """Start the rollout loop and the engine, connect the collector, and serve the current weights."""
        self.session.start(self._serve_policy(), make_collector, self.policy_version)

    def detach(self, *, ended: bool = False) -> None:
        """Cancel the batches launched ahead, stop the engine and the rollout loop (idempotent). ``ended``: the run
        finished (its steps or token budget), rather than stopped (a signal, an error)."""
        if self.lookahead is not None:
            lost = self.lookahead.cancel()
            steps = ", ".join(str(s + 1) for s in lost.steps)
            if lost.episodes and ended:  # data.max_generated_tokens ended the run before those steps
                log.info("the run ended with %d episode(s) launched ahead for step(s) %s: discarded", lost.episodes,
                         steps)
            elif lost.episodes:
                log.warning("%sstopped with %d episode(s) launched ahead for step(s) %s (%d in flight, %d finished): "
                            "not in the checkpoint, a resume collects them again", self._rank_prefix, lost.episodes,
                            steps, lost.episodes - lost.finished, lost.finished)
        self.session.stop()

    @property
    def _rank_prefix(self) -> str:
        """``"rank R: "`` on several ranks (each says its own counts), else empty."""
        trainer = self._trainer
        return f"rank {trainer.global_rank}: " if trainer is not None and trainer.world_size > 1 else ""

    def evaluate(self, label: str) -> dict[str, float]:
        """Play the held-out tasks with the current weights, log ``eval/*`` to every logger and print a line
        (rank 0; `agentrl.training.system.evaluation`). Returns the metrics ({} when nothing was played)."""
        plan = self._eval_plan
        if not plan.episodes or not self.session.started or not self.trainer.is_global_zero:
            return {}
        held_out = evaluation.evaluate(self.session, self.data.eval_task_list(), greedy=plan.greedy,
                                       generated_tokens=self.generated_tokens, label=label, step=self.rl_step)
        metrics = held_out.metrics | peak_rise_metrics(self.peak_rise, evaluation=True)
        evaluation.publish(self.trainer, self, held_out, metrics, plan)
        self.last_eval = metrics
        return metrics

    # ------------------------------------------------------------------ `agentrl validate` (Lightning's validate)

    def on_validation_start(self) -> None:
        if self.trainer.validating:
            self.attach(self.data.make_collector)  # after the checkpoint's weights were loaded

    def validation_step(self, tasks: list[Task], batch_idx: int) -> None:
        ckpt = self.trainer.ckpt_path
        self.evaluate(f"step {self.rl_step} checkpoint" if ckpt else "model")

    def on_validation_end(self) -> None:
        if self.trainer.validating:
            self.detach()

    @property
    def _eval_plan(self) -> evaluation.EvalPlan:
        return evaluation.EvalPlan.of(self.data)

    def _serve_policy(self) -> Policy:
        """The policy the engine runs: the policy itself, or (sharded) its full copy refreshed (a collective)."""
        if not self._full_policy:
            return self.policy
        sharding.refresh_full_copy(self.policy, self._full_policy[0])
        return self._full_policy[0]

    # ------------------------------------------------------------------ the Learner (what schedules call)

    @property
    def collector(self) -> Collector:
        return self.session.collector

    def collect(self, coro: Coroutine[Any, Any, list[Trajectory]]) -> list[Trajectory]:
        """Run one collection with the served weights; checks the version stamps and counts the cost."""
        trajs = self.session.collect(coro, self.policy_version)
        self.last_trajectories = trajs
        self.step_record.add_episodes(trajs)
        return trajs

    def collect_batch(self, tasks: list[Task], make: MakeBatch, *, bounded: bool = True) -> list[Trajectory]:
        """The step's first collection, collected now or taken from the batch launched ahead (`Lookahead`)."""
        if self.lookahead is None:  # outside fit: collected now
            self.lookahead = Lookahead(self.session, 0, lambda step: [], 0)
        lost = self._lost_ahead
        if self.rl_step in lost.steps:  # the first step of a resumed run
            world = self.trainer.world_size
            if self.trainer.is_global_zero:
                log.warning("resumed: re-collecting %d episode(s)%s of step(s) %s that the stopped run had launched "
                            "ahead (%d in flight, %d finished at the checkpoint)", lost.episodes,
                            f" on each of {world} ranks" if world > 1 else "",
                            ", ".join(str(s + 1) for s in lost.steps), lost.episodes - lost.finished, lost.finished)
            self._lost_ahead = LaunchedAhead([], 0, 0)
        trajs, metrics = self.lookahead.batch(self.rl_step, tasks, make, self.policy_version, bounded=bounded)
        self._batch_metrics = metrics
        self.last_trajectories = trajs
        self.step_record.add_episodes(trajs)
        return trajs

    def push_weights(self) -> None:
        """Serve the updated weights: every later rollout uses them."""
        self.policy_version += 1
        self.session.push(self._serve_policy(), self.policy_version)

    @torch.no_grad()
    def values(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        """Critic values at each response token of the named turns; the first entry is V(s_n)."""
        critic = self.critic
        if critic is None:
            raise RuntimeError("this schedule has no critic")
        with self.step_progress.phase("scoring"):
            scored = self.row_plan.score(trajectories, keys, lambda b: critic(b.input_ids, b.attention_mask, b.branch))
        return {key: v.tolist() for key, v in scored.items()}

    @torch.no_grad()
    def logprobs(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        """The current policy's log-probs of the named turns' response tokens."""
        with self.step_progress.phase("scoring"):
            scored = self.row_plan.score(
                trajectories, keys, lambda b: self.policy.logprobs(b, temperature=self.temperature).logprobs)
        return {key: v.tolist() for key, v in scored.items()}

    def update(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets],
               ppo: PPOSettings, *, tag: str = "") -> dict[str, float]:
        """PPO epochs × minibatches over the selected turns (`agentrl.training.update.ppo.PPOUpdate`).

        On several ranks this is the update one process would make over every rank's turns: each minibatch's
        unit counts are summed over the ranks, every micro-batch's loss is scaled by its share of the *global*
        units, and gradients are summed (not averaged) across ranks before the optimizer step. Every rank runs
        the same number of optimizer steps, with or without rows of its own.
        """
        memory.before_update(lambda: self.session.before_update(self.lookahead is None or self.lookahead.idle))
        opts = self.optimizers()
        # one decision for every rank: scoring is collective under sharded weights (a rank alone would hang)
        stale = needs_old_logprobs(ppo, self.engine_spec, self.policy, trajectories, self.policy_version)
        score_old = self.logprobs if self.sync_max(int(stale)) else None
        with self.step_progress.phase("updating"):
            out = self.ppo_update.run(trajectories, targets, ppo, plan=self.row_plan,
                                      optimizers=opts if isinstance(opts, list) else [opts],
                                      backward=self.manual_backward, score_old=score_old,
                                      temperature=self.temperature, step=self.rl_step, tag=tag,
                                      record=self.step_record)
        memory.after_update(self)
        return out

    def sync_max(self, value: int) -> int:
        return distributed.sync_max(value, self.device)

    def all_sum(self, values: Tensor) -> Tensor:
        return distributed.sum_tensor(values, self.device)

    @property
    def temperature(self) -> float:
        """The sampling temperature the trainer scores log-probs at (the collector's)."""
        return self.session.temperature

    @property
    def pad_id(self) -> int:
        pad = self.policy.tokenizer.pad_token_id
        return int(pad if pad is not None else self.policy.tokenizer.eos_token_id)

    @property
    def row_plan(self) -> RowPlan:
        return RowPlan(self.micro_batch_tokens, self.pack_turns, self.pad_id, self.device,
                       lockstep=bool(self._full_policy), shared=self.share_prefixes)

    # ------------------------------------------------------------------ the training step

    def training_step(self, tasks: list[Task], batch_idx: int) -> None:
        start = time.perf_counter()
        self.session.take_costs()  # nothing from outside the step counts
        self.ppo_update.take_costs()
        self.step_record = StepRecord()
        self._batch_metrics = {}
        # under DDP, backward passes only accumulate locally; the update sums the gradients itself
        # (ranks run different numbers of backward passes: see agentrl.training.update.distributed)
        block_sync = getattr(self.trainer.strategy, "block_backward_sync", contextlib.nullcontext)
        with block_sync():
            metrics = self.algorithm.step(self, list(tasks))
        if not self._full_policy:  # sharded ranks hold different shards by design
            distributed.check_in_sync(self.policy.trainable_parameters(), self.device)
        self.rl_step += 1
        costs = defaultdict(float, self.session.take_costs() | self.ppo_update.take_costs())
        end = time.perf_counter()
        costs["engine_busy_seconds"] = self.session.activity.busy(start, end)
        metrics.update(self._batch_metrics)
        metrics.update(peak_rise_metrics(self.peak_rise))
        metrics.update(step_perf_metrics(costs, end - start, self.policy_version,
                                         mfu=lambda seconds: update_mfu(self.policy, self.critic, costs, seconds,
                                                                        self.peak_flops)))
        metrics = reduce_across_ranks(metrics)  # every rank's episodes and turns, not rank 0's
        self.generated_tokens += int(metrics.get("perf/generated_tokens", 0))
        metrics["perf/generated_tokens_total"] = float(self.generated_tokens)
        self.last_metrics = metrics
        publish_step(self, metrics, self.rl_step, len(tasks))

    # ------------------------------------------------------------------ the RunView (what callbacks read)

    @property
    def total_steps(self) -> int:
        return int(self.data.steps)

    @property
    def max_generated_tokens(self) -> int | None:
        return self.data.max_generated_tokens

    @property
    def schedule_name(self) -> str:
        return type(self.algorithm).__name__

    @property
    def model_name(self) -> str:
        return str(self.policy.name)

    @property
    def engine_name(self) -> str:
        return type(self.engine_spec).__name__

    @property
    def agent(self) -> Any:
        return self.data.agent

    def final_policy(self) -> SavesModel:
        # sharded training: the whole weights, as gathered at the last push (no collective on rank 0 alone)
        return self._full_policy[0] if self._full_policy else self.policy

    def stop_rollouts(self) -> None:
        self.detach()
