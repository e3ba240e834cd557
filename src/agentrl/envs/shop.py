"""A small WebShop-like shopping environment.

Mirrors WebShop (Yao et al., 2022) at toy scale: an instruction names a product by attributes and a price cap,
the agent searches a catalogue, opens product pages and buys one item, and the reward is WebShop's attribute-match
score, the fraction of the instruction's constraints the bought product satisfies (category, 2-3 of colour /
material / size, and the price cap). Departures: 200 generated products instead of 1.1 M scraped ones, no option
selection (each product has one size), keyword scoring instead of a Lucene server, and text pages instead of HTML.

The catalogue is drawn once from ``catalog_seed``; each episode's instruction is drawn from the episode seed by
picking a target product, so a perfect match (reward 1.0) always exists.

Accepted actions (the first one in the reply is used; case-insensitive; ``[..]``, ``(..)`` or ``:`` around the
argument): ``search[keywords]`` (top-5 products by keyword overlap; "under $30" in the query filters by price),
``click[P017]`` (product page), ``buy[P017]`` or a bare ``buy`` (buys the product whose page is open). An unknown
product id, or ``buy`` with no page open, is a format error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from agentrl.envs.base import EpisodeSnapshots, StepResult, format_error

CATEGORIES: dict[str, tuple[tuple[str, ...], int, int]] = {
    # category: (materials, min price, max price)
    "t-shirt": (("cotton", "linen", "polyester"), 8, 40),
    "jeans": (("denim",), 25, 90),
    "jacket": (("leather", "wool", "polyester"), 40, 200),
    "sweater": (("wool", "cotton"), 25, 110),
    "socks": (("cotton", "wool"), 4, 20),
    "dress": (("cotton", "linen", "silk"), 30, 150),
    "hat": (("wool", "cotton"), 10, 45),
    "scarf": (("wool", "silk"), 12, 60),
    "shorts": (("cotton", "linen", "denim"), 15, 55),
}
COLORS = ("red", "blue", "black", "white", "green", "grey", "yellow", "pink", "brown")
SIZES = ("XS", "S", "M", "L", "XL")
BRANDS = ("Norvik", "Altamo", "Kestrel", "Brisa", "Vontel", "Lumo", "Quarry", "Estrid")
ATTRIBUTES = ("color", "material", "size")
_WORD = re.compile(r"[a-z0-9]+")
_ACTION = re.compile(r"\b(search|click|buy)\b(?:\s*(?:\[([^\]\n]*)\]?|\(([^)\n]*)\)?|:\s*([^\n]*)))?", re.I)
_PRODUCT_ID = re.compile(r"\bp\d{3}\b", re.IGNORECASE)
_PRICE_CAP = re.compile(r"(?:under|below|less than|max)\s*\$?\s*(\d+)", re.IGNORECASE)
_RESULTS = 5
_PLURAL = ("jeans", "socks", "shorts")
_SEARCHABLE = ("brand", "color", "material", "category", "size")


def make_catalog(n_products: int, seed: int) -> list[dict[str, Any]]:
    """Draw ``n_products`` products (``id``, ``title``, ``category``, ``color``, ``material``, ``size``,
    ``price``, ``brand``) from ``seed``."""
    rng = np.random.default_rng(seed)
    names = sorted(CATEGORIES)
    products = []
    for i in range(n_products):
        category = names[int(rng.integers(len(names)))]
        materials, low, high = CATEGORIES[category]
        product = {
            "id": f"P{i:03d}",
            "brand": BRANDS[int(rng.integers(len(BRANDS)))],
            "category": category,
            "color": COLORS[int(rng.integers(len(COLORS)))],
            "material": materials[int(rng.integers(len(materials)))],
            "size": SIZES[int(rng.integers(len(SIZES)))],
            "price": int(rng.integers(low, high + 1)),
        }
        product["title"] = f"{product['brand']} {product['color']} {product['category']}"
        products.append(product)
    return products


def make_instruction(catalog: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """Pick a target product with ``seed`` and describe it by category, 2-3 attributes and a price cap."""
    rng = np.random.default_rng(seed)
    target = catalog[int(rng.integers(len(catalog)))]
    n_attrs = int(rng.integers(2, 4))
    attrs = sorted(int(i) for i in rng.choice(len(ATTRIBUTES), size=n_attrs, replace=False))
    wanted = {ATTRIBUTES[i]: target[ATTRIBUTES[i]] for i in attrs}
    cap = int(math.ceil((target["price"] + 1) / 5) * 5)
    words = [wanted.get("color", ""), wanted.get("material", ""), target["category"]]
    article = "" if target["category"] in _PLURAL else "a "
    text = f"Buy {article}" + " ".join(w for w in words if w)
    if "size" in wanted:
        text += f" in size {wanted['size']}"
    text += f" under ${cap}."
    return {"text": text, "category": target["category"], "attributes": wanted, "price_cap": cap}


def match_score(product: dict[str, Any], instruction: dict[str, Any]) -> float:
    """WebShop-style reward: the fraction of constraints (category, attributes, price) that ``product`` meets."""
    checks = [product["category"] == instruction["category"], product["price"] <= instruction["price_cap"]]
    checks += [product[key] == value for key, value in instruction["attributes"].items()]
    return sum(checks) / len(checks)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


@dataclass(frozen=True)
class _Episode:
    instruction: dict[str, Any]
    viewed: str | None = None
    turn: int = 0
    done: bool = False


class ShopEnv(EpisodeSnapshots):
    """Find and buy the product an instruction describes.

    Args:
        n_products: Catalogue size, in [20, 999].
        catalog_seed: Seed of the catalogue (fixed across episodes).
        max_turns: Actions (format errors included) before truncation.
        format_penalty: Reward of an invalid action (should be <= 0).
    """

    episode_type = _Episode

    def __init__(
        self, n_products: int = 200, catalog_seed: int = 0, max_turns: int = 6, format_penalty: float = -0.1
    ) -> None:
        if not 20 <= n_products <= 999:
            raise ValueError(f"n_products must be in [20, 999], got {n_products}")
        if catalog_seed < 0:
            raise ValueError(f"catalog_seed must be >= 0, got {catalog_seed}")
        if not 1 <= max_turns <= 100:
            raise ValueError(f"max_turns must be in [1, 100], got {max_turns}")
        if not -10.0 <= format_penalty <= 0.0:
            raise ValueError(f"format_penalty must be in [-10, 0], got {format_penalty}")
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.catalog = make_catalog(n_products, catalog_seed)
        self.products = {p["id"]: p for p in self.catalog}
        self._tokens = [_words(" ".join(str(p[k]) for k in _SEARCHABLE)) for p in self.catalog]
        self.system_prompt = (
            "You shop in an online store. Buy the product that matches the instruction. "
            "One action per reply:\nsearch[keywords]\nclick[product id] to see a product\n"
            "buy[product id] to buy it\nExample reply: search[red cotton t-shirt]"
        )
        self._episode: _Episode | None = None

    def reset(self, seed: int) -> str:
        """Draw the instruction for ``seed``."""
        instruction = make_instruction(self.catalog, seed)
        self._episode = _Episode(instruction)
        return f"Instruction: {instruction['text']}\nActions: search[keywords], click[id], buy[id]."

    def search(self, query: str) -> list[dict[str, Any]]:
        """Top-5 products sharing the most words with ``query`` (ties by id), price-filtered by "under $N"."""
        words = _words(query)
        cap = _PRICE_CAP.search(query)
        limit = int(cap.group(1)) if cap and len(cap.group(1)) < 7 else None
        scored = []
        for product, tokens in zip(self.catalog, self._tokens, strict=True):
            score = len(words & tokens)
            if score and (limit is None or product["price"] <= limit):
                scored.append((-score, product["id"]))
        return [self.products[pid] for _, pid in sorted(scored)[:_RESULTS]]

    def step(self, action: str) -> StepResult:
        """Apply the first ``search``/``click``/``buy`` action of the reply."""
        episode = self._episode
        if episode is None or episode.done:
            raise RuntimeError("ShopEnv.step called before reset() or after the episode ended")
        turn = episode.turn + 1
        truncated = turn >= self.max_turns
        self._episode = episode = replace(episode, turn=turn, done=truncated)
        verb, arg = self._parse(action)
        if verb == "search" and arg:
            hits = self.search(arg)
            lines = [f"{p['id']}: {p['title']} - ${p['price']}" for p in hits] or ["No products found."]
            return self._ok("\n".join(lines) + "\nNext: click[id], buy[id] or search[keywords].", truncated, verb)
        pid = arg.upper() if arg and _PRODUCT_ID.fullmatch(arg) else None
        if verb == "click" and pid in self.products:
            self._episode = replace(episode, viewed=pid)
            p = self.products[pid]
            page = (
                f"{p['id']}: {p['title']}\ncolor: {p['color']}; material: {p['material']}; size: {p['size']}; "
                f"price: ${p['price']}\nNext: buy, or search[keywords]."
            )
            return self._ok(page, truncated, verb)
        if verb == "buy" and not arg and episode.viewed:
            pid = episode.viewed
        if verb == "buy" and pid in self.products:
            return self._buy(self.products[pid])
        return self._format_error(verb, arg, truncated)

    def _parse(self, action: str) -> tuple[str | None, str]:
        match = _ACTION.search(action[:20_000])
        if match is None:
            return None, ""
        verb = match.group(1).lower()
        arg = next((g for g in match.group(2, 3, 4) if g is not None), None)
        if arg is None and verb in ("click", "buy"):
            rest = action[match.end() : match.end() + 40].split("\n", maxsplit=1)[0]
            found = _PRODUCT_ID.search(rest)
            arg = found.group() if found else ""
        arg = (arg or "").strip().strip("\"'").strip()
        return verb, arg[:200]

    def _ok(self, obs: str, truncated: bool, verb: str) -> StepResult:
        info: dict[str, Any] = {"format_error": False, "action": verb}
        if truncated:
            info["success"] = False
            obs = f"{obs}\nOut of turns."
        return StepResult(obs, 0.0, False, truncated, info)

    def _buy(self, product: dict[str, Any]) -> StepResult:
        episode = self._episode
        if episode is None:  # unreachable: step() checked it
            raise RuntimeError("ShopEnv has no episode")
        score = match_score(product, episode.instruction)
        self._episode = replace(episode, done=True)
        info = {"format_error": False, "action": "buy", "success": score == 1.0, "bought": product["id"]}
        return StepResult(f"You bought {product['id']}: {product['title']}.", score, True, False, info)

    def _format_error(self, verb: str | None, arg: str, truncated: bool) -> StepResult:
        if verb == "buy" and not arg:
            obs = "No product page is open: click[id] a product first, or buy[id]."
        elif verb in ("click", "buy"):
            obs = f"Unknown product id {arg!r}. Use an id from the search results, e.g. click[P017]."
        else:
            obs = "Invalid action. Reply with search[keywords], click[id] or buy[id], e.g. search[red t-shirt]."
        return format_error(obs, self.format_penalty, truncated)
