"""CreditChain grid settings of the learning benchmark (benchmarks/learning_cells.py `env_setting`, cell overrides)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning import keep_checkpoint
from learning_cells import cell_folder, env_name, env_setting, kept_name, overrides, scratch_folder


def test_a_setting_name_gives_the_config_and_the_env_knobs() -> None:
    assert env_setting("creditchain") == ("creditchain", {})
    assert env_setting("frozenlake") == ("frozenlake", {})
    assert env_setting("creditchain-m3-d4-last-n0.5") == (
        "creditchain", {"decisions": 3, "distractors": 4, "order": "decisions_last", "noise": 0.5})
    assert env_setting("creditchain-d8-first") == ("creditchain", {"distractors": 8, "order": "decisions_first"})


@pytest.mark.parametrize(("name", "message"), [
    ("creditchain-x8", "'x8' is not a setting"), ("creditchain-d4.5", "'d4.5' is not a setting"),
    ("creditchain-middle", "'middle' is not a setting"),
    ("frozenlake-d4", "settings apply to creditchain and creditturn only"),
])
def test_bad_setting_names_are_refused_naming_the_part(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        env_setting(name)
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        env_name(name)


def test_unknown_config_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"no configs/learning/sokoban.yaml \(known: .*creditchain"):
        env_name("sokoban")
    assert env_name("creditchain-d8-last") == "creditchain-d8-last"


def test_cell_overrides_carry_the_knobs_and_rtpo_trains_every_depth_on_creditchain(tmp_path: Path) -> None:
    cell = overrides("creditchain-d8-last", "rtpo", 3, tmp_path, "sqlite:///x.db", tmp_path)
    assert cell["data"]["agent"] == {"init_args": {"env": {"init_args": {"distractors": 8,
                                                                         "order": "decisions_last"}}}}
    assert cell["data"]["seed"] == 3 and cell["model"]["seed"] == 3  # the merge keeps the cell's own keys
    assert cell["model"]["algorithm"] == {"init_args": {"max_depth": None}}
    plain = overrides("frozenlake", "rtpo", 0, tmp_path, "sqlite:///x.db", tmp_path)
    assert "agent" not in plain["data"] and "algorithm" not in plain["model"]


def test_an_ablation_cell_has_its_own_scratch_and_says_what_it_changed(tmp_path: Path) -> None:
    grid, ablation = tmp_path / "learning", tmp_path / "learning" / "ablations" / "lam1"
    cells = [cell_folder(out, "creditchain", "turn_ppo", 0, None, False) for out in (grid, ablation)]
    assert cells[0].relative_to(grid) == cells[1].relative_to(ablation)  # the same cell name under both
    scratches = {scratch_folder(tmp_path / "scratch", out, cell)
                 for out, cell in zip((grid, ablation), cells, strict=True)}
    assert len(scratches) == 2 and all(s.is_relative_to(tmp_path / "scratch") for s in scratches)
    assert scratch_folder(tmp_path / "scratch", grid, cells[0]) in scratches  # the same --out: the same folder
    extra = ["--model.algorithm.init_args.lam=1.0"]
    tags = overrides("creditchain", "turn_ppo", 0, cells[1], "sqlite:///x.db", tmp_path, extra)[
        "trainer"]["logger"][1]["init_args"]["tags"]
    assert tags["extra"] == "--model.algorithm.init_args.lam=1.0"
    plain = overrides("creditchain", "turn_ppo", 0, cells[0], "sqlite:///x.db", tmp_path)
    assert "extra" not in plain["trainer"]["logger"][1]["init_args"]["tags"]


@pytest.mark.parametrize("schedule", ["grpo", "turn_ppo", "token_ppo"])
def test_whole_episode_schedules_take_two_minibatches_by_count_on_creditchain(schedule: str, tmp_path: Path) -> None:
    """A CreditChain row is a turn (summary context): two minibatches whatever D, not one per 4 turns."""
    for env in ("creditchain", "creditchain-d8-last"):
        cell = overrides(env, schedule, 0, tmp_path, "sqlite:///x.db", tmp_path)
        assert cell["model"]["algorithm"] == {"init_args": {"ppo": {"minibatch_size": None, "minibatches": 2}}}
        assert cell["model"]["seed"] == 0
    for env in ("frozenlake", "guess"):  # a row is an episode there: the schedule file's size stands
        assert "algorithm" not in overrides(env, schedule, 0, tmp_path, "sqlite:///x.db", tmp_path)["model"]


def current(lr: float, source: str) -> str:
    """A finished cell's summary under today's `CELL_RULES`."""
    from learning_cells import CELL_RULES

    return json.dumps({"lr": lr, "lr_source": source, "rules": CELL_RULES})


def test_a_cell_asked_for_at_the_chosen_lr_is_not_an_earlier_run_at_another(tmp_path: Path) -> None:
    from learning_cells import finished

    assert not finished(tmp_path, 1e-5, False)  # no summary
    (tmp_path / "summary.json").write_text(current(2e-05, "config"))
    assert finished(tmp_path, None, False)  # a plain run takes any finished cell
    assert not finished(tmp_path, 2e-5, False)  # the first benchmark's cell, at the configs' lr
    (tmp_path / "summary.json").write_text(current(1e-05, "chosen by the sweep"))
    assert finished(tmp_path, 1e-5, False) and not finished(tmp_path, 2e-5, False)
    assert finished(tmp_path, 5e-6, True)  # a sweep cell's folder is per lr already


def test_a_given_lr_is_its_own_source(tmp_path: Path) -> None:
    """An ablation at ``--lr`` is not the protocol's cell at the same rate, nor the reverse; --lr goes alone."""
    import argparse

    from learning import lr_conflict, lr_source
    from learning_cells import finished

    (tmp_path / "summary.json").write_text(current(2e-05, "chosen by the sweep"))
    assert finished(tmp_path, 2e-5, False) and not finished(tmp_path, 2e-5, False, source="given")
    (tmp_path / "summary.json").write_text(current(2e-05, "given"))
    assert finished(tmp_path, 2e-5, False, source="given") and not finished(tmp_path, 2e-5, False)
    given = argparse.Namespace(lr=2e-5, lr_from_sweep=False)
    assert lr_source(given, False) == "given" and lr_conflict(given, False) is None
    assert lr_source(argparse.Namespace(lr=None, lr_from_sweep=True), False) == "chosen by the sweep"
    assert lr_conflict(argparse.Namespace(lr=2e-5, lr_from_sweep=True), False) is not None
    assert lr_conflict(given, True) is not None


def test_a_cell_of_older_rules_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import learning_cells
    from learning_cells import finished

    monkeypatch.setattr(learning_cells, "CELL_RULES", 1)
    (tmp_path / "summary.json").write_text('{"lr": 1e-05, "lr_source": "chosen by the sweep"}')  # no record: 1
    assert finished(tmp_path, 1e-5, False) and finished(tmp_path, None, False) and finished(tmp_path, 1e-5, True)
    monkeypatch.setattr(learning_cells, "CELL_RULES", 2)  # a fix that makes earlier cells not comparable
    assert not finished(tmp_path, 1e-5, False) and not finished(tmp_path, None, False)
    assert not finished(tmp_path, 1e-5, True)
    (tmp_path / "summary.json").write_text('{"lr": 1e-05, "lr_source": "chosen by the sweep", "rules": 2}')
    assert finished(tmp_path, 1e-5, False)


def test_a_cell_of_changed_settings_runs_again(tmp_path: Path) -> None:
    """RTPO's group size changed in its schedule config: its cells rerun, the other schedules' do not; a summary
    from before the digest was recorded counts as current."""
    from learning_cells import CELL_RULES, finished, settings_digest

    rtpo, grpo = settings_digest("frozenlake", "rtpo", []), settings_digest("frozenlake", "grpo", [])
    knobs = settings_digest("creditchain-m3", "rtpo", [])  # an env's knobs are the cell's overrides, not settings
    assert rtpo != grpo and knobs == settings_digest("creditchain", "rtpo", [])
    g5 = settings_digest("frozenlake", "rtpo", ["--model.algorithm.init_args.group_size", "5"])
    assert g5 != rtpo
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"rules": CELL_RULES, "settings": rtpo}))
    assert finished(tmp_path, None, False, rtpo) and not finished(tmp_path, None, False, g5)
    summary.write_text(json.dumps({"rules": CELL_RULES}))
    assert finished(tmp_path, None, False, g5)


def test_a_cell_records_the_commit_it_ran_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import learning_cells

    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=learning_cells.ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert learning_cells.code_version().removesuffix("+dirty") == head
    monkeypatch.setattr(learning_cells, "ROOT", tmp_path)  # not a git checkout
    assert learning_cells.code_version() == "unknown"


def test_a_cell_records_the_code_its_fit_started_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit to ``src/`` landing while a cell's fit runs (the next change, made while cells run) is not the
    cell's code: the summary records the clean commit the fit started on, not ``+dirty``; likewise the warm-up
    model's weights it started from, made again (another machine's bits) while it ran."""
    import learning
    import learning_cells

    warm = tmp_path / "warmup"
    warm.mkdir()
    (warm / "model.safetensors").write_bytes(b"weights made with 2 threads")
    monkeypatch.setitem(learning_cells.WARMUPS, "creditchain", (["format_warmup.py"], warm, {}))
    started_from = learning_cells.warmup_digest("creditchain")
    assert started_from is not None and learning_cells.warmup_digest("guess") is None  # guess has no warm-up

    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "policy.py").write_text("LR = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for step in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "clean"]):
        subprocess.run(git + step, check=True)
    monkeypatch.setattr(learning_cells, "ROOT", repo)
    clean = learning_cells.code_version()
    assert clean and not clean.endswith("+dirty")
    real_run = subprocess.run

    def fit_meanwhile_src_is_edited(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if cmd[1:4] != ["-m", "agentrl", "fit"]:
            return real_run(cmd, **kw)  # type: ignore[call-overload]
        folder = Path(json.loads(Path(cmd[-1]).read_text())["trainer"]["logger"][0]["init_args"]["save_dir"])
        (folder / "metrics.csv").write_text("step,perf/generated_tokens_total,eval/success,eval/greedy_success,"
                                            "eval/generated_tokens\n0,,0.5,0.5,0\n0,100,,,\n1,,0.75,1.0,100\n")
        (repo / "src" / "policy.py").write_text("LR = 2\n")  # the edit, made while the fit runs
        (warm / "model.safetensors").write_bytes(b"weights made with 1 thread")  # and a new warm-up
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(learning.subprocess, "run", fit_meanwhile_src_is_edited)
    args = argparse.Namespace(out=tmp_path / "out", extra=[], tracking_uri="sqlite:///x.db", scratch=tmp_path / "s",
                              cell_timeout=60.0, keep_checkpoints=None, lr=None)
    summary = learning.run_cell("creditchain", "grpo", 0, args)
    assert summary is not None and summary["evals"][-1]["success"] == 0.75
    assert learning_cells.code_version() == clean + "+dirty"  # the edit is there now
    assert summary["code"] == clean
    assert summary["warmup"] == started_from != learning_cells.warmup_digest("creditchain")


def test_keep_checkpoint_moves_the_final_checkpoint_out_of_the_scratch_folder(tmp_path: Path) -> None:
    scratch, keep = tmp_path / "scratch", tmp_path / "keep"
    assert keep_checkpoint(scratch, keep, "creditchain-d8/turn_ppo/seed0") is None  # no checkpoint: nothing kept
    (scratch / "checkpoints").mkdir(parents=True)
    (scratch / "checkpoints" / "last.ckpt").write_bytes(b"policy and critic")
    assert keep_checkpoint(scratch, None, "creditchain-d8/turn_ppo/seed0") is None  # not asked: left in place
    assert (scratch / "checkpoints" / "last.ckpt").exists()
    kept = keep_checkpoint(scratch, keep, "creditchain-d8/turn_ppo/seed0")
    assert kept == keep / "creditchain-d8" / "turn_ppo" / "seed0.ckpt"
    assert kept.read_bytes() == b"policy and critic" and not (scratch / "checkpoints" / "last.ckpt").exists()


def test_an_ablations_kept_checkpoint_does_not_overwrite_its_grid_namesakes(tmp_path: Path) -> None:
    import learning_cells

    grid, name = learning_cells.ROOT / "benchmarks" / "results" / "learning", "creditchain-d8/turn_ppo/seed0"
    names = {kept_name(out, name) for out in (grid, grid / "ablations" / "lam1", tmp_path / "lam1", tmp_path / "b")}
    assert kept_name(grid, name) == name  # the grid's own cells keep the documented layout
    assert kept_name(grid / "ablations" / "lam1", name) == "ablations/lam1/" + name
    assert len(names) == 4 and all(n.endswith(name) for n in names)


def _cell(seed: int, final: float) -> dict[str, Any]:
    evals = [{"tokens": 0, "success": 0.5, "greedy_success": 0.5}, {"tokens": 3000, "success": final,
                                                                      "greedy_success": final}]
    return {"seed": seed, "evals": evals, "train": [{"tokens": 3000, "success": final}], "wall_seconds": 60.0,
            "cpu_seconds": 60.0, "steps": 4, "generated_tokens": 3000}


def test_a_report_covers_every_finished_seed_not_only_the_runners_own(tmp_path: Path) -> None:
    """Two runners on seeds 0-1 and 2-4 of one setting each ended by writing the setting's table of their own seeds:
    the table left behind was whichever finished last, partial."""
    from learning import main, reported_seeds

    for schedule, seeds in (("grpo", (0, 1, 2, 3, 4)), ("rtpo", (0, 7))):
        for k in seeds:
            (tmp_path / "guess" / schedule / f"seed{k}").mkdir(parents=True)
            (tmp_path / "guess" / schedule / f"seed{k}" / "summary.json").write_text(json.dumps(_cell(k, 0.25 * k)))
    (tmp_path / "guess" / "grpo" / "seed9").mkdir()  # an unfinished cell: no summary.json
    assert reported_seeds(tmp_path / "guess", ["grpo"], [0, 1]) == [0, 1, 2, 3, 4]
    assert reported_seeds(tmp_path / "guess", ["grpo", "rtpo"], [5]) == [0, 1, 2, 3, 4, 5, 7]
    assert main(["--env", "guess", "--schedules", "grpo", "--seeds", "0", "1", "--report", "--out", str(tmp_path)]) == 0
    rows = {r["schedule"]: r for r in json.loads((tmp_path / "guess" / "table.json").read_text())}
    assert rows["grpo"]["seeds"] == [0, 1, 2, 3, 4] and rows["rtpo"]["seeds"] == [0, 7]
    assert rows["grpo"]["final_success"][0] == pytest.approx(0.5)  # (0 + 0.25 + 0.5 + 0.75 + 1) / 5


def test_rtpo_fair_run_has_the_papers_depth_cap_and_trunks_and_no_rate_factor(tmp_path: Path) -> None:
    """RTPO's fair run (configs/learning/schedules/rtpo_fair.yaml): K <= 3 and 2-4 trunks per task, kept on
    CreditChain (the every-depth override is the grid's `rtpo` alone), no informative-sibling rate factor, two
    tasks a step and the grid's 3,000-token budget; the grid's `rtpo` keeps the factor its committed cells ran with."""
    import yaml
    from learning_cells import CONFIGS, config_value

    cell = overrides("creditchain-d8", "rtpo_fair", 0, tmp_path, "sqlite:///x.db", tmp_path)
    assert "algorithm" not in cell["model"]
    fair = yaml.safe_load((CONFIGS / "schedules" / "rtpo_fair.yaml").read_text())
    init = fair["model"]["algorithm"]["init_args"]
    assert init["max_depth"] <= 3 and 2 <= init["trunks_per_task"] <= 4
    assert init["ppo"]["lr_reference_samples"] is None
    assert fair["data"]["batch_size"] == 2 * init["trunks_per_task"]  # data.batch_size counts trunks
    assert config_value("creditchain", "rtpo_fair", "data", "max_generated_tokens") == 3000
    assert config_value("creditchain", "rtpo", "model", "algorithm", "init_args", "ppo")["lr_reference_samples"] == 16
