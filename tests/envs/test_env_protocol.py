"""Properties every shipped text environment must have: protocol, determinism, format errors, snapshots."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.envs import (
    CreditChainEnv,
    FrozenLakeEnv,
    GuessNumberEnv,
    SearchQAEnv,
    ShopEnv,
    SnapshotEnv,
    SokobanEnv,
    StepResult,
    TextEnv,
)

FACTORIES: dict[str, Callable[[], Any]] = {
    "guess": lambda: GuessNumberEnv(low=1, high=20, max_turns=6),
    "frozenlake": lambda: FrozenLakeEnv(size=4, holes=3, max_turns=8),
    "frozenlake_slippery": lambda: FrozenLakeEnv(size=4, holes=2, slippery=True, max_turns=8),
    "sokoban": lambda: SokobanEnv(width=6, height=6, boxes=1),
    "sokoban_2boxes": lambda: SokobanEnv(width=7, height=7, boxes=2),
    "searchqa": lambda: SearchQAEnv(reward="f1"),
    "shop": lambda: ShopEnv(n_products=200),
    "creditchain": lambda: CreditChainEnv(decisions=2, distractors=3, noise=0.5),
    "creditchain_last": lambda: CreditChainEnv(decisions=1, distractors=2, order="decisions_last", context="full"),
}

GARBAGE = [
    "",
    " ",
    "\n\n\t",
    "asdf qwerty zxcv",
    "I am not sure what to do here.",
    "x" * 100_000,
    "🙂🙃 ☃ \x00\x01",
    '{"name": "move", "arguments": {"dir": "north"}}',
    '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
    '<tool_call>{"nme": "x"}</tool_call>',
    "<tool_call>not json at all</tool_call>",
    "[]{}()::",
]


def valid_action(name: str, rng: random.Random) -> str:
    """A random action the named environment accepts (it may still be a bad move)."""
    if name == "guess":
        return f"My guess is {rng.randint(1, 20)}"
    if name.startswith("frozenlake"):
        return f"I go {rng.choice(['left', 'Down', 'RIGHT', 'up'])}."
    if name.startswith("sokoban"):
        return rng.choice(["Up", "down", "Left", "right"])
    if name.startswith("creditchain"):
        return rng.choice(["red", "I pick Blue.", "BLUE"])
    if name == "searchqa":
        return rng.choice(["search[founder of a company]", "search: town river", "answer[Lake Foo]"])
    return rng.choice(["search[red cotton t-shirt]", "click[P017]", "click[P101]", "buy[P005]", "buy"])


def play(env: Any, seed: int, actions: list[str]) -> list[tuple[str, float, bool, bool, bool]]:
    """Reset with ``seed`` and apply ``actions`` until the episode ends; a comparable transcript."""
    out = [(env.reset(seed), 0.0, False, False, False)]
    for action in actions:
        r = env.step(action)
        out.append((r.observation, r.reward, r.terminated, r.truncated, bool(r.info.get("success"))))
        if r.terminated or r.truncated:
            break
    return out


def core(snapshot: Any) -> dict[str, Any]:
    """The parts of a snapshot a format error must not change (the turn counter, a per-turn log and RNG may)."""
    return {k: v for k, v in vars(snapshot).items() if k not in ("turn", "turn_log", "rng")}


@pytest.fixture(params=sorted(FACTORIES))
def named_env(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, FACTORIES[request.param]()


def test_implements_protocol(named_env: tuple[str, Any]) -> None:
    _, env = named_env
    assert isinstance(env, TextEnv)
    assert isinstance(env, SnapshotEnv)
    assert isinstance(env.system_prompt, str) and 100 < len(env.system_prompt) < 600  # short: a 135M model reads it
    assert isinstance(env.max_turns, int) and env.max_turns >= 1


@pytest.mark.parametrize("seed", [0, 1, 17])
def test_deterministic_for_a_seed(named_env: tuple[str, Any], seed: int) -> None:
    name, env = named_env
    rng = random.Random(seed)
    actions = [valid_action(name, rng) for _ in range(env.max_turns)]
    first = play(env, seed, actions)
    assert play(env, seed, actions) == first  # same instance
    assert play(FACTORIES[name](), seed, actions) == first  # fresh instance


def test_seeds_give_different_episodes(named_env: tuple[str, Any]) -> None:
    _, env = named_env
    # the hidden state counts too: GuessNumber's first observation is the same for every target
    starts = {(env.reset(seed), repr(core(env.snapshot()))) for seed in range(20)}
    assert len(starts) >= 5


@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_malformed_action_is_penalised_not_raised(named_env: tuple[str, Any], garbage: str) -> None:
    _, env = named_env
    env.reset(3)
    before = env.snapshot()
    result = env.step(garbage)
    assert isinstance(result, StepResult)
    assert result.reward == pytest.approx(env.format_penalty)
    assert result.info["format_error"] is True
    assert not result.terminated
    assert "e.g." in result.observation or "one word" in result.observation
    assert core(env.snapshot()) == core(before)


def test_garbage_until_truncation(named_env: tuple[str, Any]) -> None:
    _, env = named_env
    env.reset(0)
    for turn in range(1, env.max_turns + 1):
        result = env.step("nothing useful")
        assert result.truncated == (turn == env.max_turns)
    assert result.info["success"] is False
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("nothing useful")


def test_step_before_reset_raises(named_env: tuple[str, Any]) -> None:
    _, env = named_env
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("up")


def test_success_is_set_on_the_last_step(named_env: tuple[str, Any]) -> None:
    name, env = named_env
    rng = random.Random(5)
    for seed in range(5):
        env.reset(seed)
        for _ in range(env.max_turns):
            result = env.step(valid_action(name, rng))
            if result.terminated or result.truncated:
                assert isinstance(result.info["success"], bool)
                break
            assert "success" not in result.info
        else:
            pytest.fail("the episode did not end within max_turns")


@pytest.mark.parametrize("split", [0, 1, 2])
def test_snapshot_restore_gives_identical_continuations(named_env: tuple[str, Any], split: int) -> None:
    name, env = named_env
    rng = random.Random(split)
    actions = [valid_action(name, rng) for _ in range(env.max_turns)]
    for seed in range(11, 40):  # the first episode still running at the split point
        env.reset(seed)
        if not any(env.step(action).terminated for action in actions[:split]):
            break
    state = env.snapshot()
    runs = []
    for _ in range(2):
        env.restore(state)
        run = []
        for action in actions[split:]:
            r = env.step(action)
            run.append((r.observation, r.reward, r.terminated, r.truncated, json.dumps(r.info, sort_keys=True)))
            if r.terminated or r.truncated:
                break
        runs.append(run)
    assert runs[0] == runs[1]


def test_restore_rejects_foreign_state(named_env: tuple[str, Any]) -> None:
    _, env = named_env
    with pytest.raises(TypeError, match="snapshot"):
        env.restore(object())


@pytest.mark.parametrize(
    ("factory", "argument"),
    [
        (lambda: GuessNumberEnv(low=5, high=5), "high"),
        (lambda: GuessNumberEnv(max_turns=0), "max_turns"),
        (lambda: FrozenLakeEnv(size=1), "size"),
        (lambda: FrozenLakeEnv(size=3, holes=5), "holes"),
        (lambda: FrozenLakeEnv(format_penalty=0.5), "format_penalty"),
        (lambda: SokobanEnv(boxes=3), "boxes"),
        (lambda: SokobanEnv(width=4), "width"),
        (lambda: SearchQAEnv(reward="bleu"), "reward"),
        (lambda: SearchQAEnv(hops=3), "hops"),
        (lambda: SearchQAEnv(top_k=0), "top_k"),
        (lambda: ShopEnv(n_products=5), "n_products"),
        (lambda: ShopEnv(max_turns=0), "max_turns"),
    ],
)
def test_invalid_config_names_the_argument(factory: Callable[[], Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        factory()
