"""Learning benchmark: schedules trained on the same tasks to the same generated-token budget, several seeds.

One *cell* is (environment, schedule, seed): one ``agentrl fit`` run of
``configs/learning/<env>.yaml`` + ``configs/learning/schedules/<schedule>.yaml`` with the cell's seed, stopped by
``data.max_generated_tokens`` and evaluated on held-out games (sampled and greedy) every
``data.eval_every_tokens`` tokens. Each finished cell leaves ``<out>/<env>/<schedule>/seed<k>/`` with the raw
per-step metrics (``metrics.csv``), the run's output (``log.txt``), the overrides it ran with and
``summary.json``, written last: a cell with a ``summary.json`` is finished and skipped by later invocations, so
the suite can be filled over several sittings. A cell that fails or runs past ``--cell-timeout`` leaves no
summary (its log stays) and runs again next time. Every cell also logs to MLflow (one experiment, tags
env/schedule/seed), so the runs can be compared in the UI.

What a cell is — its settings, its folders, whether it has run — lives in `learning_cells`; this script runs the
cells and reports them. ``--report`` (also run after the cells) draws the learning curves (mean and spread over
seeds, x = generated tokens) and writes the table that docs/benchmarks.md quotes.

CreditChain *settings* are environment names with knobs after the config's name (`env_setting`):
``creditchain-d8`` is ``configs/learning/creditchain.yaml`` with 8 distractors, ``creditchain-m3-d4-last-n0.5``
3 decisions, 4 distractors, decisions last (the control), distractor noise σ = 0.5; ``fb`` turns CreditChain's feedback
on (``creditturn-fb``: the turn-level credit test of ``configs/learning/creditturn.yaml``, whose arms are the
schedule files ``turn_ppo_lam05`` and ``turn_ppo_lam1``, and its secondary arms ``token_ppo_credit``, ``turn_ppo_v0``,
``grpo_credit`` and ``rtpo_credit``, run with feedback on; `benchmarks/credit_protocol.py` tabulates it). Each
setting is its own folder
of cells; its learning rates come from the sweep of the plain config name (``--env creditchain --lrs``), so one
protocol run serves the grid, unless the setting has a sweep of its own for the schedule (`sweep_setting`: the
credit test's secondary arms are swept on ``creditturn-fb``).

Example::

    python benchmarks/learning.py --env guess --schedules rtpo turn_ppo grpo token_ppo --seeds 0 1 2
    python benchmarks/learning.py --env guess --report
    python benchmarks/learning.py --smoke --out /tmp/learning     # one tiny cell, seconds: does it run
    python benchmarks/learning.py --env creditchain-d0 creditchain-d4 creditchain-d8 --lr-from-sweep --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from learning_cells import (  # what a cell is, where it lives, whether it ran (re-exported for the other scripts)
    CELL_RULES,
    CONFIGS,
    ROOT,
    SCHEDULE_FILES,
    SCHEDULES,
    WARMUPS,
    cell_folder,
    code_version,
    config_value,
    env_name,
    env_setting,
    finished,
    kept_name,
    overrides,
    scratch_folder,
    settings_digest,
    summarize,
    sweep_setting,
    warmup_digest,
)
from learning_sweep import (
    DEFAULT_LRS,
    NO_EVAL,
    SCHEDULE_LRS,
    SWEEP_SEEDS,
    chosen_lr,
    lr_name,
    report_sweep,
    sweep_lrs,
)

# held-out sampled success for "tokens to reach the target"
TARGETS = {"guess": 0.25, "frozenlake": 0.75, "creditchain": 0.9, "creditturn": 0.9}


def ensure_warmup(env: str, out: Path, smoke: bool = False) -> None:
    """Make the env's warm-up model when its folder is missing; keep its report beside the env's results. A smoke
    cell (the tiny random model) needs none."""
    base, _ = env_setting(env)
    if base not in WARMUPS or smoke:
        return
    script, folder, current = WARMUPS[base]
    report = json.loads((folder / "warmup.json").read_text()) if (folder / "warmup.json").exists() else None
    stale = {k: (report.get(k), v) for k, v in current.items() if report is not None and report.get(k) != v}
    if stale:
        print(f"[learning] {folder} was made for other settings (recorded, wanted: {stale}); making it again",
              flush=True)
    if report is None or stale:
        print(f"[learning] {base}: making the format warm-up model {folder} (once, ~5 min)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / script[0]), *script[1:], "--out", str(folder)],
                       check=True, cwd=ROOT)
    (out / env).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "warmup.json", out / env / "warmup.json")


def reported_schedules(folder: Path, given: list[str]) -> list[str]:
    """The schedules a report covers: the ones this invocation ran and every other one with results in ``folder``.
    Two runners on different schedules of one environment then leave a table (and a ``chosen.json``) of all of
    them, where each used to overwrite it with its own schedules only: a reported runner reading ``chosen.json``
    while a sweep runner finished lost its schedule's choice mid-run. Every schedule file counts (the credit test's
    arms, ``rtpo_fair``), not only the four: one of them swept alone dropped the others' choices. A schedule not run
    now is scored on its default grid (`sweep_lrs`)."""
    on_disk = [s for s in SCHEDULE_FILES if s not in given and (folder / s).is_dir()]
    return ([s for s in SCHEDULES if s in given or s in on_disk]
            + [s for s in [*given, *on_disk] if s not in SCHEDULES])


def reported_seeds(folder: Path, schedules: list[str], given: list[int]) -> list[int]:
    """The seeds a setting's report covers: the ones asked for and every other one with a finished cell of a
    reported schedule in ``folder``. Two runners on different seeds of one setting each used to end by writing
    ``table.md`` and ``curves.png`` of their own seeds only, so the committed figures of a setting were partial
    until someone reran ``--report`` with every seed by hand.

    A sweep finds its seeds per schedule (`learning_sweep.report_sweep`)."""
    names = [f.parent.name.removeprefix("seed") for s in schedules for f in (folder / s).glob("seed*/summary.json")]
    on_disk = {int(k) for k in names if k.isdigit()}
    return sorted(set(given) | on_disk)


def lr_conflict(args: argparse.Namespace, sweeping: bool) -> str | None:
    """What is wrong with the learning-rate arguments taken together, or None."""
    if sweeping and args.lr_from_sweep:
        return "--lrs (run the sweep) and --lr-from-sweep (use its choice) are two different invocations"
    if args.lr is not None and (sweeping or args.lr_from_sweep):
        return "--lr (one given rate) goes without --lrs and --lr-from-sweep"
    return None


def cell_lr(args: argparse.Namespace, env: str, schedule: str, seed: int, swept: float | None) -> float | None:
    """A cell's policy rate without ``--lr``: ``swept`` (its grid point, or None: the config's), or with
    ``--lr-from-sweep`` the rate chosen by the sweep `sweep_setting` named at the start (``args.chosen``), which
    is printed."""
    if not args.lr_from_sweep:
        return swept
    setting, lr = args.chosen[env, schedule]
    print(f"[learning] {env}/{schedule}/seed{seed}: lr {lr:g}, chosen by the {setting} sweep", flush=True)
    return lr


def lr_source(args: argparse.Namespace, sweep: bool) -> str:
    """Where a cell's learning rate comes from, as its summary and its MLflow tags record it."""
    return "sweep" if sweep else ("given" if getattr(args, "lr", None) is not None else "chosen by the sweep")


def run_cell(env: str, schedule: str, seed: int, args: argparse.Namespace, *, lr: float | None = None,
             sweep: bool = False) -> dict[str, Any] | None:
    """One cell; ``lr`` overrides the configs' policy learning rate, ``sweep`` plays no held-out games."""
    folder = cell_folder(args.out, env, schedule, seed, lr, sweep)
    name = folder.relative_to(args.out).as_posix()  # e.g. frozenlake/rtpo/seed0, sweep/frozenlake/rtpo/lr1e-05/seed10
    settings = settings_digest(env, schedule, args.extra)
    source = lr_source(args, sweep)
    if finished(folder, lr, sweep, settings, source):
        print(f"[learning] {name}: finished earlier, skipped", flush=True)
        return json.loads((folder / "summary.json").read_text())
    if folder.exists():  # a partial cell from an interrupted sitting, or one run at another lr: start it again
        shutil.rmtree(folder)  # (a committed earlier result stays in git history)
    folder.mkdir(parents=True)
    scratch = scratch_folder(args.scratch, args.out, folder)
    shutil.rmtree(scratch, ignore_errors=True)
    cell = overrides(env, schedule, seed, folder, args.tracking_uri, scratch, args.extra)
    if sweep:
        cell["data"].update(NO_EVAL)  # the choice never looks at the held-out games
    if lr is not None:
        mlflow_args = cell["trainer"]["logger"][1]["init_args"]
        mlflow_args["tags"] |= {"lr": f"{lr:g}", "lr_source": source}
        mlflow_args["run_name"] += f"-{lr_name(lr)}" if sweep else ""
        critic_lr = config_value(env, schedule, "model", "optim", "critic_lr")  # stated, not left to a merge
        cell["model"]["optim"] = {"lr": lr} | ({"critic_lr": critic_lr} if critic_lr is not None else {})
    (folder / "overrides.json").write_text(json.dumps(cell, indent=1))
    cmd = [sys.executable, "-m", "agentrl", "fit", "--config", str(CONFIGS / f"{env_setting(env)[0]}.yaml"),
           "--config", str(CONFIGS / "schedules" / f"{schedule}.yaml"), "--config", str(folder / "overrides.json"),
           *args.extra]
    print(f"[learning] {name}: running", flush=True)
    code = code_version()  # the code the fit starts on: a commit or an edit landing while it runs is not its code
    warmup = warmup_digest(env)
    start = time.perf_counter()
    cpu_start = _children_cpu()
    with open(folder / "log.txt", "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                timeout=args.cell_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - start
    cpu = _children_cpu() - cpu_start
    kept = None if rc != 0 else keep_checkpoint(scratch, args.keep_checkpoints, kept_name(args.out, name))
    if kept is not None:
        print(f"[learning] {name}: final checkpoint kept as {kept}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if rc != 0:
        why = "timed out" if rc is None else f"exit status {rc}"
        print(f"[learning] {name}: FAILED ({why}) after {wall:.0f} s; see {folder / 'log.txt'}",
              flush=True)
        return None
    summary = summarize(folder / "metrics.csv", env, schedule, seed, wall, cpu, need_evals=not sweep)
    summary["lr"] = lr if lr is not None else config_value(env, schedule, "model", "optim", "lr")
    summary["lr_source"] = source if lr is not None else "config"
    summary["rules"] = CELL_RULES
    summary["code"] = code
    if warmup is not None:
        summary["warmup"] = warmup
    summary["settings"] = settings
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    if sweep:
        print(f"[learning] {name}: done in {wall / 60:.1f} min ({cpu / 60:.1f} CPU-min), "
              f"{summary['generated_tokens']} tokens, training success by step "
              f"{[round(t['success'] or 0.0, 2) for t in summary['train']]}", flush=True)
        return summary
    fin = summary["evals"][-1]
    print(f"[learning] {name}: done in {wall / 60:.1f} min ({cpu / 60:.1f} CPU-min), "
          f"{summary['generated_tokens']} tokens, "
          f"held-out success {summary['evals'][0]['success']:.3f} -> {fin['success']:.3f} "
          f"(greedy {fin['greedy_success']:.3f})", flush=True)
    return summary


def keep_checkpoint(scratch: Path, keep: Path | None, name: str) -> Path | None:
    """Move a finished cell's final checkpoint (``<scratch>/checkpoints/last.ckpt``: the trained policy and critic,
    for `benchmarks/credit.py --checkpoint`) to ``<keep>/<name>.ckpt`` before the scratch folder is removed; None
    when no folder is given or the run left no checkpoint."""
    last = scratch / "checkpoints" / "last.ckpt"
    if keep is None or not last.exists():
        return None
    kept = keep / f"{name}.ckpt"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(last, kept)
    return kept


def _children_cpu() -> float:
    """CPU seconds (user + system) of finished child processes: a cell's cost that other load on a shared
    machine does not inflate the way it inflates wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def smoke_args(args: argparse.Namespace) -> None:
    """``--smoke``: one cheap cell of the first ``--env`` (no warm-up model: the tiny random model replaces it), its
    scratch, checkpoints and MLflow store under ``--out``. Without ``--smoke`` it changes nothing."""
    if not args.smoke:
        return
    args.env, args.schedules, args.seeds = args.env[:1], ["grpo"], [0]
    args.scratch, args.tracking_uri = args.out / "scratch", f"sqlite:///{(args.out / 'mlflow.db').resolve()}"
    args.extra = [*args.extra, "--model.policy.init_args.model", "tiny-random", "--data.max_generated_tokens", "64",
                  "--data.eval_every_tokens", "64", "--data.eval_episodes", "2"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", nargs="+", default=["guess"], type=env_name,
                   help="a config of configs/learning/ (" + ", ".join(sorted(x.stem for x in CONFIGS.glob("*.yaml")))
                        + "), creditchain with settings, e.g. creditchain-d8-last (see the module docstring)")
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULE_FILES)
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help=f"run seeds (default 0 1 2; with --lrs the sweep seeds {' '.join(map(str, SWEEP_SEEDS))})")
    p.add_argument("--lrs", nargs="*", type=float, default=None,
                   help="sweep these policy learning rates (the protocol of benchmarks/learning_sweep.py; no held-out "
                        f"games); --lrs alone sweeps {' '.join(f'{x:g}' for x in DEFAULT_LRS)} ("
                        + "; ".join(f"{k} {' '.join(f'{x:g}' for x in v)}" for k, v in SCHEDULE_LRS.items()) + ")")
    p.add_argument("--lr", type=float, default=None,
                   help="run every cell at this policy learning rate: an ablation outside the protocol (recorded as "
                        "lr_source 'given'; use its own --out)")
    p.add_argument("--lr-from-sweep", action="store_true",
                   help="run each schedule at the learning rate its sweep chose (<out>/sweep/<env>/chosen.json)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    p.add_argument("--scratch", type=Path, default=ROOT / "checkpoints" / "learning",
                   help="checkpoints of running cells (deleted when a cell ends)")
    p.add_argument("--keep-checkpoints", type=Path, default=None, metavar="DIR",
                   help="keep each finished cell's final checkpoint as DIR/<env>/<schedule>/seed<k>.ckpt (for "
                        "benchmarks/credit.py --checkpoint; checkpoints are not committed); an ablation's (another "
                        "--out) under DIR/<its path in the grid, or <name>-<digest>>/...")
    p.add_argument("--tracking-uri", default=f"sqlite:///{ROOT / 'mlflow.db'}")
    p.add_argument("--cell-timeout", type=float, default=900.0, help="seconds before a cell is stopped as failed")
    p.add_argument("--max-cells", type=int, default=None, help="run at most this many unfinished cells, then stop")
    p.add_argument("--report", action="store_true", help="only draw the curves and the table from finished cells "
                   "(a report covers every finished seed of the setting, not only --seeds)")
    p.add_argument("extra", nargs="*", help="more `agentrl fit` arguments after --, e.g. "
                   "-- --model.policy.init_args.model tiny-random")
    p.add_argument("--smoke", action="store_true",
                   help="one GRPO cell of the first --env on the tiny random model to a 64-token budget, everything "
                        "under --out (give one): checks the script runs")
    args = p.parse_args(argv)
    smoke_args(args)
    sweeping = args.lrs is not None
    grids: dict[str, list[float | None]] = {s: list(sweep_lrs(s, args.lrs)) if sweeping else [None]
                                            for s in args.schedules}
    if args.seeds is None:
        args.seeds = list(SWEEP_SEEDS) if sweeping else [0, 1, 2]
    if conflict := lr_conflict(args, sweeping):
        p.error(conflict)
    args.out = args.out.resolve()
    # every schedule's choice is read once, before the first cell runs: a sweep report landing mid-run must not
    # give one schedule's seeds different rates
    args.chosen = {}
    for env in args.env if args.lr_from_sweep else []:
        for schedule in args.schedules:
            setting = sweep_setting(args.out, env, schedule)
            args.chosen[env, schedule] = (setting, chosen_lr(args.out, setting, schedule))
    args.scratch = args.scratch.resolve()
    args.keep_checkpoints = args.keep_checkpoints and args.keep_checkpoints.resolve()
    failed = 0
    if not args.report:
        todo = [(e, s, k, lr) for e in args.env for k in args.seeds for s in args.schedules for lr in grids[s]]
        ran = 0
        for env, schedule, seed, swept in todo:
            lr = args.lr if args.lr is not None else cell_lr(args, env, schedule, seed, swept)
            folder = cell_folder(args.out, env, schedule, seed, lr, sweeping)
            if finished(folder, lr, sweeping, settings_digest(env, schedule, args.extra), lr_source(args, sweeping)):
                run_cell(env, schedule, seed, args, lr=lr, sweep=sweeping)
                continue
            if args.max_cells is not None and ran >= args.max_cells:
                break
            ensure_warmup(env, args.out, smoke=args.smoke)
            ran += 1
            failed += run_cell(env, schedule, seed, args, lr=lr, sweep=sweeping) is None
    from learning_report import report  # the figures and the table (benchmarks/learning_report.py)

    for env in args.env:
        shown = reported_schedules(args.out / "sweep" / env if sweeping else args.out / env, args.schedules)
        if sweeping:
            budget = int(config_value(env, args.schedules[0], "data", "max_generated_tokens"))
            report_sweep(args.out, env, shown, {s: [x for x in grids[s] if x is not None] if s in grids
                                                else list(sweep_lrs(s)) for s in shown},
                         args.seeds, budget, asked=args.schedules)
        else:
            seeds = reported_seeds(args.out / env, shown, args.seeds)
            report(args.out, env, shown, seeds, TARGETS.get(env_setting(env)[0], 0.5))
    return 1 if failed else 0


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    # `kill <runner>` must not orphan the running `agentrl fit`: SystemExit unwinds through subprocess.run, which
    # kills its child; the unfinished cell has no summary.json and runs again on the next invocation
    print("[learning] stopped (SIGTERM); the running cell is left unfinished and runs again next time", flush=True)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
