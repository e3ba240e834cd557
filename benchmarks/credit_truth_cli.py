"""`benchmarks/credit.py`'s training-free mode (``--chooser random``, the default with ``--critic`` or a non-CreditChain
``--env``): the flags, the loop over settings and the JSON. The maths is in `credit_truth` (CreditChain) and
`credit_tasks` (GuessNumber, Sokoban).

Example (the issue's must-show run, ~1 min)::

    python benchmarks/credit.py --env creditchain --decisions 3 --distractors 2 6 --noise 0 0.3 \\
        --lambdas 0 0.5 0.9 1 --feedback on off --critic oracle learned zero \\
        --json benchmarks/results/credit/truth-creditchain.json
    python benchmarks/credit.py --env guess --lambdas 0 0.5 0.9 1 --json benchmarks/results/credit/truth-guess.json
    python benchmarks/credit.py --env sokoban --lambdas 0 0.5 0.9 1 --json benchmarks/results/credit/truth-sokoban.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from credit_truth import TruthArgs, run

from agentrl.models.precision import cpu_identity


def truth_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the training-free mode."""
    g = parser.add_argument_group("training-free ground truth (--chooser random)")
    g.add_argument("--chooser", choices=["llm", "random"], default=None,
                   help="llm: SmolLM2 rollouts (the hash fallback); random: a seeded chooser with independent "
                        "choices at --right-rates, scored against the exact true advantage")
    g.add_argument("--critic", nargs="+", choices=["oracle", "learned", "zero"], default=None,
                   help="the critics Turn-PPO's turn GAE is scored with (random chooser)")
    g.add_argument("--lambdas", nargs="+", type=float, default=[0.0, 0.5, 0.9, 1.0], help="Turn-PPO's GAE λs")
    g.add_argument("--feedback", nargs="+", choices=["on", "off"], default=["off"],
                   help="CreditChain's feedback knob (the observation after a decision says right / wrong)")
    g.add_argument("--right-rates", nargs="+", type=float, default=[0.8, 0.6, 0.4, 0.2],
                   help="the chooser's p(right | cue), one per cue (default: a policy part-way through learning)")
    g.add_argument("--cues", type=int, default=4, help="cue words in play (the learning configs' 4)")
    g.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (tasks) for the SE")
    g.add_argument("--expert-rate", type=float, default=0.5,
                   help="guess / sokoban: the chooser's probability of the expert's move (bisection, the solver's)")
    g.add_argument("--fit-episodes", type=int, default=256,
                   help="rollouts (other seeds) the learned critic is fitted on")


def run_truth(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Every setting's rows; ``--json`` gets the rows, the settings' rollout facts and the arguments."""
    start = time.perf_counter()
    if args.env == "creditchain":
        if len(args.right_rates) != args.cues or not all(0.0 <= p <= 1.0 for p in args.right_rates):
            parser.error(f"--right-rates needs {args.cues} rates in [0, 1] (one per cue), got {args.right_rates}")
        base = TruthArgs(decisions=args.decisions, options=args.options, cues=args.cues, order=args.order,
                         rates=tuple(args.right_rates), tasks=args.tasks, group=args.group, siblings=args.siblings,
                         fit_episodes=args.fit_episodes, lambdas=tuple(args.lambdas),
                         critics=tuple(args.critic or ("oracle", "learned", "zero")), boot=args.boot, seed=args.seed)
        rows, settings = run(base, args.distractors, args.noise, [f == "on" for f in args.feedback])
        what: dict[str, Any] = {"truth": "A^pi = (1[right] - p(cue)) / M on decisions, 0 on distractors (gamma 1)",
                                "policy": "seeded random chooser, independent choices; p(right | cue) = right_rates"}
    else:
        from credit_tasks import run_task

        rows, settings, what = run_task(args)
    out = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, **what,
           "score": "Pearson correlation of the per-turn advantage with the truth over all scored turns; se: "
                    "cluster bootstrap over tasks",
           "settings": settings, "rows": rows, "seconds": time.perf_counter() - start,
           "machine": {"platform": platform.platform()}, "cpu": cpu_identity()}
    print(f"[credit] {out['seconds']:.0f} s, {len(rows)} rows", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
