"""Generate the SearchQA corpus and questions shipped in ``src/agentrl/envs/data/``.

Every entity is invented (people, towns, companies, rivers, lakes, mountains with made-up names), so a model
cannot answer from memory and must search. The world is drawn once from ``random.Random(--seed)``; rerunning the
script with the same seed rewrites byte-identical files.

Writes:
    searchqa_corpus.jsonl: one document per line, ``{"id", "title", "text"}``.
    searchqa_questions.jsonl: one question per line, ``{"id", "question", "answer", "hops", "docs"}`` where
        ``hops`` is 1 or 2 and ``docs`` lists the ids of the gold documents in reasoning order.

Usage::

    python scripts/make_searchqa_data.py            # writes into src/agentrl/envs/data/
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

ONSETS = [
    "b",
    "br",
    "c",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "qu",
    "r",
    "s",
    "t",
    "th",
    "tr",
    "v",
    "w",
    "z",
]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "y"]
CODAS = ["", "", "l", "n", "r", "s", "th", "v", "m", "nd", "rk", "st"]
TOWN_ENDS = ["holm", "ford", "wick", "by", "stead", "mere", "dale", "ton", "gate", "burgh"]
FIRST_NAMES = [
    "Orin",
    "Maelis",
    "Tovan",
    "Ysolde",
    "Bram",
    "Ilsa",
    "Corwin",
    "Neska",
    "Dariel",
    "Fenna",
    "Joris",
    "Liesl",
    "Alvar",
    "Rhosyn",
    "Teodor",
    "Wynne",
    "Kasimir",
    "Elowen",
    "Pavo",
    "Seren",
    "Ansel",
    "Mirela",
    "Hollis",
    "Brisa",
    "Emeric",
    "Odile",
    "Lucan",
    "Tamsin",
    "Ivo",
    "Greta",
]
PROFESSIONS = [
    "clockmaker",
    "weaver",
    "engineer",
    "botanist",
    "sailor",
    "baker",
    "glassblower",
    "carpenter",
    "cartographer",
    "potter",
    "brewer",
    "teacher",
    "chemist",
    "blacksmith",
    "architect",
    "painter",
]
PRODUCTS = [
    "hand tools",
    "glassware",
    "woollen blankets",
    "bicycles",
    "wall clocks",
    "writing paper",
    "ceramic tiles",
    "rope",
    "oil lamps",
    "leather boots",
    "pianos",
    "fishing nets",
    "sewing machines",
    "copper kettles",
    "telescopes",
    "candles",
]
COMPANY_SUFFIXES = ["Works", "Company", "Industries", "Group", "Trading", "Manufacturing"]
SPECIALTIES = [
    "cheese",
    "apple orchards",
    "stone bridges",
    "a spring festival",
    "its old mill",
    "wool markets",
    "a clock tower",
    "salt mines",
    "horse fairs",
    "a lighthouse",
    "plum brandy",
    "a glass museum",
]

N_REGIONS, N_MOUNTAINS, N_LAKES, N_RIVERS, N_TOWNS, N_PEOPLE, N_COMPANIES = 6, 10, 8, 16, 40, 75, 45
N_ONE_HOP, N_TWO_HOP = 100, 100


@dataclass
class World:
    """Every invented entity with its attributes (indices point into the other lists)."""

    regions: list[str] = field(default_factory=list)
    mountains: list[dict] = field(default_factory=list)
    lakes: list[dict] = field(default_factory=list)
    rivers: list[dict] = field(default_factory=list)
    towns: list[dict] = field(default_factory=list)
    people: list[dict] = field(default_factory=list)
    companies: list[dict] = field(default_factory=list)


class Names:
    """Unique invented names built from syllables."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def syllable(self) -> str:
        return self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS)

    def make(self, build: str) -> str:
        while True:
            if build == "town":
                name = self.syllable() + self.rng.choice(TOWN_ENDS)
            elif build == "short":
                name = self.syllable() + self.syllable()
            else:
                name = self.syllable() + self.syllable() + self.rng.choice(["", "a", "o", "en", "is"])
            name = name.capitalize()
            word = name.lower()
            if 4 <= len(word) <= 11 and word not in self.used:
                self.used.add(word)
                return name


def build_world(rng: random.Random) -> World:
    """Draw every entity and link them (rivers to lakes, towns to rivers, people to towns, ...)."""
    names, w = Names(rng), World()
    w.regions = [names.make("short") for _ in range(N_REGIONS)]
    for _ in range(N_MOUNTAINS):
        w.mountains.append(
            {
                "name": f"Mount {names.make('short')}",
                "height": rng.randrange(900, 4200, 10),
                "region": rng.randrange(N_REGIONS),
            }
        )
    for _ in range(N_LAKES):
        w.lakes.append(
            {"name": f"Lake {names.make('short')}", "area": rng.randrange(12, 900), "region": rng.randrange(N_REGIONS)}
        )
    for _ in range(N_RIVERS):
        w.rivers.append(
            {
                "name": names.make("long"),
                "mountain": rng.randrange(N_MOUNTAINS),
                "lake": rng.randrange(N_LAKES),
                "length": rng.randrange(40, 700),
            }
        )
    for _ in range(N_TOWNS):
        w.towns.append(
            {
                "name": names.make("town"),
                "river": rng.randrange(N_RIVERS),
                "region": rng.randrange(N_REGIONS),
                "specialty": rng.choice(SPECIALTIES),
                "population": rng.randrange(800, 90000, 10),
            }
        )
    for _ in range(N_PEOPLE):
        first = rng.choice(FIRST_NAMES)
        w.people.append(
            {
                "name": f"{first} {names.make('long')}",
                "town": rng.randrange(N_TOWNS),
                "year": rng.randrange(1820, 1960),
                "profession": rng.choice(PROFESSIONS),
                "he": rng.choice(["He", "She"]),
                "founded": [],
            }
        )
    founders = rng.sample(range(N_PEOPLE), N_COMPANIES)
    for i in range(N_COMPANIES):
        person = w.people[founders[i]]
        company = {
            "name": f"{names.make('long')} {rng.choice(COMPANY_SUFFIXES)}",
            "founder": founders[i],
            "town": rng.randrange(N_TOWNS),
            "product": rng.choice(PRODUCTS),
            "year": person["year"] + rng.randrange(22, 50),
        }
        person["founded"].append(i)
        w.companies.append(company)
    return w


def documents(w: World) -> list[dict]:
    """One short document per entity; ids are ``<kind>-<index>``."""
    docs = []
    for i, m in enumerate(w.mountains):
        text = f"{m['name']} is a mountain {m['height']} metres high in the {w.regions[m['region']]} region."
        docs.append({"id": f"mountain-{i}", "title": m["name"], "text": text})
    for i, lake in enumerate(w.lakes):
        text = (
            f"{lake['name']} is a lake of {lake['area']} square kilometres in the {w.regions[lake['region']]} region."
        )
        docs.append({"id": f"lake-{i}", "title": lake["name"], "text": text})
    for i, r in enumerate(w.rivers):
        text = (
            f"The {r['name']} is a river {r['length']} km long. It rises on "
            f"{w.mountains[r['mountain']]['name']} and flows into {w.lakes[r['lake']]['name']}."
        )
        docs.append({"id": f"river-{i}", "title": f"{r['name']} river", "text": text})
    for i, t in enumerate(w.towns):
        text = (
            f"{t['name']} is a town on the {w.rivers[t['river']]['name']} river in the "
            f"{w.regions[t['region']]} region, known for {t['specialty']}. "
            f"It has {t['population']} inhabitants."
        )
        docs.append({"id": f"town-{i}", "title": t["name"], "text": text})
    for i, p in enumerate(w.people):
        text = (
            f"{p['name']} was born in {p['year']} in the town of {w.towns[p['town']]['name']}. "
            f"{p['he']} worked as a {p['profession']}."
        )
        for c in p["founded"]:
            text += f" {p['he']} founded {w.companies[c]['name']}."
        docs.append({"id": f"person-{i}", "title": p["name"], "text": text})
    for i, c in enumerate(w.companies):
        text = (
            f"{c['name']} is a maker of {c['product']}, founded in {c['year']} by "
            f"{w.people[c['founder']]['name']}. Its headquarters are in the town of "
            f"{w.towns[c['town']]['name']}."
        )
        docs.append({"id": f"company-{i}", "title": c["name"], "text": text})
    return docs


def one_hop(w: World) -> list[dict]:
    """Every 1-hop question the world supports (answer in one document)."""
    qs = []
    for i, p in enumerate(w.people):
        qs.append((f"In which town was {p['name']} born?", w.towns[p["town"]]["name"], [f"person-{i}"]))
        qs.append((f"What was the profession of {p['name']}?", p["profession"], [f"person-{i}"]))
    for i, c in enumerate(w.companies):
        qs.append((f"Who founded {c['name']}?", w.people[c["founder"]]["name"], [f"company-{i}"]))
        qs.append((f"In which town are the headquarters of {c['name']}?", w.towns[c["town"]]["name"], [f"company-{i}"]))
        qs.append((f"What does {c['name']} make?", c["product"], [f"company-{i}"]))
    for i, t in enumerate(w.towns):
        qs.append((f"On which river is the town of {t['name']}?", w.rivers[t["river"]]["name"], [f"town-{i}"]))
    for i, r in enumerate(w.rivers):
        qs.append((f"Into which lake does the {r['name']} river flow?", w.lakes[r["lake"]]["name"], [f"river-{i}"]))
    return [{"question": q, "answer": a, "hops": 1, "docs": d} for q, a, d in qs]


def two_hop(w: World) -> list[dict]:
    """Every 2-hop question the world supports (a bridge entity links two documents)."""
    qs = []
    for i, c in enumerate(w.companies):
        f = c["founder"]
        founder = w.people[f]
        gold = [f"company-{i}", f"person-{f}"]
        qs.append((f"In which town was the founder of {c['name']} born?", w.towns[founder["town"]]["name"], gold))
        qs.append((f"What was the profession of the founder of {c['name']}?", founder["profession"], gold))
        t = c["town"]
        qs.append(
            (
                f"On which river is the town where {c['name']} has its headquarters?",
                w.rivers[w.towns[t]["river"]]["name"],
                [f"company-{i}", f"town-{t}"],
            )
        )
    for i, p in enumerate(w.people):
        t = p["town"]
        qs.append(
            (
                f"On which river is the town where {p['name']} was born?",
                w.rivers[w.towns[t]["river"]]["name"],
                [f"person-{i}", f"town-{t}"],
            )
        )
    for i, t in enumerate(w.towns):
        r = t["river"]
        qs.append(
            (
                f"Into which lake flows the river of the town of {t['name']}?",
                w.lakes[w.rivers[r]["lake"]]["name"],
                [f"town-{i}", f"river-{r}"],
            )
        )
    return [{"question": q, "answer": a, "hops": 2, "docs": d} for q, a, d in qs]


def main() -> None:
    """Build the world, sample the questions and write both JSONL files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "src/agentrl/envs/data")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    world = build_world(rng)
    docs = documents(world)
    questions = rng.sample(one_hop(world), N_ONE_HOP) + rng.sample(two_hop(world), N_TWO_HOP)
    rng.shuffle(questions)
    for i, q in enumerate(questions):
        q["id"] = f"q{i:03d}"
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "searchqa_corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    with open(args.out / "searchqa_questions.jsonl", "w", encoding="utf-8") as f:
        keys = ("id", "question", "answer", "hops", "docs")
        f.writelines(json.dumps({k: q[k] for k in keys}, ensure_ascii=False) + "\n" for q in questions)
    print(f"wrote {len(docs)} documents and {len(questions)} questions to {args.out}")


if __name__ == "__main__":
    main()
