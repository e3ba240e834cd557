"""The CreditChain grid report (benchmarks/credit_grid.py): the cue-blind bar and the rows, worked out by hand."""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from credit_grid import (
    ablation_rows,
    collapse_update,
    cue_blind_bar,
    fisher_p,
    fisher_power,
    grid_rows,
    order_contrasts,
    seeds_for_power,
    setting_env,
    sign_flip_p,
    write,
    write_ablation,
)

from agentrl.envs import CreditChainEnv


def seeds_with(env: CreditChainEnv, colours: list[str]) -> list[int]:
    """One seed (from 0 up, unused before) whose single decision's right colour is each of ``colours`` in turn."""
    out: list[int] = []
    for colour in colours:
        out.append(next(s for s in range(10_000) if s not in out and env.right_reply(s, 0) == colour))
    return out


def test_cue_blind_bar_on_one_decision_is_the_share_of_the_commoner_right_colour() -> None:
    env = CreditChainEnv(decisions=1, cues=4)
    assert cue_blind_bar(env, seeds_with(env, ["red", "red", "red", "blue"])) == 0.75
    assert cue_blind_bar(env, seeds_with(env, ["red", "blue", "blue", "red"])) == 0.5
    assert cue_blind_bar(env, seeds_with(env, ["blue"] * 5)) == 1.0


def test_cue_blind_bar_on_three_decisions_is_the_commonest_right_sequence() -> None:
    env = CreditChainEnv(decisions=3, cues=4)
    seeds = list(range(40))
    common = Counter(tuple(env.right_reply(s, j) for j in range(3)) for s in seeds).most_common(1)[0][1]
    assert cue_blind_bar(env, seeds) == common / 40
    assert common / 40 < 0.5  # three decisions: a fixed reply sequence is right for few episodes


def sequences(env: CreditChainEnv, wanted: list[tuple[str, ...]]) -> list[int]:
    """One seed (from 0 up, unused before) whose decisions' right colours are each of ``wanted`` in turn."""
    out: list[int] = []
    for seq in wanted:
        out.append(next(s for s in range(10_000) if s not in out
                        and tuple(env.right_reply(s, j) for j in range(env.decisions)) == seq))
    return out


def test_the_fraction_bar_on_three_decisions_by_hand() -> None:
    env = CreditChainEnv(decisions=3, cues=4)
    r, b = "red", "blue"
    # right sequences rrr, rrb, rbb: the reply r r b is right 2 + 3 + 2 of 9 decisions, no reply more; a whole
    # sequence matches one episode of three at best
    seeds = sequences(env, [(r, r, r), (r, r, b), (r, b, b)])
    assert cue_blind_bar(env, seeds, fraction=True) == pytest.approx(7 / 9)
    assert cue_blind_bar(env, seeds) == pytest.approx(1 / 3)
    # rrr against bbb: every position is right in exactly one of the two, whatever the reply
    seeds = sequences(env, [(r, r, r), (b, b, b)])
    assert cue_blind_bar(env, seeds, fraction=True) == pytest.approx(0.5)
    assert cue_blind_bar(env, seeds) == pytest.approx(0.5)
    one = CreditChainEnv(decisions=1, cues=4)  # with one decision the two bars are one number
    seeds = seeds_with(one, ["red", "red", "blue"])
    assert cue_blind_bar(one, seeds, fraction=True) == cue_blind_bar(one, seeds) == pytest.approx(2 / 3)


def summary(seed: int, base: float, final: float, greedy: float,
            reward: tuple[float, float] | None = None) -> dict[str, Any]:
    base_reward, final_reward = reward or (base, final)
    return {"seed": str(seed), "lr": 1e-05, "cpu_seconds": 120.0 * (seed + 1),
            "evals": [{"tokens": 0, "success": base, "reward": base_reward, "greedy_success": 0.0},
                      {"tokens": 3000, "success": final, "reward": final_reward, "greedy_success": greedy}]}


def test_three_decisions_get_the_decisions_right_table_paired_with_grpo(tmp_path: Path) -> None:
    for schedule, rewards in (("grpo", [0.5, 0.6, 0.7]), ("rtpo", [0.8, 0.6, 0.9])):
        for seed, final in enumerate(rewards):
            cell = tmp_path / "creditchain-m3-d4" / schedule / f"seed{seed}"
            cell.mkdir(parents=True)
            (cell / "summary.json").write_text(json.dumps(summary(seed, 0.0, 0.125, 0.125, (0.4, final))))
    rows = grid_rows(tmp_path, ["creditchain-m3-d4"], ["grpo", "rtpo"], [0, 1, 2])
    rtpo = next(r for r in rows if r["schedule"] == "rtpo")
    assert rtpo["reward_final"]["mean"] == pytest.approx(2.3 / 3)
    assert rtpo["reward_vs_grpo"]["mean"] == pytest.approx((0.3 + 0.0 + 0.2) / 3)
    assert rtpo["reward_above_bar"] == sum(x > rtpo["reward_bar"] for x in (0.8, 0.6, 0.9))
    assert 0.5 < rtpo["reward_bar"] < 0.7 and rtpo["cue_blind_bar"] < 0.5
    table = (write(tmp_path, rows) / "table.md").read_text()
    assert "Decisions right where M > 1" in table and "| creditchain-m3-d4 | rtpo | 3 |" in table
    assert "0.400 → 0.767 ± 0.153 (0.600-0.900)" in table


def test_rows_and_table_from_finished_cells(tmp_path: Path) -> None:
    for seed, (base, final, greedy) in enumerate([(0.5, 0.75, 1.0), (0.5, 0.5, 0.5), (0.625, 1.0, 1.0)]):
        cell = tmp_path / "creditchain-d8" / "grpo" / f"seed{seed}"
        cell.mkdir(parents=True)
        (cell / "summary.json").write_text(json.dumps(summary(seed, base, final, greedy)))
    rows = grid_rows(tmp_path, ["creditchain-d8", "creditchain-d0"], ["grpo", "rtpo"], [0, 1, 2, 3])
    assert len(rows) == 1  # the cells that exist, nothing invented for the rest
    r = rows[0]
    assert (r["distractors"], r["decisions"], r["order"], r["seeds"]) == (8, 1, "decisions_first", [0, 1, 2])
    assert r["final"]["mean"] == pytest.approx(0.75) and r["final"]["sd"] == pytest.approx(0.25)
    assert r["gain"]["mean"] == pytest.approx((0.25 + 0.0 + 0.375) / 3)
    assert (r["final"]["min"], r["final"]["max"]) == (0.5, 1.0)
    assert r["cpu_minutes"]["mean"] == pytest.approx(4.0)
    assert r["versions"] == {"1": 3}  # a summary without a version is version 1
    env = setting_env("creditchain-d8")
    assert env.distractors == 8 and env.cues == 4 and env.context == "full"
    assert r["above_bar"] == sum(f > r["cue_blind_bar"] for f in (0.75, 0.5, 1.0))
    folder = write(tmp_path, rows)
    table = (folder / "table.md").read_text()
    assert "| creditchain-d8 | grpo | 1e-05 | 3 |" in table and "0.750 ± 0.250 (0.500-1.000)" in table
    assert (folder / "success_vs_d.png").stat().st_size > 0


def test_entropy_collapse_is_the_first_update_below_the_floor_and_splits_the_seeds(tmp_path: Path) -> None:
    """Seed 0's entropy goes 0.30, (an evaluation row), 0.10 (not below 0.1), 0.09: it collapsed at the third update
    (logged step 2); seed 1 never falls below; seed 2 has no metrics.csv. Finals 1.0, 0.5, 1.0 against the bar
    (0.625 on these held-out seeds): collapsed 1 of 1 above it, the others 1 of 2."""
    header = "eval/success,step,train/entropy\n"
    metrics = {0: header + ",0,0.30\n0.5,1,\n,1,0.10\n,2,0.09\n,3,0.05\n", 1: header + ",0,0.30\n,1,0.12\n"}
    for seed, final in enumerate([1.0, 0.5, 1.0]):
        cell = tmp_path / "creditchain-d8" / "grpo" / f"seed{seed}"
        cell.mkdir(parents=True)
        (cell / "summary.json").write_text(json.dumps(summary(seed, 0.5, final, final)))
        if seed in metrics:
            (cell / "metrics.csv").write_text(metrics[seed])
    assert collapse_update(tmp_path / "creditchain-d8" / "grpo" / "seed0" / "metrics.csv") == 3
    assert collapse_update(tmp_path / "creditchain-d8" / "grpo" / "seed0" / "metrics.csv", below=0.3) == 2
    (row,) = grid_rows(tmp_path, ["creditchain-d8"], ["grpo"], [0, 1, 2])
    assert row["collapse_update"] == [3, None, None] and 0.5 < row["cue_blind_bar"] < 1.0
    table = (write(tmp_path, [row]) / "table.md").read_text()
    assert "| creditchain-d8 | grpo | s0: 3 → 1.000, s1: — → 0.500, s2: — → 1.000 | 1 of 1 | 1 of 2 |" in table


def test_pairs_with_grpo_are_seed_by_seed_within_one_version_and_rules_keeps_one_version(tmp_path: Path) -> None:
    """Turn-PPO − GRPO by hand: seeds 0 and 1 pair (0.25 and 0.5: mean 0.375, sd 0.177, SE 0.125); seed 2 ran
    Turn-PPO under version 2 and GRPO under version 1, a different seed's episodes, so it is no pair."""
    cells = {("turn_ppo", 0): (1.0, 2), ("turn_ppo", 1): (1.0, 2), ("turn_ppo", 2): (0.0, 2),
             ("grpo", 0): (0.75, 2), ("grpo", 1): (0.5, 2), ("grpo", 2): (1.0, 1)}
    for (schedule, seed), (final, version) in cells.items():
        cell = tmp_path / "creditchain" / schedule / f"seed{seed}"
        cell.mkdir(parents=True)
        (cell / "summary.json").write_text(json.dumps(summary(seed, 0.5, final, final) | {"rules": version}))
    rows = {r["schedule"]: r for r in grid_rows(tmp_path, ["creditchain"], ["turn_ppo", "grpo"], [0, 1, 2])}
    p = rows["turn_ppo"]["vs_grpo"]
    assert p["seeds"] == [0, 1] and p["mean"] == pytest.approx(0.375)
    assert p["sd"] == pytest.approx(0.25 / 2**0.5) and p["se"] == pytest.approx(0.125)
    assert rows["turn_ppo"]["versions"] == {"2": 3} and rows["grpo"]["versions"] == {"1": 1, "2": 2}
    table = (write(tmp_path, list(rows.values()))).joinpath("table.md").read_text()
    assert "| v2×3 |" in table and "| v1×1, v2×2 |" in table and "+0.375 ± 0.125 (2; p = 0.50)" in table
    assert p["p"] == pytest.approx(0.5)  # of the four sign flips of (0.25, 0.5), two reach |sum| 0.75
    v2 = {r["schedule"]: r for r in grid_rows(tmp_path, ["creditchain"], ["turn_ppo", "grpo"], [0, 1, 2], rules=2)}
    assert v2["grpo"]["seeds"] == [0, 1] and v2["turn_ppo"]["vs_grpo"]["seeds"] == [0, 1]
    assert grid_rows(tmp_path, ["creditchain"], ["turn_ppo", "grpo"], [0, 1, 2], rules=3) == []


def test_the_delay_contrast_is_each_seeds_lead_over_grpo_first_minus_last(tmp_path: Path) -> None:
    """Turn-PPO − GRPO by hand: with the decisions first seeds 0, 1 lead by 0.5 and 0.25, with them last by 0.0 and
    0.25: contrasts 0.5 and 0.0, mean 0.25, sd 0.354, SE 0.25; seed 2 lacks its control cell and is left out."""
    finals = {("creditchain-d8", "turn_ppo"): [1.0, 0.75, 1.0], ("creditchain-d8", "grpo"): [0.5, 0.5, 0.5],
              ("creditchain-d8-last", "turn_ppo"): [0.75, 1.0], ("creditchain-d8-last", "grpo"): [0.75, 0.75]}
    for (setting, schedule), values in finals.items():
        for seed, final in enumerate(values):
            cell = tmp_path / setting / schedule / f"seed{seed}"
            cell.mkdir(parents=True)
            (cell / "summary.json").write_text(json.dumps(summary(seed, 0.5, final, final)))
    rows = grid_rows(tmp_path, ["creditchain-d8", "creditchain-d8-last"], ["turn_ppo", "grpo"], [0, 1, 2])
    (c,) = order_contrasts(rows)
    assert (c["first"], c["last"], c["schedule"], c["seeds"]) == ("creditchain-d8", "creditchain-d8-last",
                                                                  "turn_ppo", [0, 1])
    assert c["lead_first"] == pytest.approx(0.375) and c["lead_last"] == pytest.approx(0.125)
    assert c["mean"] == pytest.approx(0.25) and c["se"] == pytest.approx(0.25)
    assert c["p"] == 1.0  # contrasts (0.5, 0.0): every sign flip gives |sum| 0.5
    assert "| creditchain-d8 | creditchain-d8-last | turn_ppo | 2 | +0.375 | +0.125 | +0.250 ± 0.250 | 1.00 |" in (
        write(tmp_path, rows) / "table.md").read_text()


def test_an_ablation_pairs_each_seed_with_the_grid_cells_of_its_setting(tmp_path: Path) -> None:
    """Turn-PPO with one change at seeds 0-2 finals 0.75, 1.0, 0.5 against the grid's Turn-PPO 0.5, 0.5, 0.75
    (differences 0.25, 0.5, -0.25: mean 1/6, sd 0.382, SE 0.220; of the 8 sign flips only the two that give 0
    fall short of |sum| 0.5: p = 6/8) and GRPO 0.5, 0.75 at seeds 0-1 (differences 0.25, 0.25: mean 0.25, sd 0);
    seed 3 of the ablation has no grid cell."""
    grid, abl = tmp_path / "grid", tmp_path / "abl"
    finals = {(grid, "turn_ppo"): [0.5, 0.5, 0.75], (grid, "grpo"): [0.5, 0.75],
              (abl, "turn_ppo"): [0.75, 1.0, 0.5, 1.0]}
    for (root, schedule), values in finals.items():
        for seed, final in enumerate(values):
            cell = root / "creditchain-d8" / schedule / f"seed{seed}"
            cell.mkdir(parents=True)
            (cell / "summary.json").write_text(json.dumps(summary(seed, 0.5, final, final)))
    for seed in range(3):  # another setting's cells are no pair for a D = 8 ablation
        for schedule in ("turn_ppo", "rtpo"):
            cell = grid / "creditchain" / schedule / f"seed{seed}"
            cell.mkdir(parents=True)
            (cell / "summary.json").write_text(json.dumps(summary(seed, 0.5, 1.0, 1.0)))
    (r,) = ablation_rows(grid, abl, ["creditchain-d8", "creditchain"], ["turn_ppo"], [0, 1, 2, 3])
    assert r["seeds"] == [0, 1, 2, 3] and r["final"]["mean"] == pytest.approx(0.8125)
    own, vs_grpo = r["vs"]["turn_ppo"], r["vs"]["grpo"]
    assert own["seeds"] == [0, 1, 2] and own["mean"] == pytest.approx(1 / 6)
    assert own["se"] == pytest.approx(statistics.stdev([0.25, 0.5, -0.25]) / 3**0.5) and own["p"] == 0.75
    assert vs_grpo["seeds"] == [0, 1] and vs_grpo["mean"] == pytest.approx(0.25) and vs_grpo["sd"] == 0.0
    assert set(r["vs"]) == {"turn_ppo", "grpo"}  # the grid's schedules in this setting, nothing invented
    table = write_ablation(abl, [r]).read_text()
    assert "| turn_ppo | 0.583 ± 0.144 | +0.167 ± 0.220 (3; p = 0.75) |" in table
    assert "| grpo | 0.625 ± 0.177 | +0.250 ± 0.000 (2; p = 0.50) |" in table


def test_the_exact_tests_by_hand() -> None:
    # sign flips of (0.1, 0.2, -0.05, 0.3, 0.1): |sum| >= 0.65 only when nothing or the 0.05 is flipped against
    # the rest, either way round: 4 of 32
    assert sign_flip_p([0.1, 0.2, -0.05, 0.3, 0.1]) == pytest.approx(4 / 32)
    assert sign_flip_p([0.156] * 5) == pytest.approx(2 / 32)  # five seeds all one way: never below 0.0625
    assert sign_flip_p([0.0, 0.0]) == 1.0
    # Fisher: 5 of 5 against 0 of 5: the two extreme splits of C(10, 5) = 252 tables, 2 / 252
    assert fisher_p(5, 5, 0, 5) == pytest.approx(2 / 252)
    # 3 of 10 against 1 of 10: splits x = 0..4 of the 4 above-bar seeds, P(x) = C(4,x) C(16,10-x) / C(20,10);
    # every split but x = 2 (the likeliest) is no more likely than x = 3
    probs = [math.comb(4, x) * math.comb(16, 10 - x) / math.comb(20, 10) for x in range(5)]
    assert fisher_p(3, 10, 1, 10) == pytest.approx(sum(probs) - probs[2])
    assert fisher_p(1, 5, 2, 5) == 1.0
    # power at n = 2: only 2 of 2 against 0 of 2 (or the reverse) has p = 1/3 > 0.05: no outcome rejects
    assert fisher_power(1.0, 0.0, 2) == 0.0
    # at n = 4: 4/4 vs 0/4 gives p = 2/70 <= 0.05, so with certain outcomes power is 1
    assert fisher_power(1.0, 0.0, 4) == 1.0 and seeds_for_power(1.0, 0.0) == 4
    assert fisher_power(0.9, 0.4, 17) >= 0.8 > fisher_power(0.9, 0.4, 16)
