"""What a FrozenLake learning cell's policy does in each state: move frequencies by lake position, read back from
the MLflow chat traces of its held-out evaluations (sampled, not greedy), per evaluation (base, mid-run, final).

The 2x2 lake has three non-goal positions: (0, 0) the start, where right and down both help; (0, 1) top-right,
where only down wins; (1, 0) bottom-left, where only right wins. A policy that learned the task conditions its move
on the position (down, then right); one that learned a single preferred move repeats it into a wall.

    python benchmarks/frozenlake_moves.py sqlite-file run-name [run-name ...] [--json OUT.json]
    python benchmarks/frozenlake_moves.py --smoke DIR --json OUT.json   # a tiny learning cell's run, tallied

``--smoke DIR`` first runs ``benchmarks/learning.py --smoke --env frozenlake --out DIR`` (one GRPO cell on the tiny
random model, seconds) and tallies its run: it checks that the script reads what the trainer writes.
"""
import argparse
import collections
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

DIRECTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}


def moves(db: str, run_name: str) -> dict[str, dict[tuple[int, int], collections.Counter[str]]]:
    """{evaluation label: {position: Counter of moves}} of the newest run named ``run_name`` in ``db``."""
    con = sqlite3.connect(db)
    found = con.execute("select run_uuid from runs where name=? order by start_time desc", (run_name,)).fetchone()
    if found is None:
        raise SystemExit(f"no run named {run_name!r} in {db}")
    ids = [r[0] for r in con.execute(
        "select request_id from trace_request_metadata where key='mlflow.sourceRun' and value=?", (found[0],))]
    table: dict[str, dict[tuple[int, int], collections.Counter[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(collections.Counter))
    for i in ids:
        tags = dict(con.execute("select key,value from trace_tags where request_id=?", (i,)).fetchall())
        label = tags.get("agentrl.eval")
        if label is None or "greedy" in label:
            continue
        replies = {}
        for name, content in con.execute("select name, content from spans where trace_id=?", (i,)):
            if name.startswith("turn"):
                o = json.loads(json.loads(content)["attributes"].get("mlflow.spanOutputs", "null"))
                replies[int(name.split()[1])] = (o["choices"][0]["message"]["content"].strip().lower()
                                                 if isinstance(o, dict) and o.get("choices") else "")
        pos = (0, 0)
        for k in sorted(replies):
            move = next((w for w in DIRECTIONS if replies[k].startswith(w)), "other")
            table[label.split(" (")[0]][pos][move] += 1
            if move in DIRECTIONS:
                dr, dc = DIRECTIONS[move]
                pos = (min(max(pos[0] + dr, 0), 1), min(max(pos[1] + dc, 0), 1))
    return table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("db", nargs="?", help="the MLflow sqlite file")
    p.add_argument("runs", nargs="*", help="run names")
    p.add_argument("--json", type=Path, default=None, help="write the tallies here too")
    p.add_argument("--smoke", type=Path, default=None, metavar="DIR", help="run a tiny cell into DIR and tally it")
    args = p.parse_args(argv)
    if args.smoke is not None:
        subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "learning.py"), "--smoke", "--env",
                        "frozenlake", "--out", str(args.smoke)], check=True)
        args.db, args.runs = str(args.smoke / "mlflow.db"), ["frozenlake-grpo-seed0"]
    if args.db is None or not args.runs:
        p.error("give the sqlite file and at least one run name (or --smoke DIR)")
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for run_name in args.runs:
        for label, by_pos in moves(args.db, run_name).items():
            for pos in sorted(by_pos):
                c = by_pos[pos]
                n = sum(c.values())
                out.setdefault(run_name, {}).setdefault(label, {})[str(pos)] = dict(c)
                print(f"{run_name:24s} {label:8s} at {pos}: n={n:3d} "
                      + " ".join(f"{w} {c[w] / n:.2f}" for w in ("right", "down", "left", "up", "other")))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
