"""Shop: the catalogue and instructions are deterministic, rewards follow WebShop's attribute match."""

from __future__ import annotations

import pytest

from agentrl.envs import ShopEnv
from agentrl.envs.shop import make_catalog, match_score


def test_catalog_is_fixed_by_its_seed() -> None:
    assert make_catalog(200, 0) == make_catalog(200, 0)
    assert make_catalog(200, 0) != make_catalog(200, 1)
    assert len({p["id"] for p in ShopEnv().catalog}) == 200


@pytest.mark.parametrize("seed", range(10))
def test_buying_the_perfect_product_gives_one(seed: int) -> None:
    env = ShopEnv()
    obs = env.reset(seed)
    instruction = env.snapshot().instruction
    assert obs.startswith(f"Instruction: {instruction['text']}")
    assert 2 <= len(instruction["attributes"]) <= 3
    perfect = next(p for p in env.catalog if match_score(p, instruction) == 1.0)
    result = env.step(f"search[{instruction['text'].removeprefix('Buy ')}]")
    assert perfect["id"] in result.observation or "No products" not in result.observation
    result = env.step(f"click[{perfect['id'].lower()}]")
    assert perfect["title"] in result.observation and not result.info["format_error"]
    result = env.step("buy")
    assert result.reward == 1.0 and result.terminated and result.info["success"] is True


def test_wrong_product_earns_less() -> None:
    env = ShopEnv()
    env.reset(4)
    instruction = env.snapshot().instruction
    wrong = next(p for p in env.catalog if p["category"] != instruction["category"])
    result = env.step(f"I buy {wrong['id']} now")
    assert 0.0 <= result.reward < 1.0 and result.info["success"] is False
    assert result.reward == pytest.approx(match_score(wrong, instruction))


def test_perfect_search_ranks_the_target_first() -> None:
    env = ShopEnv()
    hits = 0
    for seed in range(30):
        env.reset(seed)
        ins = env.snapshot().instruction
        query = " ".join([ins["category"], *ins["attributes"].values()]) + f" under ${ins['price_cap']}"
        top = env.search(query)
        hits += bool(top) and match_score(top[0], ins) == 1.0
    assert hits >= 27


def test_invalid_ids_and_bare_buy_are_format_errors() -> None:
    env = ShopEnv()
    env.reset(0)
    for action in ("buy", "click[P999]", "click[red shirt]", "search[]"):
        result = env.step(action)
        assert result.info["format_error"] and result.reward == pytest.approx(-0.1)
