"""Progress inside a step (issue 30): the run's progress channel (`StepProgress`), its one-line description, the
throttled status line, and a real fit whose log shows the phases in the order the step runs them."""

from __future__ import annotations

import io
import re

import lightning.pytorch as pl
import pytest

from agentrl.runview import StepPhase, StepProgress
from agentrl.training.command.progress import RunProgress, StatusLine, describe
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.update.settings import PPOSettings
from tests.training.helpers import letter_data, make_module


def test_describe_names_the_phase_and_its_counts() -> None:
    collecting = StepPhase("collecting", since=100.0, episodes=8, done=3, running=4, tokens=812)
    assert describe(collecting, 112.4) == "collecting: 3/8 episodes done, 4 in flight, 812 tokens (0:00:12)"
    rtpo = StepPhase("updating", since=0.0, depth=(1, 3), epoch=(2, 2), minibatch=(3, 4))
    assert describe(rtpo, 65.0) == "RTPO depth k=1 (2/3) · updating: epoch 2/2, minibatch 3/4 (0:01:05)"
    assert describe(StepPhase("scoring", since=0.0), 2.0) == "scoring (0:00:02)"
    failing = StepPhase("collecting", since=0.0, episodes=16, done=16, failed=12, tokens=900)
    assert describe(failing, 1.0) == "collecting: 4/16 episodes done, 12 failed, 0 in flight, 900 tokens (0:00:01)"
    assert describe(StepPhase(), 5.0) == ""


def test_the_channel_counts_episodes_and_restores_the_interrupted_phase() -> None:
    progress, seen = StepProgress(), []
    progress.listen(lambda: seen.append(progress.snapshot()))
    progress.rtpo_depth(2, 3)
    with progress.phase("updating"):
        progress.minibatch(1, 1, 1, 2)
        with progress.phase("scoring"):
            assert progress.snapshot().kind == "scoring" and progress.snapshot().depth == (2, 3)
        assert progress.snapshot().minibatch == (1, 2)  # the update's own state is back
    with progress.phase("collecting"):
        progress.episodes_expected(2)
        progress.episode_started()
        progress.episode_started()
        progress.episode_finished(7)
        now = progress.snapshot()
        assert (now.episodes, now.done, now.running, now.tokens) == (2, 1, 1, 7)
    assert progress.snapshot().kind is None and progress.snapshot().episodes == 0
    assert [p.kind for p in seen].count("scoring") == 1 and seen[-1].kind is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _status(tty: bool) -> tuple[StatusLine, io.StringIO, Clock, list[StepPhase]]:
    out, clock, phase = io.StringIO(), Clock(), [StepPhase()]
    return StatusLine(lambda: phase[0], out, tty=tty, delay=5.0, every=10.0, clock=clock), out, clock, phase


def test_plain_lines_wait_for_a_slow_phase_and_are_throttled() -> None:
    status, out, clock, phase = _status(tty=False)
    phase[0] = StepPhase("collecting", since=0.0, episodes=4)
    for t in (0.0, 1.0, 4.9):  # a phase that ends before `delay` prints nothing
        clock.now = t
        status.refresh()
    assert out.getvalue() == ""
    for t in (5.0, 6.0, 9.0, 14.9, 15.0, 15.5):
        clock.now = t
        status.refresh()
    assert out.getvalue().splitlines() == ["collecting: 0/4 episodes done, 0 in flight, 0 tokens (0:00:05)",
                                           "collecting: 0/4 episodes done, 0 in flight, 0 tokens (0:00:15)"]
    phase[0] = StepPhase("updating", since=15.5)
    clock.now = 21.0  # the new phase has lasted 5.5 s but the last line is only 6 s old
    status.refresh()
    clock.now = 25.0
    status.refresh()
    assert out.getvalue().splitlines()[-1] == "updating (0:00:10)" and len(out.getvalue().splitlines()) == 3
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_terminal_redraws_one_line_and_clears_it_for_other_output() -> None:
    status, out, clock, phase = _status(tty=True)
    phase[0] = StepPhase("evaluating", since=0.0, episodes=2)
    status.refresh()
    clock.now = 1.0
    phase[0] = StepPhase("evaluating", since=0.0, episodes=2, done=1, running=1, tokens=5)
    status.refresh()
    status.line("[agentrl] base evaluation ...")
    phase[0] = StepPhase()
    status.refresh()  # nothing drawn: nothing to clear
    assert out.getvalue() == ("\revaluating: 0/2 episodes done, 0 in flight, 0 tokens (0:00:00)\x1b[K"
                              "\revaluating: 1/2 episodes done, 1 in flight, 5 tokens (0:00:01)\x1b[K"
                              "\r\x1b[K[agentrl] base evaluation ...\n")


PHASE = re.compile(r"^  (?:step (\d)/2 · )?(?:RTPO depth k=(\d) \(\d/\d\) · )?"
                   r"(collecting|scoring|updating|evaluating)", re.M)


def test_a_fit_logs_each_phase_of_its_steps_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    """A real fit (tiny model, RTPO, 2 steps, base and final evaluation) with the status delays at 0: its
    (non-TTY) output holds each phase, in the order a step runs them, between the step lines."""
    module = make_module(RTPO(group_size=2, max_depth=2, ppo=PPOSettings(epochs=2, minibatch_size=1)))
    data = letter_data(batch_size=2, steps=2, eval_episodes=2)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, callbacks=[RunProgress(status_delay=0.0, status_every=0.0)])
    trainer.fit(module, datamodule=data)
    out = capsys.readouterr().out
    assert "\r" not in out  # captured output is not a terminal
    seen: list[tuple[str, str, str]] = []
    for step, k, kind in PHASE.findall(out):
        if not seen or seen[-1] != (step, k, kind):
            seen.append((step, k, kind))
    rtpo_step = lambda s: [(s, "", "collecting"), (s, "1", "collecting"), (s, "1", "updating"),  # noqa: E731
                           (s, "0", "collecting"), (s, "0", "updating")]
    assert seen == [("", "", "evaluating"), *rtpo_step("1"), *rtpo_step("2"), ("", "", "evaluating")], out
    assert out.index("base evaluation") < out.index("  step 1/2 ·") < out.index("\nstep 1/2  reward")
    assert re.search(r"collecting: 2/2 episodes done, 0 in flight, [1-9]\d* tokens", out), out
    assert re.search(r"updating: epoch 2/2, minibatch \d/\d", out), out
    assert module.step_progress.snapshot() == StepPhase()  # every phase closed


def test_eta_follows_the_token_budget_when_it_ends_the_run_first() -> None:
    from agentrl.training.command.progress import eta_seconds

    # 33 steps of 1,000 in 1,650 s (50 s a step) and 1,451 of a 1,600-token budget: 149 tokens at 1,650/1,451 s each
    assert eta_seconds(1650.0, 33, 967, 1451.0, 149.0) == pytest.approx(1650.0 / 1451.0 * 149.0)
    assert eta_seconds(1650.0, 33, 967) == pytest.approx(50.0 * 967)  # no budget: by steps
    assert eta_seconds(100.0, 2, 1, 10.0, 1000.0) == pytest.approx(50.0)  # the steps end the run first
    assert eta_seconds(100.0, 0, 5, 0.0, 100.0) == pytest.approx(500.0)  # nothing measured yet: by steps
    assert eta_seconds(100.0, 4, 0, 50.0, -3.0) == 0.0  # a budget overshot by the last step
