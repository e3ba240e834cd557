"""One training step of a schedule on fixed trajectories, on one process or on several ranks (run as a script).

Used by tests/training/test_exactness.py: the same trajectories, split unevenly between two ranks (rank 0 holds
one group or trunk, rank 1 three), must give the update one process gives over all of them. The schedules' own
code runs unchanged; only collection is replaced by `FixedLearner`, which hands each ``collect`` call the next
fixed batch of this rank (rollouts are not under test here, and sampled ones would differ between the runs).

``--rollouts`` runs real rollouts instead and writes each rank's episode rewards and the logged step metrics.

    python -m tests.training.exactness_run --schedule grpo --devices 2 --out /tmp/x.pt
    python -m tests.training.exactness_run --schedule all --devices 2 --strategy fsdp --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.schedules.token_ppo import TokenPPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.update.batching import keys_of
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory, Turn
from tests.training.helpers import guess_data, letter_data, make_module

VOCAB = 300
GROUPS = 4  # groups (trunks for RTPO); rank 0 of 2 holds the first, rank 1 the other three


def _turns(rng: random.Random, n_turns: int) -> list[Turn]:
    turns: list[Turn] = []
    context = [rng.randrange(3, VOCAB) for _ in range(rng.randint(4, 9))]
    for k in range(n_turns):
        response = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 6))]
        turns.append(Turn(list(context), response, [0.0] * len(response), index=k, reward=0.0))
        context = context + response + [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 5))]
    return turns


def _trajectory(seed: tuple[Any, ...], n_turns: int, group: int, replay: list[Turn] | None = None) -> Trajectory:
    """Random turns; with ``replay``, those turns first (their ids unchanged), then new turns from the context of
    the last one (an RTPO sibling's replayed prefix; a GRPO group's shared first prompt when it is one turn)."""
    rng = random.Random(repr(seed))
    if replay:
        turns = [Turn(list(t.prompt_ids), list(t.response_ids), list(t.logprobs), index=t.index) for t in replay]
        turns[-1].response_ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 6))]
        turns[-1].logprobs = [0.0] * len(turns[-1].response_ids)
        context = turns[-1].prompt_ids + turns[-1].response_ids
        for k in range(len(turns), n_turns):
            context = context + [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 5))]
            response = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 6))]
            turns.append(Turn(list(context), response, [0.0] * len(response), index=k, reward=0.0))
            context = context + response
    else:
        turns = _turns(rng, n_turns)
    turns[-1].reward = rng.choice([-1.0, 0.0, 0.5, 1.0])
    return Trajectory(turns=turns, group=group, terminated=True)


def _groups(schedule: str, shared: bool = False) -> list[list[Trajectory]]:
    """Per group: its trajectories (GRPO: 3 with 1–4 turns; PPO: 1 each); ``shared``: a group's trajectories
    start from one first prompt."""
    size = 3 if schedule == "grpo" else 1
    first = [_trajectory(("first", g), 1, g).turns if shared else None for g in range(GROUPS)]
    return [[_trajectory(("g", g, j), 1 + (g + j) % 4, g, first[g]) for j in range(size)] for g in range(GROUPS)]


def _rtpo_batches(shared: bool = False) -> list[list[list[Trajectory]]]:
    """Per trunk: [trunk], then its siblings at depth K−1 … 0 (K = 3): trunk 0 has one turn (no siblings at depths
    2 and 1), the others three; two siblings per trunk and depth, each continuing to its own end. ``shared``: a
    sibling at depth k replays the trunk's turns 0..k (the same context at turn k), as RTPO's do."""
    out = []
    for g in range(GROUPS):
        depth = 1 if g == 0 else 3
        trunk = _trajectory(("trunk", g), depth, g)
        per_depth = [[_trajectory(("sib", g, k, j), k + 1 + j, g, trunk.turns[:k + 1] if shared else None)
                      if k < depth else None for j in range(2)]
                     for k in reversed(range(3))]
        out.append([[trunk]] + [[s for s in sibs if s is not None] for sibs in per_depth])
    return out


class FixedLearner:
    """The real module as the `Learner`, except that ``collect`` returns this rank's next fixed batch."""

    def __init__(self, module: Any, batches: list[list[Trajectory]]) -> None:
        self.module, self.batches = module, list(batches)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def collect(self, coro: Coroutine[Any, Any, list[Trajectory]]) -> list[Trajectory]:
        coro.close()
        return self.batches.pop(0)

    def collect_batch(self, tasks: list[Any], make: Any, *, bounded: bool = True) -> list[Trajectory]:
        """A schedule's first collection of a step (`Learner.collect_batch`): the next fixed batch too."""
        return self.collect(make(self.module.collector, tasks, self.module.rl_step))


def fixed_schedule(base: type, batches: list[list[Trajectory]], **kw: Any) -> Any:
    class Fixed(base):
        def step(self, learner: Any, tasks: list[Any]) -> dict[str, float]:
            return super().step(FixedLearner(learner, batches), tasks)

    return Fixed(**kw)


MISMATCH_SCHEDULES = ("turn_ppo", "rtpo")  # run with ``--mismatch`` too (the one-process references of ``all``)


def _score_logprobs(module: Any, trajs: list[Trajectory], mismatch: bool = False) -> None:
    """Behaviour log-probs = the initial policy's, one turn at a time (ratios start at 1: real gradients).

    ``mismatch``: shifted per token by -1, -0.5, 0, 0.5 or 1 nats in group 0 (a behaviour policy that is not the
    trainer), so that recomputing π_old matters and the TIS cap (2) truncates some tokens (ratio e^1 > 2), and by
    half that in the other groups (on two ranks, rank 0's largest gap is 1 nat and rank 1's 0.5)."""
    for traj in trajs:
        lp = module.logprobs([traj], keys_of([traj]))
        scale = (1.0 if traj.group == 0 else 0.5) if mismatch else 0.0
        for turn in traj.turns:
            turn.logprobs = [x + scale * (((turn.index + i) % 5) - 2) / 2 for i, x in enumerate(lp[(0, turn.index)])]


class GradLog(pl.Callback):
    """Every optimizer step's (summed) gradient, on rank 0."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        grads = {n: _full(p.grad).clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        if grads:
            self.grads.append(grads)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) tensor gathered whole; a plain tensor as it is."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _count_shared_batches() -> list[int]:
    """A counter of the collated micro-batches that hold shared-prefix rows (this rank), from now on."""
    from agentrl.training.update import rowplan

    count = [0]
    collate = getattr(rowplan.collate, "__wrapped__", rowplan.collate)

    def counting(rows: Any, pad_id: int) -> Any:
        batch = collate(rows, pad_id)
        count[0] += batch.branch is not None
        return batch

    counting.__wrapped__ = collate  # type: ignore[attr-defined]
    rowplan.collate = counting
    return count


def _strategy(name: str, devices: int) -> Any:
    if devices == 1:
        return "auto"
    if name == "fsdp":  # FSDP2 through Lightning's ModelParallelStrategy (Lightning's `fsdp` refuses CPUs)
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    return name


SCHEDULES = {"grpo": GRPO, "turn_ppo": TurnPPO, "token_ppo": TokenPPO, "rtpo": RTPO}
SHARED_SCHEDULES = ("grpo", "rtpo")  # their episodes share contexts (a group's prompt; RTPO's siblings)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", choices=[*sorted(SCHEDULES), "all"], required=True,
                    help="'all': every schedule in turn, into <out>.<schedule>.pt, then the mismatch runs into "
                         "<out>.<schedule>.mismatch.pt (one interpreter start, one process group, for all of them)")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--rollouts", action="store_true")
    ap.add_argument("--mismatch", action="store_true",
                    help="behaviour log-probs that differ from the trainer's: π_old recomputed, TIS-corrected")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.schedule == "all":  # a Trainer per run; the ranks' process group outlives them
        if args.rollouts:
            raise SystemExit("--schedule all runs the fixed trajectories only")
        for name in sorted(SCHEDULES):
            run(name, args.devices, args.strategy, False, Path(f"{args.out}.{name}.pt"))
        for name in MISMATCH_SCHEDULES:
            run(name, args.devices, args.strategy, False, Path(f"{args.out}.{name}.mismatch.pt"), mismatch=True)
        # whiten_equal_returns=false: returns equal on rank 1, different only across the ranks
        run("turn_ppo", args.devices, args.strategy, False, Path(f"{args.out}.turn_ppo.rawequal.pt"), rawequal=True)
        for name in SHARED_SCHEDULES:  # episodes with common contexts: separate rows, then shared-prefix rows
            run(name, args.devices, args.strategy, False, Path(f"{args.out}.{name}.contexts.pt"), contexts=True)
            run(name, args.devices, args.strategy, False, Path(f"{args.out}.{name}.shared.pt"), contexts=True,
                shared=True)
        return
    run(args.schedule, args.devices, args.strategy, args.rollouts, args.out, mismatch=args.mismatch)


def run(name: str, devices: int, strategy: str, rollouts: bool, out: Path, *, mismatch: bool = False,
        contexts: bool = False, shared: bool = False, rawequal: bool = False) -> None:
    """``contexts``: a group's (RTPO: a trunk's siblings') episodes share their contexts; ``shared``: rows with one
    context forwarded as shared-prefix rows (`model.share_prefixes`). ``rawequal``: ``whiten_equal_returns=False``
    with group 0's return 1 and the others' 0, so on two ranks rank 0 holds one return and rank 1 three equal ones:
    only the ranks together see that the returns differ (and whiten, as one process does)."""
    rank, world = int(os.environ.get("LOCAL_RANK", "0")), devices
    kw: dict[str, Any] = {"ppo": PPOSettings(epochs=2, recompute_old_logprobs=True if mismatch else None)}
    if name in ("grpo", "rtpo"):
        kw["group_size"] = 3
    if rawequal:
        kw["whiten_equal_returns"] = False
    if rollouts:
        schedule = SCHEDULES[name](**kw)
        data = guess_data(batch_size=6, steps=1)
    else:
        if name == "rtpo":
            per_group = _rtpo_batches(contexts)
            mine = per_group[:1] if (world == 2 and rank == 0) else per_group[1:] if world == 2 else per_group
            batches = [[t for g in mine for t in g[i]] for i in range(4)]
        else:
            groups = _groups(name, contexts)
            for g, group in enumerate(groups if rawequal else []):
                for traj in group:
                    traj.turns[-1].reward = 1.0 if g == 0 else 0.0
            own = groups[:1] if (world == 2 and rank == 0) else groups[1:] if world == 2 else groups
            batches = [[t for g in own for t in g]]
        schedule = fixed_schedule(SCHEDULES[name], batches, **kw)
        data = letter_data(batch_size=6, steps=1)
    module = make_module(schedule, micro_batch_tokens=64, optim=None, share_prefixes=shared)
    branched = _count_shared_batches()
    if not rollouts:
        for batch in batches:
            _score_logprobs(module, batch, mismatch)
    grads = GradLog()
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=_strategy(strategy, world),
                         max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[grads])
    trainer.fit(module, datamodule=data)
    if rollouts:
        rewards = [t.total_reward for t in module.last_trajectories if not t.failed]
        Path(f"{out}.rank{rank}.json").write_text(json.dumps({"rewards": rewards, "metrics": module.last_metrics}))
        return
    params = {n: _full(p.detach()) for n, p in module.named_parameters() if p.requires_grad}  # collective
    if rank == 0:
        params = {n: p.detach().clone() for n, p in params.items()}
        torch.save({"grads": grads.grads, "params": params, "metrics": module.last_metrics,
                    "shared_batches": branched[0], "world_size": trainer.world_size,
                    "strategy": type(trainer.strategy).__name__}, out)


if __name__ == "__main__":
    main()
