"""Credit quality without training: how well each schedule's per-turn advantage matches the truth CreditChain knows.

Rollouts of a *fixed* policy (SmolLM2-135M-Instruct as shipped, through the embedded `HFEngine` and the real
`Collector` / `EnvAgent`) on `CreditChainEnv`; then each schedule's per-turn advantage is computed from the
project's own estimators and schedule settings (``agentrl.algorithms.advantages``, the defaults of
``agentrl.training.schedules.turn_ppo.TurnPPO`` / ``TokenPPO``) and scored against the environment's ground truth:

* decision turns: Spearman correlation between the advantage and "the reply was right" (0/1), the sign
  accuracy (A > 0 for a right reply, A < 0 for a wrong one; A = 0 counts as a miss), and the **within-cue AUC**
  (`within_cue_auc`: how often a right reply's advantage beats a wrong one's on the same cue; 0.5 is no credit).
  The first two pool the cues, which is right for a policy that picks at random on every cue (the base model)
  and misleading for a trained one: a policy that answers one colour to every cue is right on some cues and
  wrong on the others, a critic learns that from the cue, and pooled "right" then says which cue it was;
* distractor turns: mean |A| (the truth is 0: a distractor reply does not change the outcome);
* the variance of A over all scored turns, and the mean |A| on decision turns for scale.

What each schedule sees (one collection per distractor count D, shared by the schedules):

* ``grpo``: ``--group`` episodes per task, ``grpo_advantages`` of the episode returns on every turn.
* ``turn_ppo``: the same episodes, ``turn_gae`` (TurnPPO's γ, λ) over the turn rewards, whitened over the batch as
  TurnPPO does. Critic: the **untrained neutral critic** (V = 0 everywhere, which is what `TurnCritic` outputs at
  initialisation: its head is zero-initialised); no trained critic is loaded by this script.
* ``token_ppo``: the same episodes, ``token_gae`` (TokenPPO's γ = λ = 1) over the response tokens with the same
  neutral critic, whitened over tokens; a turn's score is the mean of its tokens' advantages.
* ``rtpo``: the first episode of each task is the trunk; ``--siblings`` (G − 1) siblings branch at each scored depth
  through `Collector.branch` (real replay / snapshot restore), and ``sibling_advantages`` scores each sibling's
  turn k. Depths scored: every decision depth plus the first and the last distractor depth (``--rtpo-depths
  all`` for every depth; it costs O(turns^2) episodes).

Noise values (``--noise``) do not change what the policy sees, so the rollouts are collected once per D and
*re-scored* per σ by replaying each trajectory's replies through an environment with that σ (exact: the noise is a
hash of seed and parsed history); the σ = 0 re-score is checked against the rewards collected online.

The base model rarely names a colour (checked on its first rollouts: ~1 valid reply in 30), so the environment
runs with ``fallback="hash"``: a reply without a colour word is mapped to a colour by a hash of its text, making
every reply an action whose rightness the environment knows. The share of replies that named a colour is
reported.

**Training-free ground truth** (``--chooser random``, the default with ``--critic`` or ``--env guess|sokoban``): no
language model; a seeded chooser with independent choices, the exact true advantage, an oracle, a learned and the
neutral critic, each estimator scored by its correlation with A^π (`credit_truth`, `credit_truth_cli`,
`credit_tasks`).

**A trained policy and critic** (``--checkpoint CKPT --setting SETTING``): the final checkpoint of a learning cell
(``benchmarks/learning.py --keep-checkpoints DIR``) gives the policy that plays the rollouts and the turn-level
critic Turn-PPO's advantages use (its values at each turn's first response token, the V(s_n) the trainer's
`TurnPPO.critic_targets` reads); the environment, agent context and reply length are the setting's, exactly as
the cell had them (``configs/learning/creditchain.yaml`` with the setting's knobs), so ``--distractors``,
``--order``, ``--options`` and ``--decisions`` come from the setting. The other schedules are scored on the same
rollouts (GRPO and RTPO need no critic; token PPO keeps the neutral critic: the checkpoint's critic is
turn-level). This is the issue's "policy plus critic after N training steps": whether the critic Turn-PPO trained
gives the decision turn the right sign.

Example (the must-show run)::

    python benchmarks/credit.py --env creditchain --decisions 1 --distractors 0 4 8 --noise 0 0.5 \\
        --schedules rtpo turn_ppo grpo token_ppo --json benchmarks/results/credit/credit.json
    python benchmarks/credit.py --setting creditchain-d8 --noise 0 \
        --checkpoint checkpoints/kept/creditchain-d8/turn_ppo/seed0.ckpt --json benchmarks/results/credit/trained.json
    python benchmarks/credit.py --smoke --json /tmp/credit.json    # tiny random model, seconds: does it run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import pickle
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from credit_grid import ROOT, setting_config, setting_env
from credit_truth_cli import run_truth, truth_flags

from agentrl.agents.base import Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.algorithms.advantages import grpo_advantages, sibling_advantages, token_gae, whiten
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.envs import CreditChainEnv
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.models.precision import cpu_identity
from agentrl.training.schedules.token_ppo import TokenPPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.update.batching import TurnKey, keys_of
from agentrl.training.update.rowplan import RowPlan
from agentrl.types import Trajectory

SCHEDULES = ("rtpo", "turn_ppo", "grpo", "token_ppo")
# one scored turn: (schedule advantage, kind "decision"/"distractor", right or None)
Scored = list[tuple[float, str, bool | None, str | None]]  # + the decision's cue (None on distractors)


def make_env(args: argparse.Namespace, distractors: int, noise: float) -> CreditChainEnv:
    if args.setting is not None:  # the learning cell's environment (its distractor count is the setting's)
        return setting_env(args.setting, noise=noise)
    return CreditChainEnv(decisions=args.decisions, distractors=distractors, options=args.options, order=args.order,
                          noise=noise, fallback=args.fallback)


def load_trained(path: Path, model: str) -> tuple[Policy, TurnCritic | None]:
    """The policy and (if the run had one) the turn-level critic of a learning cell's checkpoint: ``model`` (the
    cell's starting weights: the architecture and tokenizer) with the checkpoint's ``policy.*`` and ``critic.*``
    weights loaded strictly (a missing or unexpected weight is an error). Loaded with ``weights_only=True``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    except (OSError, KeyError, RuntimeError, pickle.UnpicklingError) as err:
        raise SystemExit(f"--checkpoint {path}: not a readable agentrl checkpoint ({err})") from None
    policy = Policy(model, compute_dtype="float32")
    policy.load_state_dict({k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")})
    policy.eval()
    own = {k.removeprefix("critic."): v for k, v in state.items() if k.startswith("critic.")}
    if not own:
        return policy, None
    critic = TurnCritic(policy, shared_backbone=not any(k.startswith("backbone.") for k in own))
    critic.load_state_dict(own)
    return policy, critic.eval()


class CriticScorer:
    """The trainer's side of `TurnPPO.critic_targets` for one process: the critic's values through the trainer's
    own row plan (`RowPlan.score`, what `AgentRLModule.values` runs), sums over one rank."""

    def __init__(self, policy: Policy, critic: TurnCritic | None) -> None:
        self.critic = critic
        pad = policy.tokenizer.pad_token_id
        self.plan = RowPlan(2048, True, int(pad if pad is not None else policy.tokenizer.eos_token_id),
                            torch.device("cpu"))

    @torch.no_grad()
    def values(self, trajectories: list[Trajectory], keys: list[TurnKey]) -> dict[TurnKey, list[float]]:
        critic = self.critic
        if critic is None:  # the neutral critic: V = 0 at every response token
            return {(b, n): [0.0] * max(len(trajectories[b].turns[n].response_ids), 1) for b, n in keys}
        scored = self.plan.score(trajectories, keys, lambda b: critic(b.input_ids, b.attention_mask, b.branch))
        return {key: v.tolist() for key, v in scored.items()}

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values


def rescore(env: CreditChainEnv, seed: int, traj: Trajectory) -> tuple[list[float], dict[str, Any]]:
    """Per-turn rewards and the final info of ``traj``'s replies replayed through ``env`` (deterministic)."""
    env.reset(seed)
    rewards, info = [], {}
    for turn in traj.turns:
        result = env.step(turn.text or "")
        rewards.append(result.reward)
        info = result.info
    return rewards, info | {"decision_cues": [env.cue(seed, j) for j in range(env.decisions)]}


def collect(policy: Policy, args: argparse.Namespace, distractors: int) -> tuple[list[Trajectory], list[Trajectory],
                                                                                  dict[str, Task]]:
    """Grouped episodes (GRPO, the critic schedules) and RTPO siblings at the scored depths, for one D."""
    env = make_env(args, distractors, 0.0)
    col = Collector(HFEngine(policy, max_batch_size=64), EnvAgent(env, history=env.agent_history), policy.tokenizer,
                    sampling=SamplingParams(max_tokens=args.max_tokens, temperature=1.0), concurrency=64,
                    seed=args.seed)
    tasks = [Task(f"D{distractors}-t{i}", seed=args.seed * 1_000_003 + i) for i in range(args.tasks)]
    groups = asyncio.run(col.collect_groups(tasks, args.group, step=0))
    siblings: list[Trajectory] = []
    if "rtpo" in args.schedules:
        trunks = [replace(t, tree=t.group) for t in groups[:: args.group]]
        n = args.decisions + distractors
        depths = range(n) if args.rtpo_depths == "all" else sorted(
            {k for k in range(n) if env.is_decision(k)} | ({min(k for k in range(n) if not env.is_decision(k)),
                                                            max(k for k in range(n) if not env.is_decision(k))}
                                                           if distractors else set()))
        by_id = {t.id: t for t in tasks}
        for k in depths:
            siblings += asyncio.run(col.branch(trunks, by_id, k, args.siblings, step=0))
    return groups, siblings, {t.id: t for t in tasks}


def truth(info: dict[str, Any], n: int) -> list[tuple[str, bool | None, str | None]]:
    """(kind, right, cue) of the first ``n`` turns: the j-th decision turn carries the episode's j-th cue
    (``info["decision_cues"]``, added by `rescore`)."""
    cues = iter(info.get("decision_cues", ()))
    return [(kind, right, next(cues, None) if kind == "decision" else None)
            for kind, right in zip(info["turn_kinds"], info["turn_right"], strict=True)][:n]


def score_grpo(trajs: list[Trajectory], rewards: list[list[float]], infos: list[dict[str, Any]]) -> Scored:
    ret = torch.tensor([sum(r) for r in rewards], dtype=torch.float64)
    adv = grpo_advantages(ret, torch.tensor([t.group for t in trajs]))
    return [(float(adv[b]), kind, right, cue) for b, info in enumerate(infos)
            for kind, right, cue in truth(info, 10**6)]


def score_turn_ppo(trajs: list[Trajectory], rewards: list[list[float]], infos: list[dict[str, Any]],
                   scorer: CriticScorer, ppo: TurnPPO | None = None) -> Scored:
    """Turn-PPO's advantages as its trainer computes them (`TurnPPO.critic_targets`: the critic's V(s_n), turn GAE
    with TurnPPO's γ and λ, whitened), on the episodes with their re-scored rewards."""
    rescored = [replace(t, turns=[replace(turn, reward=r) for turn, r in zip(t.turns, row, strict=True)], reward=0.0)
                for t, row in zip(trajs, rewards, strict=True)]
    targets, _ = (ppo or TurnPPO()).critic_targets(scorer, rescored)  # type: ignore[arg-type]  # the two calls it makes
    return [(float(targets[(b, n)].advantage), kind, right, cue) for b, info in enumerate(infos)  # type: ignore[arg-type]
            for n, (kind, right, cue) in enumerate(truth(info, len(rewards[b])))]


def score_token_ppo(trajs: list[Trajectory], rewards: list[list[float]], infos: list[dict[str, Any]]) -> Scored:
    ppo = TokenPPO()
    lengths = [[max(len(t.response_ids), 1) for t in traj.turns] for traj in trajs]
    B, L = len(trajs), max(sum(x) for x in lengths)
    r, mask = torch.zeros(B, L, dtype=torch.float64), torch.zeros(B, L, dtype=torch.bool)
    for b, row in enumerate(lengths):
        pos = 0
        for n, length in enumerate(row):
            mask[b, pos : pos + length] = True
            r[b, pos + length - 1] = rewards[b][n]  # the turn's reward on its last token, as TokenPPO
            pos += length
    adv, _ = token_gae(r, torch.zeros_like(r), mask, gamma=ppo.gamma, lam=ppo.lam)  # neutral critic
    if ppo.whiten_advantages:
        adv = whiten(adv, mask)
    out: Scored = []
    for b, info in enumerate(infos):
        pos = 0
        for length, (kind, right, cue) in zip(lengths[b], truth(info, len(lengths[b])), strict=True):
            out.append((float(adv[b, pos : pos + length].mean()), kind, right, cue))
            pos += length
    return out


def score_rtpo(siblings: list[Trajectory], rewards: list[list[float]], infos: list[dict[str, Any]]) -> Scored:
    out: Scored = []
    for k in sorted({s.branch_turn for s in siblings if s.branch_turn is not None}):
        idx = [i for i, s in enumerate(siblings) if s.branch_turn == k and not s.failed and s.num_turns > k]
        if not idx:
            continue
        ret = torch.tensor([sum(rewards[i]) for i in idx], dtype=torch.float64)
        adv = sibling_advantages(ret, torch.tensor([siblings[i].group for i in idx]))
        for a, i in zip(adv.tolist(), idx, strict=True):
            kind, right, cue = truth(infos[i], siblings[i].num_turns)[k]
            out.append((a, kind, right, cue))
    return out


def within_cue_auc(scored: Scored) -> tuple[float | None, int]:
    """How often a right decision's advantage beats a wrong one's *on the same cue* (ties count half), over every
    such (right, wrong) pair, and the number of pairs. The pooled Spearman mixes cues: once a critic's baseline
    knows what the policy does on each cue (a policy that answers one colour to every cue is right on half the
    cues, always, and wrong on the others), "right" says which cue it was more than what the reply did, and the
    pooled ranks measure the baseline; within a cue only the reply differs."""
    by_cue: dict[str | None, tuple[list[float], list[float]]] = {}
    for a, kind, right, cue in scored:
        if kind == "decision":
            by_cue.setdefault(cue, ([], []))[0 if right else 1].append(a)
    wins, pairs = 0.0, 0
    for rights, wrongs in by_cue.values():
        for x in rights:
            for y in wrongs:
                wins += 1.0 if x > y else 0.5 if x == y else 0.0
                pairs += 1
    return (wins / pairs if pairs else None), pairs


def metrics(scored: Scored) -> dict[str, Any]:
    """The credit-quality figures of one (schedule, setting)."""
    dec = [(a, bool(r)) for a, kind, r, _ in scored if kind == "decision"]
    dis = [a for a, kind, _, _ in scored if kind == "distractor"]
    allv = torch.tensor([a for a, _, _, _ in scored], dtype=torch.float64)
    auc, pairs = within_cue_auc(scored)
    rho = None
    if len(dec) > 2 and len({r for _, r in dec}) > 1 and len({a for a, _ in dec}) > 1:
        rho = float(spearmanr([a for a, _ in dec], [float(r) for _, r in dec]).statistic)
    return {
        "decision_turns": len(dec), "distractor_turns": len(dis),
        "decision_right_rate": _mean([float(r) for _, r in dec]),
        "spearman": rho,
        "within_cue_auc": auc, "within_cue_pairs": pairs,
        "sign_accuracy": _mean([float((a > 0) if r else (a < 0)) for a, r in dec]),
        "decision_mean_abs": _mean([abs(a) for a, _ in dec]),
        "distractor_mean_abs": _mean([abs(a) for a in dis]),
        "variance": float(allv.var()) if allv.numel() > 1 else None,
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def critic_profile(scorer: CriticScorer, trajs: list[Trajectory], infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The critic's V(s_n) at each turn n, averaged over the episodes whose (first) decision was right and over those
    whose decision was wrong: a consistent critic that knows the outcome once the decision is made separates them
    from the decision's next turn on; one that separates them only *before* the decision (it reads the cue, not
    the reply) gives the decision an advantage of the wrong sign (see docs/benchmarks-log.md, "a trained critic")."""
    values = scorer.values(trajs, keys_of(trajs))
    out: dict[str, Any] = {}
    for label, want in (("right", True), ("wrong", False)):
        rows = [b for b, info in enumerate(infos)
                if next((r for k, r, _ in truth(info, 10**6) if k == "decision"), None) is want]
        depth = max((trajs[b].num_turns for b in rows), default=0)
        out[label] = {"episodes": len(rows), "mean_v_by_turn": [
            _mean([values[(b, n)][0] for b in rows if n < trajs[b].num_turns]) for n in range(depth)]}
    return out


def evaluate(args: argparse.Namespace, distractors: int, noise: float, groups: list[Trajectory],
             siblings: list[Trajectory], tasks: dict[str, Task], scorer: CriticScorer) -> dict[str, dict[str, Any]]:
    env = make_env(args, distractors, noise)
    g_rew, g_info = zip(*(rescore(env, tasks[t.task_id].seed, t) for t in groups), strict=True)
    s_out = [rescore(env, tasks[t.task_id].seed, t) for t in siblings]
    s_rew, s_info = [r for r, _ in s_out], [i for _, i in s_out]
    scorers = {"grpo": lambda: score_grpo(groups, list(g_rew), list(g_info)),
               "turn_ppo": lambda: score_turn_ppo(groups, list(g_rew), list(g_info), scorer,
                                                  TurnPPO(gamma=args.turn_gamma, lam=args.turn_lam)),
               "token_ppo": lambda: score_token_ppo(groups, list(g_rew), list(g_info)),
               "rtpo": lambda: score_rtpo(siblings, s_rew, s_info)}
    return {name: metrics(scorers[name]()) for name in args.schedules}


def check_online_rewards(args: argparse.Namespace, distractors: int, trajs: list[Trajectory],
                         tasks: dict[str, Task]) -> None:
    """The σ = 0 re-score must give back the rewards collected online (the environment is deterministic)."""
    env = make_env(args, distractors, 0.0)
    for t in trajs:
        rewards, _ = rescore(env, tasks[t.task_id].seed, t)
        if any(abs(a - b.reward) > 1e-9 for a, b in zip(rewards, t.turns, strict=True)):
            raise RuntimeError(f"re-scoring {t.task_id} did not reproduce its online rewards")


def rollout_stats(env: CreditChainEnv, trajs: list[Trajectory]) -> dict[str, float]:
    texts = [turn.text or "" for t in trajs for turn in t.turns if not turn.forced]
    named = sum(env.names_option(x) for x in texts)
    return {"episodes": len(trajs), "sampled_turns": len(texts), "named_a_colour": named / max(len(texts), 1),
            "mean_return": sum(t.total_reward for t in trajs) / max(len(trajs), 1),
            "success": sum(t.success for t in trajs) / max(len(trajs), 1),
            "mean_tokens_per_turn": sum(len(turn.response_ids) for t in trajs for turn in t.turns
                                        if not turn.forced) / max(len(texts), 1)}


def fmt(x: float | None, spec: str = "+.3f") -> str:
    return "   -  " if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def apply_setting(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--setting``: the learning cell's environment knobs, starting model and reply length replace the flags'."""
    if args.setting is None:
        if args.checkpoint is not None:
            parser.error("--checkpoint needs --setting (the learning setting its cell trained on)")
        return
    try:
        env, config = setting_env(args.setting), setting_config(args.setting)
    except (ValueError, OSError) as err:
        parser.error(f"--setting {args.setting}: {err}")
    args.distractors, args.decisions, args.options = [env.distractors], env.decisions, env.options
    args.order, args.fallback = env.order, env.fallback
    args.max_tokens = int(config["data"]["sampling"]["max_tokens"])
    if args.model is None:
        args.model = str(ROOT / config["model"]["policy"]["init_args"]["model"])
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file")


def _defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``--smoke``'s tiny run, then the chooser (the seeded random one whenever a critic is asked for or the task is
    not CreditChain) and the task count that goes with it."""
    if args.smoke:
        args.model, args.distractors, args.noise, args.tasks = "tiny-random", [0], [0.0], 1
        args.group, args.siblings, args.max_tokens = 2, 2, 2
    if args.chooser is None:
        args.chooser = "random" if args.critic is not None or args.env != "creditchain" else "llm"
    if args.tasks is None:
        args.tasks = 16 if args.chooser == "random" else 6
    return args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=["creditchain", "guess", "sokoban"], default="creditchain",
                        help="guess and sokoban: the training-free ground truth of benchmarks/credit_tasks.py")
    parser.add_argument("--decisions", type=int, default=1)
    parser.add_argument("--distractors", type=int, nargs="+", default=[0, 4, 8])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--options", type=int, default=2)
    parser.add_argument("--order", choices=["decisions_first", "decisions_last"], default="decisions_first")
    parser.add_argument("--fallback", choices=["hash", "error"], default="hash")
    parser.add_argument("--tasks", type=int, default=None, help="episode seeds (tasks) per D (default 6; 16 with "
                        "the random chooser: 64 episodes a setting)")
    parser.add_argument("--group", type=int, default=4, help="episodes per task (GRPO group)")
    parser.add_argument("--siblings", type=int, default=2, help="RTPO siblings per trunk and depth (G - 1)")
    parser.add_argument("--rtpo-depths", choices=["scored", "all"], default="scored")
    parser.add_argument("--max-tokens", type=int, default=3)
    parser.add_argument("--model", default=None, help="the policy (default smollm2-135m-instruct; with --setting the "
                        "setting's starting model)")
    parser.add_argument("--setting", default=None, help="a learning setting (e.g. creditchain-d8): its environment, "
                        "starting model and reply length, as its cells had them")
    parser.add_argument("--checkpoint", type=Path, default=None, help="a learning cell's final checkpoint "
                        "(benchmarks/learning.py --keep-checkpoints): its policy plays, its critic scores turn_ppo")
    parser.add_argument("--seed", type=int, default=0)
    # the paper's constants, with which the committed credit JSONs were made; with Turn-PPO's own default (1.0 /
    # 1.0) its turn_ppo row differs from token_ppo's only in the critic's granularity
    parser.add_argument("--turn-gamma", type=float, default=0.99, help="Turn-PPO's γ (default: the paper's 0.99)")
    parser.add_argument("--turn-lam", type=float, default=0.9, help="Turn-PPO's GAE λ (default: the paper's 0.9)")
    parser.add_argument("--json", type=Path, default=None)
    truth_flags(parser)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny random model, D = 0, one task, two episodes: checks the script runs (give --json)")
    args = _defaults(parser.parse_args(argv))
    if args.chooser == "random":
        return run_truth(args, parser)
    apply_setting(args, parser)
    args.model = args.model or "smollm2-135m-instruct"
    for name in ("tasks", "group", "siblings", "decisions", "options", "max_tokens"):
        if getattr(args, name) < (2 if name in ("group", "siblings", "options") else 1):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    critic: TurnCritic | None = None
    if args.checkpoint is not None:
        policy, critic = load_trained(args.checkpoint, args.model)
    else:
        policy = Policy(args.model, compute_dtype="float32")
    scorer = CriticScorer(policy, critic)
    rows, rollouts, profiles = [], {}, {}
    print(f"{'schedule':9s} {'D':>2s} {'sigma':>5s} {'n_dec':>5s} {'spearman':>8s} {'sign_acc':>8s} "
          f"{'cue AUC':>7s} {'pairs':>5s} {'|A| dec':>7s} {'|A| dis':>7s} {'var':>7s}", flush=True)
    for d in args.distractors:
        t0 = time.perf_counter()
        groups, siblings, tasks = collect(policy, args, d)
        check_online_rewards(args, d, groups + siblings, tasks)
        rollouts[str(d)] = rollout_stats(make_env(args, d, 0.0), groups) | {
            "rtpo_siblings": len(siblings), "seconds": time.perf_counter() - t0}
        if "turn_ppo" in args.schedules:
            profiles[str(d)] = critic_profile(scorer, groups, [rescore(make_env(args, d, 0.0), tasks[t.task_id].seed,
                                                                        t)[1] for t in groups])
            print("[credit] critic V(s_n) by turn, decision right / wrong: "
                  + json.dumps({k: [round(x, 3) for x in v["mean_v_by_turn"] if x is not None]
                                for k, v in profiles[str(d)].items()}), flush=True)
        for noise in args.noise:
            for name, m in evaluate(args, d, noise, groups, siblings, tasks, scorer).items():
                rows.append({"schedule": name, "distractors": d, "noise": noise} | m)
                print(f"{name:9s} {d:2d} {noise:5.2f} {m['decision_turns']:5d} {fmt(m['spearman']):>8s} "
                      f"{fmt(m['sign_accuracy'], '.3f'):>8s} {fmt(m['within_cue_auc'], '.3f'):>7s} "
                      f"{m['within_cue_pairs']:5d} {fmt(m['decision_mean_abs'], '.3f'):>7s} "
                      f"{fmt(m['distractor_mean_abs'], '.3f'):>7s} {fmt(m['variance'], '.3f'):>7s}", flush=True)
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           "env": make_env(args, args.distractors[0], args.noise[0]).metadata(),
           "critic": (f"trained: {args.checkpoint}" if critic is not None
                      else "untrained neutral critic (V = 0), no trained critic given"),
           "rollouts": rollouts, "rows": rows, "critic_profile": profiles, "seconds": time.perf_counter() - start,
           "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
           "cpu": cpu_identity()}
    print(f"[credit] {out['seconds']:.0f} s; rollouts: " + json.dumps(rollouts), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
