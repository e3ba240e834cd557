"""GuessNumber: feedback, parsing of the first integer, success on the right number."""

from __future__ import annotations

from agentrl.envs import GuessNumberEnv


def test_binary_search_always_wins_within_budget() -> None:
    env = GuessNumberEnv(low=1, high=30, max_turns=5)
    for seed in range(40):
        env.reset(seed)
        low, high = 1, 30
        while True:
            guess = (low + high) // 2
            result = env.step(f"<answer>{guess}</answer>")
            if result.terminated:
                assert result.reward == 1.0 and result.info["success"] is True
                break
            assert not result.truncated
            if "higher" in result.observation:
                low = guess + 1
            else:
                assert "lower" in result.observation
                high = guess - 1


def test_first_integer_is_the_guess_and_out_of_range_is_a_format_error() -> None:
    env = GuessNumberEnv(low=1, high=10, max_turns=5)
    env.reset(0)
    target = env.snapshot().target
    wrong = 1 if target != 1 else 2
    result = env.step(f"Maybe {wrong}, or {target}")
    assert result.reward == 0.0 and not result.info["format_error"]
    result = env.step("I pick 11")
    assert result.info["format_error"] and result.reward == -0.1
    result = env.step(f"It is {target}.")
    assert result.terminated and result.info["success"]


def test_prompt_example_knob() -> None:
    assert "Example reply: 5" in GuessNumberEnv(prompt_example=True).system_prompt
    assert "Example reply" not in GuessNumberEnv().system_prompt  # measured worse for SmolLM2-135M
