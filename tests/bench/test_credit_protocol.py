"""The turn-level credit test's protocol (configs/learning/creditturn.yaml and its two Turn-PPO arms): the arms
differ in λ only, the held-out set is balanced per cue, the feedback knob is a setting."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_cells import CONFIGS, SCHEDULE_FILES, env_setting, overrides, settings_digest

from agentrl.envs import CreditChainEnv

ARMS = ("turn_ppo_lam05", "turn_ppo_lam1")


def _arm(name: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIGS / "schedules" / f"{name}.yaml").read_text())


def test_feedback_is_a_setting_of_the_credit_test() -> None:
    assert env_setting("creditturn") == ("creditturn", {})
    assert env_setting("creditturn-fb") == ("creditturn", {"feedback": True})
    assert env_setting("creditchain-d4-fb") == ("creditchain", {"distractors": 4, "feedback": True})


def test_the_arms_differ_in_lambda_only_and_share_tasks_per_step(tmp_path: Path) -> None:
    assert set(ARMS) <= set(SCHEDULE_FILES)
    a, b = _arm(ARMS[0]), _arm(ARMS[1])
    init_a, init_b = a["model"]["algorithm"]["init_args"], b["model"]["algorithm"]["init_args"]
    assert (init_a.pop("lam"), init_b.pop("lam")) == (0.5, 1.0)
    assert init_a == init_b and a["data"] == b["data"]
    assert init_a["gamma"] == 1.0 and init_a["whiten_equal_returns"] is False
    assert a["data"]["batch_size"] // init_a["group_size"] == 4 and init_a["group_size"] == 2  # 4 tasks x 2
    assert settings_digest("creditturn", ARMS[0], []) != settings_digest("creditturn", ARMS[1], [])
    cell = overrides("creditturn-fb", ARMS[0], 3, tmp_path, "sqlite:///x.db", tmp_path)
    assert cell["data"]["agent"]["init_args"]["env"]["init_args"] == {"feedback": True}
    assert "optim" not in cell["model"]  # one rate for both arms: the env config's


def test_the_decoupled_arm_differs_from_lambda_05_in_the_critics_lambda_only() -> None:
    """The follow-up arm: λ 0.5 for the policy, the λ 1 arm's Monte Carlo targets for the critic."""
    dec, half = _arm("turn_ppo_lam05_dec"), _arm("turn_ppo_lam05")
    init_dec, init_half = dec["model"]["algorithm"]["init_args"], half["model"]["algorithm"]["init_args"]
    assert init_dec.pop("critic_lam") == 1.0 and "critic_lam" not in init_half
    assert init_dec == init_half and dec["data"] == half["data"]


def test_the_held_out_set_is_balanced_per_cue_and_noise_free() -> None:
    config = yaml.safe_load((CONFIGS / "creditturn.yaml").read_text())
    env = CreditChainEnv(**config["data"]["agent"]["init_args"]["env"]["init_args"])
    assert (env.decisions, env.distractors, env.noise, env.order) == (3, 2, 0.3, "decisions_first")
    n = config["data"]["eval_episodes"]
    assert n == 48
    seeds = [1_000_000 + i for i in range(n)]  # the datamodule's held-out tasks (SeedTasks offset 10^6)
    blind = {w: sum(env.right_reply(s, j) == w for s in seeds for j in range(3)) / (3 * n) for w in env.words}
    assert blind == {"red": 0.5, "blue": 0.5}
    assert env.heldout_seed is not None and all(s >= env.heldout_seed for s in seeds)
    assert max(range(2000)) < env.heldout_seed  # training seeds (task i is seed i) never reach it


def _cell(out: Path, setting: str, arm: str, seed: int, reward: float) -> None:
    folder = out / setting / arm / f"seed{seed}"
    folder.mkdir(parents=True)
    evals = [{"reward": 0.5, "greedy_reward": 0.5, "success": 0.1, "greedy_success": 0.1},
             {"reward": reward, "greedy_reward": reward, "success": reward / 2, "greedy_success": 0.0}]
    (folder / "summary.json").write_text(json.dumps({"evals": evals}))


def test_the_did_table_by_hand(tmp_path: Path) -> None:
    from credit_protocol import sign_flip_p, table

    # seed 0: on (0.9 − 0.6) − off (0.55 − 0.5) = 0.25; seed 1: (0.8 − 0.7) − (0.6 − 0.5) = 0.0;
    # seed 2: (0.7 − 0.5) − (0.5 − 0.6) = 0.3; seed 3 lacks a cell and is left out
    finals = {0: (0.9, 0.6, 0.55, 0.5), 1: (0.8, 0.7, 0.6, 0.5), 2: (0.7, 0.5, 0.5, 0.6), 3: (0.9, 0.5, 0.5, None)}
    for seed, (on5, on1, off5, off1) in finals.items():
        for setting, arm, value in (("creditturn-fb", "turn_ppo_lam05", on5), ("creditturn-fb", "turn_ppo_lam1", on1),
                                    ("creditturn", "turn_ppo_lam05", off5), ("creditturn", "turn_ppo_lam1", off1)):
            if value is not None:
                _cell(tmp_path, setting, arm, seed, value)
    res = table(tmp_path, range(4))
    assert res["complete_seeds"] == [0, 1, 2] and len(res["finished_cells"]) == 15
    row = res["metrics"]["decisions_right"]
    assert row["did_per_seed"] == pytest.approx([0.25, 0.0, 0.3])
    assert row["did"] == pytest.approx(0.55 / 3)
    # sign flips of (0.25, 0, 0.3): |mean| >= 0.55/3 only for all + and all − (the 0 flips freely): 4 of 8
    assert row["sign_flip_p"] == pytest.approx(0.5)
    assert res["metrics"]["all_right"]["did"] == pytest.approx(0.55 / 6)
    assert sign_flip_p([1.0] * 8) == pytest.approx(2 / 256)


def test_the_secondary_arms_are_paired_by_seed_against_turn_ppo_with_feedback_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from credit_protocol import SECONDARY, print_secondary, secondary

    assert set(SECONDARY.values()) <= set(SCHEDULE_FILES)  # every arm has its schedule file
    # GRPO 0.8 on seeds 0-2; Turn-PPO λ 0.5 (feedback on) 0.7, 0.6, 0.5 and 0.9 on seed 3, which GRPO lacks:
    # differences 0.1, 0.2, 0.3 (mean 0.2, sd 0.1, SE 0.1/√3; sign flips: only all + and all − reach |mean| 0.2,
    # p = 2/8; 95 % t-interval 0.2 ± t(0.975, 2 df) 4.3027 · 0.1/√3 = 0.2 ± 0.2484). λ 1 has seeds 1 and 2 only
    # (0.9, 0.4): differences −0.1, +0.4, mean 0.15, SE 0.25, p = 1, interval 0.15 ± 12.7062 · 0.25.
    # Feedback-off cells (λ 0.5 at 0.0, a GRPO one at 0.0) must not be read.
    for seed, value in enumerate((0.8, 0.8, 0.8)):
        _cell(tmp_path, "creditturn-fb", "grpo_credit", seed, value)
    for seed, value in enumerate((0.7, 0.6, 0.5, 0.9)):
        _cell(tmp_path, "creditturn-fb", "turn_ppo_lam05", seed, value)
        _cell(tmp_path, "creditturn", "turn_ppo_lam05", seed, 0.0)
    for seed, value in ((1, 0.9), (2, 0.4)):
        _cell(tmp_path, "creditturn-fb", "turn_ppo_lam1", seed, value)
    _cell(tmp_path, "creditturn", "grpo_credit", 0, 0.0)
    res = secondary(tmp_path, range(4))
    grpo = res["GRPO"]
    assert grpo["finished_seeds"] == [0, 1, 2]
    r = grpo["vs"]["Turn-PPO λ 0.5"]["decisions_right"]
    assert r["seeds"] == [0, 1, 2] and r["diff_per_seed"] == pytest.approx([0.1, 0.2, 0.3])
    assert (r["arm"], r["reference"], r["diff"]) == pytest.approx((0.8, 0.6, 0.2))
    assert r["se"] == pytest.approx(0.1 / 3 ** 0.5) and r["sign_flip_p"] == pytest.approx(0.25)
    assert r["ci95"] == pytest.approx((0.2 - 0.24841, 0.2 + 0.24841), abs=1e-4)
    r1 = grpo["vs"]["Turn-PPO λ 1"]["decisions_right_greedy"]
    assert r1["seeds"] == [1, 2] and r1["diff_per_seed"] == pytest.approx([-0.1, 0.4])
    assert (r1["diff"], r1["se"], r1["sign_flip_p"]) == pytest.approx((0.15, 0.25, 1.0))
    assert r1["ci95"] == pytest.approx((0.15 - 3.17655, 0.15 + 3.17655), abs=1e-4)
    assert grpo["vs"]["Turn-PPO λ 0.5"]["all_right"]["diff"] == pytest.approx(0.1)  # success = reward / 2
    assert res["RTPO"]["finished_seeds"] == [] and res["RTPO"]["vs"]["Turn-PPO λ 1"]["decisions_right"]["diff"] is None
    print_secondary(res)
    out = capsys.readouterr().out
    assert ("GRPO vs Turn-PPO λ 0.5: decisions_right 0.800 vs 0.600: +0.200 ± 0.058 (p 0.250, 3 seeds, "
            "95 % CI -0.048 to +0.448)") in out
    assert "RTPO vs Turn-PPO λ 0.5: decisions_right: no shared seed" in out


def test_a_setting_swept_on_its_own_gives_its_rate_and_a_sweep_keeps_every_schedule_file(tmp_path: Path) -> None:
    from learning import reported_schedules
    from learning_cells import sweep_setting
    from learning_sweep import chosen_lr

    own = tmp_path / "sweep" / "creditturn-fb"
    own.mkdir(parents=True)
    (own / "chosen.json").write_text(json.dumps({"grpo_credit": {"lr": 1e-5}}))
    assert sweep_setting(tmp_path, "creditturn-fb", "grpo_credit") == "creditturn-fb"
    assert sweep_setting(tmp_path, "creditturn-fb", "turn_ppo_v0") == "creditturn"  # not swept there
    assert sweep_setting(tmp_path, "creditchain-d8", "grpo") == "creditchain"
    # a sweep under way on the setting (its first cell started, no choice yet): its own, so that the run stops
    cell = own / "turn_ppo_v0" / "lr1e-05" / "seed10"
    cell.mkdir(parents=True)
    assert sweep_setting(tmp_path, "creditturn-fb", "turn_ppo_v0") == "creditturn-fb"
    with pytest.raises(SystemExit, match="no learning rate chosen for creditturn-fb/turn_ppo_v0"):
        chosen_lr(tmp_path, "creditturn-fb", "turn_ppo_v0")
    shutil.rmtree(own / "turn_ppo_v0")
    for name in ("grpo_credit", "turn_ppo_v0", "notes"):  # two arms swept earlier, and a folder that is none
        (own / name).mkdir()
    assert reported_schedules(own, ["token_ppo_credit"]) == ["token_ppo_credit", "grpo_credit", "turn_ppo_v0"]
    assert reported_schedules(own, ["grpo"]) == ["grpo", "grpo_credit", "turn_ppo_v0"]


def test_the_secondary_arms_take_the_primary_arms_tasks_and_episodes_a_step() -> None:
    primary = _arm("turn_ppo_lam05")
    steps = {"token_ppo_credit": 2, "turn_ppo_v0": 2, "grpo_credit": 2, "rtpo_credit": 2}  # episodes (trunks) a task
    for name, per_task in steps.items():
        arm = _arm(name)
        init = arm["model"]["algorithm"]["init_args"]
        got = init["trunks_per_task"] if name == "rtpo_credit" else init["group_size"]
        assert got == per_task and arm["data"]["batch_size"] == primary["data"]["batch_size"] == 8, name
        assert init["ppo"]["minibatches"] == 2 and init["ppo"]["epochs"] == 1, name
        assert "optim" not in arm.get("model", {}), f"{name}: its rate comes from its sweep, not its file"
    v0 = _arm("turn_ppo_v0")["model"]["algorithm"]["init_args"]
    assert (v0["zero_critic"], v0["gamma"], v0["lam"], v0["value_warmup_epochs"]) == (True, 1.0, 1.0, 0)
    rtpo = _arm("rtpo_credit")["model"]["algorithm"]["init_args"]
    fair = _arm("rtpo_fair")["model"]["algorithm"]["init_args"]
    assert (rtpo["max_depth"], rtpo["group_size"], rtpo["ppo"]["lr_reference_samples"]) == (
        fair["max_depth"], fair["group_size"], None)


def test_the_per_seed_table_marks_collapsed_cells_by_their_late_entropy(tmp_path: Path) -> None:
    from credit_protocol import late_entropy, markdown

    # seed 0: all four cells; on (0.9 − 0.6) − off (0.5 − 0.8) = +0.6. Seed 1: one cell, no DiD.
    for setting, arm, value in (("creditturn-fb", "turn_ppo_lam05", 0.9), ("creditturn-fb", "turn_ppo_lam1", 0.6),
                                ("creditturn", "turn_ppo_lam05", 0.5), ("creditturn", "turn_ppo_lam1", 0.8)):
        _cell(tmp_path, setting, arm, 0, value)
    _cell(tmp_path, "creditturn", "turn_ppo_lam1", 1, 0.7)
    # feedback off, λ 0.5, seed 0: 8 logged steps (and an eval-only row), last quarter 0.01 and 0.02: mean 0.015,
    # collapsed; feedback on, λ 1: last quarter 0.03, 0.01: mean 0.02, not below the threshold
    def metrics(setting: str, arm: str, entropies: list[float]) -> None:
        rows = ["step,train/entropy,eval/reward", "0,,0.5"] + [f"{i},{e}," for i, e in enumerate(entropies)]
        (tmp_path / setting / arm / "seed0" / "metrics.csv").write_text("\n".join(rows) + "\n")
    metrics("creditturn", "turn_ppo_lam05", [0.3, 0.2, 0.2, 0.1, 0.1, 0.05, 0.01, 0.02])
    metrics("creditturn-fb", "turn_ppo_lam1", [0.3, 0.2, 0.2, 0.1, 0.1, 0.05, 0.03, 0.01])
    assert late_entropy(tmp_path, "creditturn", "turn_ppo_lam05", 0) == pytest.approx(0.015)
    assert late_entropy(tmp_path, "creditturn", "turn_ppo_lam1", 0) is None  # no metrics.csv
    lines = markdown(tmp_path, range(3)).splitlines()
    assert lines[2] == "| 0 | 0.500 (0.500) † | 0.800 (0.800) | 0.900 (0.900) | 0.600 (0.600) | +0.600 |"
    assert lines[3] == "| 1 | — | 0.700 (0.700) | — | — | — |"
    assert lines[4] == "| collapsed † | 1 | 0 | 0 | 0 | |" and len(lines) == 5  # seed 2 has no cell: no row


def test_the_secondary_table_shows_the_feedback_on_arms_seed_by_seed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from credit_protocol import main, secondary_markdown

    def cell(setting: str, arm: str, seed: int, sampled: float, greedy: float) -> None:
        folder = tmp_path / setting / arm / f"seed{seed}"
        folder.mkdir(parents=True)
        last = {"reward": sampled, "greedy_reward": greedy, "success": 0.0, "greedy_success": 0.0}
        evals = [{"reward": 0.1, "greedy_reward": 0.2}, last]
        (folder / "summary.json").write_text(json.dumps({"evals": evals}))

    # seed 0: both references, token-PPO, GRPO (collapsed: the last quarter of 4 steps is 0.01) and RTPO;
    # V = 0 on seeds 0-2 (0.1, 0.2, 0.9: mean 0.4, median 0.2); a feedback-off cell at seed 3, where no feedback-on
    # cell exists, must not be shown
    for arm, sampled, greedy in (("turn_ppo_lam05", 0.9, 0.95), ("turn_ppo_lam1", 0.6, 0.65),
                                 ("token_ppo_credit", 0.7, 0.75), ("grpo_credit", 0.5, 0.55),
                                 ("rtpo_credit", 0.3, 0.35)):
        cell("creditturn-fb", arm, 0, sampled, greedy)
    for seed, sampled in enumerate((0.1, 0.2, 0.9)):
        cell("creditturn-fb", "turn_ppo_v0", seed, sampled, 1.0 - sampled)
    cell("creditturn", "grpo_credit", 3, 0.0, 0.0)
    rows = ["step,train/entropy", "0,0.4", "1,0.3", "2,0.2", "3,0.01"]
    (tmp_path / "creditturn-fb" / "grpo_credit" / "seed0" / "metrics.csv").write_text("\n".join(rows) + "\n")
    lines = secondary_markdown(tmp_path, range(4)).splitlines()
    assert lines[0] == ("| seed (creditturn-fb) | Turn-PPO λ 0.5 | Turn-PPO λ 1 | token-PPO | Turn-PPO V = 0 | GRPO "
                        "| RTPO |")
    assert lines[2] == ("| 0 | 0.900 (0.950) | 0.600 (0.650) | 0.700 (0.750) | 0.100 (0.900) | 0.500 (0.550) † "
                        "| 0.300 (0.350) |")
    assert lines[3] == "| 1 | — | — | — | 0.200 (0.800) | — | — |"
    assert lines[4] == "| 2 | — | — | — | 0.900 (0.100) | — | — |"
    assert lines[5] == "| mean (seeds) | 0.900 (1) | 0.600 (1) | 0.700 (1) | 0.400 (3) | 0.500 (1) | 0.300 (1) |"
    assert lines[6] == "| collapsed † | 0 | 0 | 0 | 0 | 1 | 0 |" and len(lines) == 7  # seed 3: no feedback-on cell
    main(["--out", str(tmp_path), "--markdown"])
    out = capsys.readouterr().out
    assert "\n".join(lines) in out
    # against λ 1 (0.6, greedy 0.65) on the one shared seed: V = 0 0.1 − 0.6, greedy 0.9 − 0.65; no SE, no interval
    assert "| Turn-PPO V = 0 | -0.500 | 1.000 | — | +0.250 | 1 |" in out
    assert "| token-PPO | +0.100 | 1.000 | — | +0.100 | 1 |" in out


def test_the_follow_up_arm_takes_the_place_of_lambda_05_against_the_same_lambda_1(tmp_path: Path) -> None:
    from credit_protocol import markdown, table

    # λ 1: on 0.6, off 0.8; coupled λ 0.5: on 0.5, off 0.5 (DiD +0.2); decoupled: on 0.9, off 0.6 (DiD +0.5)
    cells = {"turn_ppo_lam1": (0.6, 0.8), "turn_ppo_lam05": (0.5, 0.5), "turn_ppo_lam05_dec": (0.9, 0.6)}
    for arm, (on, off) in cells.items():
        _cell(tmp_path, "creditturn-fb", arm, 0, on)
        _cell(tmp_path, "creditturn", arm, 0, off)
    assert table(tmp_path, range(1))["metrics"]["decisions_right"]["did"] == pytest.approx(0.2)
    res = table(tmp_path, range(1), half="turn_ppo_lam05_dec")
    assert res["metrics"]["decisions_right"]["did"] == pytest.approx(0.5) and res["half_arm"] == "turn_ppo_lam05_dec"
    lines = markdown(tmp_path, range(1), half="turn_ppo_lam05_dec").splitlines()
    assert "feedback on, λ 0.5 (turn_ppo_lam05_dec)" in lines[0]
    assert lines[2] == "| 0 | 0.600 (0.600) | 0.800 (0.800) | 0.900 (0.900) | 0.600 (0.600) | +0.500 |"


def two_cues() -> tuple[str, str, str, str, str, str]:
    """Two cues of the credit test's rule, each with its right and its wrong colour: (a, b, right a, right b, wrong a,
    wrong b)."""
    rule = dict(CreditChainEnv(**yaml.safe_load((CONFIGS / "creditturn.yaml").read_text())["data"]["agent"][
        "init_args"]["env"]["init_args"]).rule)
    a, b = sorted(rule)[:2]
    ra, rb = rule[a], rule[b]
    return a, b, ra, rb, ({"red", "blue"} - {ra}).pop(), ({"red", "blue"} - {rb}).pop()


def test_the_value_gap_by_hand() -> None:
    """V(s_{n+1}) after right and after wrong decisions, split by step, judged by a CreditChain environment whose
    rule is read off it. Early (steps < 10): right decisions are followed by 0.6 and 0.8 (mean 0.7), wrong ones by
    0.2 and 0.4 (0.3): gap 0.4, SE √(0.02/2 + 0.02/2) = √0.02. A decision whose next turn was not traced is
    skipped; a distractor (no cue) is not a decision; a reply naming no colour is a format error, not a decision;
    "I say Red." names red. Late: one right only, so no gap."""
    from credit_value_gap import Turn, env_judge, value_gap

    judge = env_judge()
    a, b, ra, rb, wa, wb = two_cues()
    episodes = [
        (0, [Turn(0, a, f"I say {ra.title()}.", 0.1), Turn(1, b, wb, 0.6), Turn(2, None, "blue", 0.2)]),
        (5, [Turn(0, b, rb, 0.0), Turn(1, None, "red", 0.8), Turn(3, a, wa, 0.9)]),
        (7, [Turn(0, a, "green", 0.0), Turn(1, a, wa, 0.7), Turn(2, None, "red", 0.4)]),
        (10, [Turn(0, a, ra, 0.0), Turn(1, None, "red", 0.5), Turn(2, b, wb, 0.5)]),
    ]
    res = value_gap(episodes, judge, split=10)
    early = res["early"]
    assert (early["n_right"], early["n_wrong"]) == (2, 2)
    assert (early["v_right"], early["v_wrong"], early["gap"]) == pytest.approx((0.7, 0.3, 0.4))
    assert early["se"] == pytest.approx(0.02 ** 0.5)
    assert res["late"]["n_right"] == 1 and res["late"]["gap"] is None


def test_the_credit_on_decisions_by_hand() -> None:
    """The advantage each decision was trained with against its outcome. Early (steps < 10): right decisions
    trained with +1.0 and +0.5, wrong ones with -0.5 and 0.0, so the mean advantage is 0.75 for right, -0.25 for
    wrong, the correlation (worked below) is 1/√1.25, and 1 within each cue; a format error ("green") is not a
    decision, but its |A| counts as a cue turn's; a turn with no traced advantage is left out. |A| on cue turns
    1 + 0.5 + 0.5 + 0 + 0.25 (the format error) = 2.25 of 2.25 + 0.75 (distractors) = 3.0: share 0.75. Late: one
    decision only, so no correlation; its share 0.2 / (0.2 + 0.8)."""
    from credit_value_gap import Turn, credit_signal, env_judge

    judge = env_judge()
    a, b, ra, rb, wa, wb = two_cues()
    episodes = [
        (0, [Turn(0, a, ra, 0.0, 1.0), Turn(1, b, wb, 0.0, -0.5), Turn(2, None, "blue", 0.0, 0.5)]),
        (5, [Turn(0, b, rb, 0.0, 0.5), Turn(1, a, "green", 0.0, -0.25), Turn(2, a, wa, 0.0, 0.0),
             Turn(3, None, "red", 0.0, -0.25), Turn(4, b, rb, 0.0)]),
        (10, [Turn(0, a, ra, 0.0, 0.2), Turn(1, None, "red", 0.0, -0.8)]),
    ]
    res = credit_signal(episodes, judge, split=10)
    early, late = res["early"], res["late"]
    assert (early["n_right"], early["n_wrong"]) == (2, 2)
    assert (early["a_right"], early["a_wrong"]) == pytest.approx((0.75, -0.25))
    # Pearson by hand: x = (1, -0.5, 0.5, 0), mean 0.25, deviations (0.75, -0.75, 0.25, -0.25): Σd² = 1.25;
    # y = (1, 0, 1, 0), deviations ±0.5: Σe² = 1; Σde = 0.375 + 0.375 + 0.125 + 0.125 = 1.0; r = 1 / √1.25
    assert early["corr"] == pytest.approx(1 / 1.25 ** 0.5)
    # within each cue: cue a had +1.0 (right) and 0.0 (wrong), cue b -0.5 (wrong) and +0.5 (right): less their
    # cue's means, (0.5, -0.5, -0.5, 0.5) against (0.5, -0.5, -0.5, 0.5) for the rightness: r = 1, SE 0
    assert early["corr_within_cue"] == pytest.approx(1.0) and early["corr_se"] == pytest.approx(0.0)
    assert early["decision_share"] == pytest.approx(2.25 / 3.0)
    assert late["corr"] is None and late["decision_share"] == pytest.approx(0.2)
