"""What a learning cell is, for `benchmarks/learning.py` and the scripts that read its results: the settings a cell
runs with (an environment name with its knobs, the configs, the overrides), where its files live (its folder, its
scratch, its kept checkpoint), and whether it has already run (`finished`: a ``summary.json`` under the current
`CELL_RULES`, settings digest and learning rate; the code and warm-up model it ran on). `learning.py` runs the cells
and reports them; nothing here starts a process other than ``git``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import json
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import torch
import yaml
from learning_sweep import sweep_dir

from agentrl.models.precision import cpu_identity

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "learning"
SCHEDULES = ("rtpo", "turn_ppo", "grpo", "token_ppo")
# every schedule file under configs/learning/schedules/ can be run (the four above and variants such as the
# credit test's turn_ppo_lam05 / turn_ppo_lam1 and rtpo_fair, RTPO's fair run); the four are the default and the
# report's order
SCHEDULE_FILES = tuple(sorted(x.stem for x in (CONFIGS / "schedules").glob("*.yaml")))
# CreditChain configs: settings (`env_setting`) apply to these; creditturn is the turn-level credit test
# (configs/learning/creditturn.yaml), which starts from the same warm-up model
CHAIN_CONFIGS = ("creditchain", "creditturn")


# environments whose cells start from a warmed-up model folder (the env config names it), made once by a script,
# and what its warmup.json must record to be current (a folder made for another CreditChain context policy, the
# summary context, is made again)
WARMUPS: dict[str, tuple[list[str], Path, dict[str, Any]]] = {
    "frozenlake": (["format_warmup.py"], ROOT / "checkpoints" / "warmup" / "frozenlake-format", {}),
    "creditchain": (["format_warmup.py", "--env", "creditchain"],
                    ROOT / "checkpoints" / "warmup" / "creditchain-format", {"context": "full"}),
}
WARMUPS["creditturn"] = WARMUPS["creditchain"]

# per environment, settings a schedule file must not keep there: RTPO's `max_depth: 3` (FrozenLake, GuessNumber)
# would never train a CreditChain decision that comes after turn 3 (the control puts it last), so RTPO trains
# every depth there. The whole-episode schedules' `minibatch_size: 4` counts rows, and CreditChain's summary context
# makes every turn a row (no prompt extends the last): 8 episodes of D + M turns would take 2(D + M) optimizer steps
# an update, more the longer the chain, where FrozenLake and GuessNumber take two (a row is an episode there). So
# they take two minibatches there by count (`ppo.minibatches`), whatever D and whatever the context policy (with the
# grid's full context, one row an episode, the count and the size agree). RTPO's rows are
# one depth's siblings, one turn each, on every task: its `minibatch_size: 4` already gives two minibatches of a
# depth's 8 siblings.
_TWO_MINIBATCHES = {"model": {"algorithm": {"init_args": {"ppo": {"minibatch_size": None, "minibatches": 2}}}}}
SCHEDULE_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    ("creditchain", "rtpo"): {"model": {"algorithm": {"init_args": {"max_depth": None}}}},
    ("creditchain", "grpo"): _TWO_MINIBATCHES,
    ("creditchain", "turn_ppo"): _TWO_MINIBATCHES,
    ("creditchain", "token_ppo"): _TWO_MINIBATCHES,
}

_KNOBS = {"d": ("distractors", int), "m": ("decisions", int), "n": ("noise", float)}


def env_setting(name: str) -> tuple[str, dict[str, Any]]:
    """``creditchain-m3-d4-last-n0.5`` → (``creditchain``, the env's init_args it overrides). Knobs: ``d<D>``
    distractors, ``m<M>`` decisions, ``n<σ>`` noise, ``first``/``last`` order, ``fb`` feedback on (the observation
    after a decision says whether it was right); a plain name has none."""
    base, *parts = name.split("-")
    knobs: dict[str, Any] = {}
    for part in parts:
        match = re.fullmatch(r"([dmn])(\d+(?:\.\d+)?)", part)
        if part in ("first", "last"):
            knobs["order"] = f"decisions_{part}"
        elif part == "fb":
            knobs["feedback"] = True
        elif match and (match[1] == "n" or "." not in match[2]):
            key, kind = _KNOBS[match[1]]
            knobs[key] = kind(match[2])
        else:
            raise ValueError(f"--env {name}: {part!r} is not a setting (d<D>, m<M>, n<sigma>, first, last or fb)")
    if knobs and base not in CHAIN_CONFIGS:
        raise ValueError(f"--env {name}: settings apply to {' and '.join(CHAIN_CONFIGS)} only")
    return base, knobs


def env_name(name: str) -> str:
    """argparse type of ``--env``: a config under configs/learning/ with valid settings."""
    try:
        base, _ = env_setting(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not (CONFIGS / f"{base}.yaml").exists():
        known = ", ".join(sorted(x.stem for x in CONFIGS.glob("*.yaml")))
        raise argparse.ArgumentTypeError(f"--env {name}: no configs/learning/{base}.yaml (known: {known})")
    return name

def warmup_digest(env: str) -> str | None:
    """The warm-up model a cell of ``env`` starts from: a digest of its weights file (None for an env without one,
    or before it is made). Recorded in each ``summary.json`` (``warmup``): the folder is made on each machine, and
    one made with another thread count has weights that differ in the last bits (training losses equal to 6
    decimals, not bit for bit), so the setting's ``warmup.json`` alone cannot say which one a committed cell used."""
    base, _ = env_setting(env)
    if base not in WARMUPS:
        return None
    weights = WARMUPS[base][1] / "model.safetensors"
    if not weights.exists():
        return None
    stat = weights.stat()
    return _file_digest(str(weights), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()[:16]


def cell_dir(out: Path, env: str, schedule: str, seed: int) -> Path:
    return out / env / schedule / f"seed{seed}"


def overrides(env: str, schedule: str, seed: int, folder: Path, tracking_uri: str, scratch: Path,
              extra: list[str] | None = None) -> dict[str, Any]:
    """The cell's own settings: its seed, its loggers (CSV into the cell folder, MLflow with tags), scratch. The
    extra ``agentrl fit`` arguments are a tag too: an ablation's MLflow run (same env, schedule, seed and run name as
    the grid's cell) then says what it changed."""
    tags = {"benchmark": "learning", "env": env, "schedule": schedule, "seed": str(seed)}
    if extra:
        tags["extra"] = " ".join(extra)
    base, knobs = env_setting(env)
    cell: dict[str, Any] = {
        "seed_everything": seed,
        "trainer": {"logger": [
            {"class_path": "lightning.pytorch.loggers.CSVLogger",
             "init_args": {"save_dir": str(folder), "name": "", "version": ""}},
            {"class_path": "agentrl.tracking.MLflowLogger",
             "init_args": {"experiment_name": "agentrl-learning", "tracking_uri": tracking_uri,
                           "run_name": f"{env}-{schedule}-seed{seed}", "tags": tags}},
        ]},
        "checkpoint": {"dirpath": str(scratch / "checkpoints"), "every_n_steps": 1000},
        # a cell is measured by its in-run evaluations: its final weights (540 MB for SmolLM2) are not kept in
        # MLflow unless asked for (`-- --tracking.log_final_model true`)
        "tracking": {"log_final_model": False},
        "data": {"seed": seed},
        "model": {"seed": seed},
    }
    if knobs:
        cell["data"]["agent"] = {"init_args": {"env": {"init_args": knobs}}}
    for key, value in SCHEDULE_OVERRIDES.get((base, schedule), {}).items():
        cell[key] = _merged(cell.get(key, {}), value)
    return cell


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def out_key(out: Path) -> str:
    """A folder name for ``--out`` that two outs never share: ``<name>-<digest of its absolute path>``."""
    return f"{out.name}-{hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:8]}"


def scratch_folder(scratch: Path, out: Path, folder: Path) -> Path:
    """A running cell's checkpoints: one folder per cell (sweep cells: per lr too), so runners can share the scratch
    root, and per ``--out`` as well: an ablation's cell (``--out .../ablations/x``) has the grid cell's name
    (``creditchain/turn_ppo/seed0``), and starting one wiped the other's checkpoints when both ran at once."""
    return scratch / out_key(out) / folder.relative_to(out)


def kept_name(out: Path, name: str) -> str:
    """Where under ``--keep-checkpoints DIR`` a cell's final checkpoint goes: ``<name>`` for the grid's own cells
    (``creditchain-d8/turn_ppo/seed0``), under the out's path within the grid for an ablation
    (``ablations/turn-ppo-lam1/creditchain-d8/turn_ppo/seed0``), under `out_key` for an out elsewhere. By the cell's
    name alone, an ablation's checkpoint and its grid namesake's would overwrite each other in one DIR."""
    grid = (ROOT / "benchmarks" / "results" / "learning").resolve()
    where = out.resolve()
    if where == grid:
        return name
    return f"{where.relative_to(grid).as_posix() if where.is_relative_to(grid) else out_key(out)}/{name}"


def cell_folder(out: Path, env: str, schedule: str, seed: int, lr: float | None, sweep: bool) -> Path:
    return sweep_dir(out, env, schedule, lr, seed) if sweep and lr is not None else cell_dir(out, env, schedule, seed)


CELL_RULES = 2
"""The version of what a cell measures, recorded in each ``summary.json`` (``rules``; a summary without one is
version 1). Bump it with a change to the training code, a config or the protocol that makes the committed cells
not comparable with new ones (a fix to a schedule's update, a changed config default): `finished` then reruns every
cell of an older version, where before such cells had to be found and deleted by hand.

Version 2: the engine's sampler draws one uniform a token (commit 99eef8f) where it drew a vocabulary's worth of
exponentials: the same distribution, another stream, so a seed's episodes, and what a cell learns from them, differ.
The cells run after that commit and before this bump were marked version 2 by hand (docs/benchmarks-log.md names
them)."""


def settings_digest(env: str, schedule: str, extra: list[str]) -> str:
    """A digest of what a cell's settings are: its two config files as parsed (comments and layout do not count)
    and the extra ``agentrl fit`` arguments, recorded in each ``summary.json`` (``settings``). A changed setting in
    one schedule's config (RTPO's group size) then reruns that schedule's cells only, where `CELL_RULES` reruns all
    of them; a summary written before digests were recorded has none and is taken as current."""
    files = [CONFIGS / f"{env_setting(env)[0]}.yaml", CONFIGS / "schedules" / f"{schedule}.yaml"]
    parsed = [yaml.safe_load(f.read_text()) for f in files]
    return hashlib.sha256(json.dumps([parsed, list(extra)], sort_keys=True).encode()).hexdigest()[:16]


def finished(folder: Path, lr: float | None, sweep: bool, settings: str | None = None,
             source: str = "chosen by the sweep") -> bool:
    """Whether the cell in ``folder`` has run: it has a summary under the current `CELL_RULES` and, when it
    records one, the current ``settings`` digest (`settings_digest`), and a cell asked for at an ``lr`` from
    ``source`` (chosen by the sweep, or given by ``--lr``) ran at that lr (a summary from a run at the configs' lr,
    or at another choice, is not this cell's result)."""
    f = folder / "summary.json"
    if not f.exists():
        return False
    done = json.loads(f.read_text())
    if done.get("rules", 1) < CELL_RULES:
        return False
    if settings is not None and done.get("settings", settings) != settings:
        return False
    if lr is None or sweep:
        return True
    return bool(done.get("lr_source") == source and done.get("lr") == lr)


def config_value(env: str, schedule: str, *keys: str) -> Any:
    """A setting as the cell's configs give it (the schedule's file over the environment's), None when unset."""
    value = None
    for path in (CONFIGS / f"{env_setting(env)[0]}.yaml", CONFIGS / "schedules" / f"{schedule}.yaml"):
        node: Any = yaml.safe_load(path.read_text())
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        value = node if node is not None else value
    return value


def sweep_setting(out: Path, env: str, schedule: str) -> str:
    """Whose sweep gives a cell of ``env`` its rate (``--lr-from-sweep``): the setting's own where it has swept
    ``schedule`` (the credit test's secondary arms are swept on ``creditturn-fb``, where they run), else the plain
    config name's (a grid setting such as ``creditchain-d8`` takes ``creditchain``'s). "Has swept" is a choice in
    its ``chosen.json`` or any sweep cell of the schedule, started or finished: a sweep still running there then
    stops the run with "no learning rate chosen" instead of quietly lending it the plain setting's rate."""
    own = out / "sweep" / env
    if env != env_setting(env)[0] and (
            ((own / "chosen.json").exists() and schedule in json.loads((own / "chosen.json").read_text()))
            or any(d.is_dir() for d in (own / schedule).glob("lr*/seed*"))):
        return env
    return env_setting(env)[0]


def code_version() -> str:
    """The commit the cell ran on, with ``+dirty`` when ``src/`` or ``configs/`` had uncommitted changes (recorded
    in each ``summary.json`` as ``code``, so that cells from different code are never read as one grid);
    ``unknown`` outside a git checkout. `run_cell` reads it when the fit starts: read at the end, a commit landing
    mid-cell would be recorded as the cell's code and an edit made mid-cell would mark a clean run dirty."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "configs"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _num(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def summarize(metrics_csv: Path, env: str, schedule: str, seed: int, wall: float, cpu: float, *,
              need_evals: bool = True) -> dict[str, Any]:
    """The cell's curve: training steps (tokens, rollout success) and evaluations (tokens, held-out success)."""
    rows = list(csv.DictReader(metrics_csv.open()))
    steps, evals = [], []
    for r in rows:
        if _num(r.get("perf/generated_tokens_total")) is not None:
            steps.append({"step": int(float(r["step"])) + 1, "tokens": int(float(r["perf/generated_tokens_total"])),
                          "success": _num(r.get("rollout/success")), "reward": _num(r.get("rollout/reward")),
                          "episodes": _num(r.get("rollout/episodes")),
                          "generated_success": _num(r.get("rollout/generated_success")),
                          "generated_episodes": _num(r.get("rollout/generated_episodes")),
                          "seconds": _num(r.get("perf/step_seconds"))})
        if _num(r.get("eval/success")) is not None:
            evals.append({"tokens": int(float(r["eval/generated_tokens"])), "success": _num(r["eval/success"]),
                          "reward": _num(r.get("eval/reward")), "greedy_success": _num(r.get("eval/greedy_success")),
                          "greedy_reward": _num(r.get("eval/greedy_reward")), "episodes": _num(r.get("eval/episodes"))})
    if not steps or (need_evals and not evals):
        raise RuntimeError(f"{metrics_csv}: no evaluations or no steps logged")
    return {"env": env, "schedule": schedule, "seed": seed, "wall_seconds": wall, "cpu_seconds": cpu,
            "train_seconds": sum(s["seconds"] or 0.0 for s in steps), "steps": len(steps),
            "generated_tokens": steps[-1]["tokens"], "evals": evals, "train": steps,
            "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "cpu": cpu_identity()}
