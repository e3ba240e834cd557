"""The learning-rate protocol of the learning benchmark (benchmarks/learning_sweep.py): score, choice, files."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_sweep import (
    binomial_floor,
    cell_score,
    choose,
    chosen_lr,
    late_episodes,
    report_sweep,
    score_error,
    standard_error,
    sweep_dir,
    sweep_lrs,
)


def _summary(successes: list[float], tokens: list[int], episodes: int = 8) -> dict:
    steps = zip(successes, tokens, strict=True)
    return {"train": [{"tokens": t, "success": s, "episodes": episodes} for s, t in steps]}


def test_score_is_the_mean_training_success_past_half_the_budget() -> None:
    # budget 1,600: the steps ending at 900, 1,200 and 1,650 tokens count (> 800); 300 and 800 do not
    cell = _summary([1.0, 1.0, 0.5, 0.25, 0.0], [300, 800, 900, 1200, 1650])
    assert cell_score(cell, 1600) == pytest.approx((0.5 + 0.25 + 0.0) / 3)
    # a first step already past half the budget (one 1,000-token RTPO step): only the last step counts
    assert cell_score(_summary([0.25, 0.75], [1000, 1900]), 1600) == pytest.approx(0.5)


def test_a_step_that_pooled_its_siblings_is_scored_on_every_episode_it_generated() -> None:
    """RTPO's steps record the success over trunks and siblings (``generated_success``); the score and the
    binomial floor's episode count use it. A step without it (other schedules; RTPO cells made before) keeps its
    rollout success. Budget 1,600: the steps ending at 900 and 1,700 tokens are late."""
    def step(tokens: int, trunks: float, pooled: float) -> dict[str, float]:
        return {"tokens": tokens, "success": trunks, "episodes": 2, "generated_success": pooled,
                "generated_episodes": 20}

    rtpo = {"train": [step(300, 1.0, 0.1), step(900, 0.0, 0.25), step(1700, 0.5, 0.45)]}
    assert cell_score(rtpo, 1600) == pytest.approx((0.25 + 0.45) / 2)  # not the trunks' (0.0 + 0.5) / 2
    assert late_episodes(rtpo, 1600) == 40
    old = {"train": [{"tokens": 900, "success": 0.0, "episodes": 2, "generated_success": None},
                     {"tokens": 1700, "success": 0.5, "episodes": 2}]}
    assert cell_score(old, 1600) == pytest.approx(0.25) and late_episodes(old, 1600) == 4


def test_the_best_score_wins_and_a_tie_goes_to_the_smaller_rate() -> None:
    assert choose({5e-6: 0.2, 1e-5: 0.6, 2e-5: 0.4}) == 1e-5
    assert choose({5e-6: 0.5, 1e-5: 0.5, 2e-5: 0.1}) == 5e-6
    assert choose({2e-5: 0.5, 5e-6: 0.5}) == 5e-6


def test_the_smallest_rate_within_one_standard_error_of_the_best_wins() -> None:
    """The FrozenLake RTPO sweep of 2026-12-02: 0.750 at 2e-5 is within 0.792 - 0.077 of 4e-5's score, so 2e-5;
    GRPO's resolved scores keep their best (0.941 is not within 0.986 - 0.014)."""
    scores, errors = {1e-5: 0.438, 2e-5: 0.750, 4e-5: 0.792}, {1e-5: 0.12, 2e-5: 0.129, 4e-5: 0.077}
    assert choose(scores, errors) == 2e-5
    assert choose(scores) == 4e-5  # the best score alone
    assert choose({5e-6: 0.941, 1e-5: 0.986, 2e-5: 0.970}, {5e-6: 0.02, 1e-5: 0.014, 2e-5: 0.015}) == 1e-5
    late = [0.5, 0.75, 0.75, 1.0, 0.75, 1.0]  # the 4e-5 cell's late steps
    assert standard_error(late) == pytest.approx(statistics.stdev(late) / 6**0.5) and standard_error([1.0]) == 0.0


def test_a_perfect_score_keeps_a_binomial_width() -> None:
    """FrozenLake token-PPO's sweep (2026-12-02): 1.000 over 14 late steps of 8 games at 2e-5 has a step standard
    error of 0, so without a floor 0.994 at 5e-6 (one game lost in 176) is outside a zero-width window. Laplace's
    p~ = 113/114 over 112 games gives sqrt(p~(1-p~)/112) = 0.00881, and 5e-6 is within it."""
    assert binomial_floor(1.0, 112) == pytest.approx(((113 / 114) * (1 / 114) / 112) ** 0.5)
    assert binomial_floor(1.0, 112) == pytest.approx(0.00881, abs=1e-5)
    errors = {5e-6: score_error([1.0] * 21 + [0.875], 176), 2e-5: score_error([1.0] * 14, 112)}
    assert errors[2e-5] == pytest.approx(0.00881, abs=1e-5)
    # 5e-6: the floor (p~ = 176/178 over 176 games: 0.00794) is above its steps' error (0.00568)
    assert errors[5e-6] == pytest.approx(((176 / 178) * (2 / 178) / 176) ** 0.5)
    assert errors[5e-6] > standard_error([1.0] * 21 + [0.875])
    assert choose({5e-6: 1 - 1 / 176, 2e-5: 1.0}, errors) == 5e-6
    assert choose({5e-6: 1 - 1 / 176, 2e-5: 1.0}, {5e-6: 0.0057, 2e-5: 0.0}) == 2e-5  # the unfloored rule
    # a resolved difference stays resolved: 0.5 over 800 games is not within 1.000's window
    assert choose({5e-6: 0.5, 2e-5: 1.0}, {5e-6: 0.0, 2e-5: score_error([1.0] * 100, 800)}) == 2e-5
    with pytest.raises(ValueError, match="cell x: a step has no 'episodes'"):
        late_episodes({"train": [{"tokens": 900, "success": 1.0}]}, 1600, "cell x")
    assert late_episodes(_summary([1.0, 0.5, 0.5], [300, 900, 1700], episodes=4), 1600) == 8


def test_report_chooses_per_schedule_from_finished_cells_only(tmp_path: Path) -> None:
    lrs, seeds = [5e-6, 2e-5], [10, 11]
    scores = {("grpo", 5e-6): [0.2, 0.4], ("grpo", 2e-5): [0.6, 0.8], ("rtpo", 5e-6): [0.5, 0.5],
              ("rtpo", 2e-5): [0.0, 1.0]}
    for (schedule, lr), per_seed in scores.items():
        for seed, success in zip(seeds, per_seed, strict=True):
            folder = sweep_dir(tmp_path, "guess", schedule, lr, seed)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps(_summary([0.0, success], [100, 3000])))
    folder = sweep_dir(tmp_path, "guess", "turn_ppo", 5e-6, 10)  # one cell of four: no choice yet
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(_summary([1.0], [4000])))
    schedules = ["grpo", "rtpo", "turn_ppo"]
    chosen = report_sweep(tmp_path, "guess", schedules, dict.fromkeys(schedules, lrs), seeds, budget=4000)
    assert chosen["grpo"]["lr"] == 2e-5 and chosen["grpo"]["scores"] == pytest.approx({"lr5e-06": 0.3, "lr2e-05": 0.7})
    assert chosen["rtpo"]["lr"] == 5e-6  # 0.5 against 0.5: the smaller rate
    assert "turn_ppo" not in chosen
    assert chosen_lr(tmp_path, "guess", "grpo") == 2e-5
    assert "(sweep unfinished)" in (tmp_path / "sweep" / "guess" / "sweep.md").read_text()
    with pytest.raises(SystemExit, match="no learning rate chosen for guess/turn_ppo"):
        chosen_lr(tmp_path, "guess", "turn_ppo")


def test_a_choice_at_the_top_of_its_grid_is_flagged(tmp_path: Path) -> None:
    """The protocol does not widen a grid, so a choice at its largest rate (where the best may lie beyond) says so in
    chosen.json and sweep.md; one inside the grid does not."""
    for lr, success in zip((1e-5, 2e-5, 4e-5), (0.4, 0.6, 0.95), strict=True):
        folder = sweep_dir(tmp_path, "frozenlake", "rtpo", lr, 10)
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(_summary([success] * 6, [900] * 6)))
    chosen = report_sweep(tmp_path, "frozenlake", ["rtpo"], {"rtpo": (1e-5, 2e-5, 4e-5)}, [10], budget=1600)
    assert chosen["rtpo"]["lr"] == 4e-5 and chosen["rtpo"]["at_grid_edge"] is True
    assert "| 4e-05 (top of its grid) |" in (tmp_path / "sweep" / "frozenlake" / "sweep.md").read_text()


def test_a_schedule_is_chosen_on_its_own_grid(tmp_path: Path) -> None:
    """RTPO's grid is the default one doubled (`SCHEDULE_LRS`): its choice needs its three cells, not the default
    grid's; the table's columns are the union, '—' where a schedule has no cell."""
    assert sweep_lrs("rtpo") == (1e-5, 2e-5, 4e-5) and sweep_lrs("grpo") == (5e-6, 1e-5, 2e-5)
    assert sweep_lrs("rtpo", [3e-5]) == (3e-5,)  # --lrs with values: those, for every schedule
    for schedule in ("rtpo", "grpo"):
        for lr, success in zip(sweep_lrs(schedule), (0.2, 0.9, 0.4), strict=True):
            folder = sweep_dir(tmp_path, "guess", schedule, lr, 10)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps(_summary([success], [4000])))
    chosen = report_sweep(tmp_path, "guess", ["rtpo", "grpo"], {s: sweep_lrs(s) for s in ("rtpo", "grpo")}, [10],
                          budget=4000)
    assert chosen["rtpo"]["lr"] == 2e-5 and chosen["grpo"]["lr"] == 1e-5
    assert "at_grid_edge" not in chosen["rtpo"] and "at_grid_edge" not in chosen["grpo"]
    table = (tmp_path / "sweep" / "guess" / "sweep.md").read_text()
    assert "| lr5e-06 | lr1e-05 | lr2e-05 | lr4e-05 |" in table
    # one step of 8 games each: the binomial floor, e.g. 0.9 -> p~ = 8.2/10, sqrt(0.82 * 0.18 / 8) = 0.136
    assert "| rtpo | — | 0.200 ± 0.155 | 0.900 ± 0.136 | 0.400 ± 0.174 | 2e-05 |" in table


def test_a_report_keeps_the_choices_of_schedules_another_runner_swept(tmp_path: Path) -> None:
    """Two runners sweep different schedules of one environment; the one that finishes last used to write a
    chosen.json of its own schedules only, so a reported runner reading it lost the other's choice mid-run."""
    from learning import main, reported_schedules

    for schedule, successes in (("rtpo", (0.2, 0.9, 0.4)), ("grpo", (0.1, 0.2, 0.8))):
        for lr, success in zip(sweep_lrs(schedule), successes, strict=True):
            folder = sweep_dir(tmp_path, "guess", schedule, lr, 10)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps(_summary([success], [4000])))
    assert reported_schedules(tmp_path / "sweep" / "guess", ["grpo"]) == ["rtpo", "grpo"]
    assert reported_schedules(tmp_path / "sweep" / "guess", ["token_ppo"]) == ["rtpo", "grpo", "token_ppo"]
    assert main(["--env", "guess", "--schedules", "grpo", "--lrs", "--report", "--out", str(tmp_path)]) == 0
    assert chosen_lr(tmp_path, "guess", "grpo") == 2e-5 and chosen_lr(tmp_path, "guess", "rtpo") == 2e-5
    assert "| rtpo |" in (tmp_path / "sweep" / "guess" / "sweep.md").read_text()


def test_a_runner_on_one_sweep_seed_keeps_the_choice_pooled_over_every_seed(tmp_path: Path) -> None:
    """One runner per sweep seed: each used to end its cells by rewriting chosen.json as chosen on its own seed,
    replacing the choice pooled over both, which a run with --lr-from-sweep then read. Seed 10 alone prefers 5e-6
    (0.50 against 0.46); pooled with seed 11 (0.30, 0.46) 1e-5 wins (0.46 against 0.40). A third seed with one cell
    of three leaves the schedule unchosen, and --lr-from-sweep says so."""
    from learning import main

    def cells(seed: int, successes: tuple[float, ...]) -> None:
        for lr, success in zip(sweep_lrs("grpo")[:len(successes)], successes, strict=True):
            folder = sweep_dir(tmp_path, "guess", "grpo", lr, seed)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps(_summary([success], [4000], episodes=1000)))

    cells(10, (0.50, 0.46, 0.10))
    cells(11, (0.30, 0.46, 0.10))
    assert main(["--env", "guess", "--schedules", "grpo", "--lrs", "--seeds", "10", "--report",
                 "--out", str(tmp_path)]) == 0
    chosen = json.loads((tmp_path / "sweep" / "guess" / "chosen.json").read_text())
    assert chosen["grpo"]["seeds"] == [10, 11] and chosen["grpo"]["lr"] == 1e-5
    assert chosen["grpo"]["scores"] == pytest.approx({"lr5e-06": 0.40, "lr1e-05": 0.46, "lr2e-05": 0.10})
    cells(12, (0.9,))
    assert main(["--env", "guess", "--schedules", "grpo", "--lrs", "--seeds", "10", "--report",
                 "--out", str(tmp_path)]) == 0
    assert "seeds 10, 11, 12" in (tmp_path / "sweep" / "guess" / "sweep.md").read_text()
    with pytest.raises(SystemExit, match="no learning rate chosen for guess/grpo"):
        chosen_lr(tmp_path, "guess", "grpo")


def test_a_schedule_swept_at_an_extra_seed_leaves_the_others_chosen_over_their_own_seeds(tmp_path: Path) -> None:
    """Seeds on disk count per schedule: token_ppo swept at a third seed must not leave grpo, swept at two, unchosen for
    lacking cells it was never meant to have; each choice records its own seeds, the header shows them all."""
    from learning import main

    def cells(schedule: str, seed: int, successes: tuple[float, ...]) -> None:
        for lr, success in zip(sweep_lrs(schedule), successes, strict=True):
            folder = sweep_dir(tmp_path, "guess", schedule, lr, seed)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps(_summary([success], [4000], episodes=1000)))

    grid = len(sweep_lrs("token_ppo"))
    for seed in (10, 11, 12):
        cells("token_ppo", seed, (0.2,) * (grid - 1) + (0.8,))
    for seed in (10, 11):
        cells("grpo", seed, (0.5,) + (0.1,) * (len(sweep_lrs("grpo")) - 1))
    assert main(["--env", "guess", "--schedules", "grpo", "--lrs", "--seeds", "10", "--report",
                 "--out", str(tmp_path)]) == 0
    chosen = json.loads((tmp_path / "sweep" / "guess" / "chosen.json").read_text())
    assert chosen["grpo"]["seeds"] == [10, 11] and chosen["grpo"]["lr"] == sweep_lrs("grpo")[0]
    assert chosen["token_ppo"]["seeds"] == [10, 11, 12] and chosen["token_ppo"]["lr"] == sweep_lrs("token_ppo")[-1]
    assert "seeds 10, 11, 12 (each schedule over its own seeds on disk)" in (
        tmp_path / "sweep" / "guess" / "sweep.md").read_text()
    # a runner on the extra seed alone asks seed 12 of its own schedule only: grpo keeps its two-seed choice
    assert main(["--env", "guess", "--schedules", "token_ppo", "--lrs", "--seeds", "12", "--report",
                 "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "sweep" / "guess" / "chosen.json").read_text())
    assert again["grpo"]["seeds"] == [10, 11] and again["token_ppo"]["seeds"] == [10, 11, 12]
