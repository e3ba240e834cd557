"""Search-QA: multi-hop questions answered with a BM25 search tool over a small shipped corpus.

Mirrors the Search-R1 / ReSearch style of tool-using QA (search, read, then answer; rewarded by exact match or
token F1 against the gold answer as in SQuAD/HotpotQA evaluation), scaled down: the corpus is ~200 short
documents about *invented* people, towns, companies, rivers and lakes (``data/searchqa_corpus.jsonl``, made by
``scripts/make_searchqa_data.py``), so the model cannot answer from memory, and retrieval is BM25 (``bm25s``)
instead of a dense e5 index. Questions are 1-hop ("Who founded Wovferk Group?") or 2-hop ("In which town was the
founder of Wovferk Group born?").

Accepted actions (the first one found in the reply is used):

* Hermes tool calls: ``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>`` and
  ``<tool_call>{"name": "answer", "arguments": {"text": "..."}}</tool_call>`` (parsed with ``json.loads``;
  ``arguments`` may also be a JSON string, and ``answer`` also takes the key ``answer``);
* plain forms, case-insensitive: ``search[query]``, ``search(query)``, ``search: query``, the same for ``answer``,
  and ``<answer>text</answer>``.

Anything else is a format error. The question is ``questions[seed % len(questions)]`` (after the ``hops`` filter),
so seeds ``0..n-1`` visit every question once.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl.chat.tools import HermesToolParser
from agentrl.envs.base import EpisodeSnapshots, StepResult

_HERMES = HermesToolParser()
_PLAIN = re.compile(
    r"\b(search|answer)\s*(?:\[([^\]\n]*)\]?|\(([^)\n]*)\)?|:\s*([^\n]*))|<answer>\s*(.*?)\s*</answer>",
    re.IGNORECASE | re.DOTALL,
)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_MAX_ARG_CHARS = 300
_SUFFIXES = ("ers", "ing", "ed", "er", "es", "s")


def _data_path(name: str) -> Path:
    return Path(str(resources.files("agentrl.envs").joinpath("data", name)))


def _stem(words: list[str]) -> list[str]:
    """A tiny suffix-stripping stemmer, so that "founder", "founded" and "founders" meet."""
    out = []
    for word in words:
        stem = word
        for _ in range(2):
            for suffix in _SUFFIXES:
                if stem.endswith(suffix) and len(stem) - len(suffix) >= 4:
                    stem = stem[: -len(suffix)]
                    break
        out.append(stem)
    return out


class SearchIndex:
    """BM25 (``bm25s``) over a JSONL corpus of ``{"id", "title", "text"}`` documents.

    Args:
        corpus_path: JSONL file; None for the corpus shipped with agentrl.
    """

    def __init__(self, corpus_path: str | Path | None = None) -> None:
        path = Path(corpus_path) if corpus_path else _data_path("searchqa_corpus.jsonl")
        with open(path, encoding="utf-8") as f:
            self.docs: list[dict[str, str]] = [json.loads(line) for line in f if line.strip()]
        if not self.docs:
            raise ValueError(f"corpus {path} has no documents")
        import bm25s  # lazily: it pulls in scipy, ~0.4 s that `import agentrl.envs` should not pay

        self._tokenize = bm25s.tokenize
        tokens = bm25s.tokenize(
            [f"{d['title']} {d['text']}" for d in self.docs], stopwords="en", stemmer=_stem, show_progress=False
        )
        self._bm25: Any = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int = 3) -> list[dict[str, Any]]:
        """Top-``k`` documents for ``query`` (only those sharing a term with it), best first.

        Returns:
            Dicts with ``id``, ``title``, ``text`` and ``score``.
        """
        words = self._tokenize([query], stopwords="en", stemmer=_stem, return_ids=False, show_progress=False)
        if not words[0]:
            return []
        idx, scores = self._bm25.retrieve(words, k=min(k, len(self.docs)), show_progress=False)
        return [{**self.docs[int(i)], "score": float(s)} for i, s in zip(idx[0], scores[0], strict=True) if s > 0]


@lru_cache(maxsize=4)
def shared_index(corpus_path: str = "") -> SearchIndex:
    """One `SearchIndex` per corpus file per process ("": the shipped corpus), shared by every user."""
    return SearchIndex(corpus_path or None)


def load_questions(hops: int = 0, questions_path: str = "") -> list[dict[str, Any]]:
    """The question rows (question, answer, hops, id) with ``hops`` hops (0: all); "" is the shipped file."""
    path = Path(questions_path) if questions_path else _data_path("searchqa_questions.jsonl")
    with open(path, encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    selected = [q for q in questions if hops in (0, q["hops"])]
    if not selected:
        raise ValueError(f"no questions with hops={hops} in {path}")
    return selected


def format_hits(query: str, hits: list[dict[str, Any]], max_chars: int) -> str:
    """Search results as the model reads them (numbered ``title: text`` lines), cut to ``max_chars``."""
    if not hits:
        body = f"No documents match {query!r}. Try other words."
    else:
        body = "\n".join(f"[{i + 1}] {h['title']}: {h['text']}" for i, h in enumerate(hits))
    return body if len(body) <= max_chars else body[: max_chars - 3] + "..."


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 between normalised answers (SQuAD's ``f1_score``)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def parse_action(text: str) -> tuple[str, str] | None:
    """``("search", query)`` or ``("answer", text)`` from a reply, or None when there is no valid action."""
    text = text[:20_000]
    parsed = _tool_action(text)
    if parsed is not None:
        return parsed
    match = _PLAIN.search(text)
    if match is None:
        return None
    if match.group(5) is not None:
        name, arg = "answer", match.group(5)
    else:
        name = match.group(1).lower()
        arg = next(g for g in match.group(2, 3, 4) if g is not None)
    arg = arg.strip().strip("\"'").strip()
    return (name, arg) if 0 < len(arg) <= _MAX_ARG_CHARS else None


def _tool_action(text: str) -> tuple[str, str] | None:
    """The first Hermes tool call of ``text`` (parsed by `HermesToolParser`, ``json.loads`` only) as an action."""
    calls = _HERMES.parse(text).tool_calls
    if not calls:
        return None
    name, args = calls[0].name, calls[0].arguments
    for key in {"search": ("query",), "answer": ("text", "answer")}.get(name, ()):
        value = args.get(key)
        if isinstance(value, str) and 0 < len(value.strip()) <= _MAX_ARG_CHARS:
            return name, value.strip()
    return None


@dataclass(frozen=True)
class _Episode:
    question: dict[str, Any]
    turn: int = 0
    done: bool = False


class SearchQAEnv(EpisodeSnapshots):
    """Answer a 1- or 2-hop question about invented entities by searching a BM25 index.

    Args:
        reward: ``"f1"`` (token F1 of the answer, the default) or ``"em"`` (1 for a normalised exact match).
        hops: Only questions with this many hops (1 or 2); 0 for all.
        top_k: Documents shown per search, in [1, 10].
        max_obs_chars: Character budget of a search observation, in [100, 10000].
        max_turns: Tool calls (format errors included) before truncation.
        format_penalty: Reward of a reply without a valid action (should be <= 0).
        corpus_path: JSONL corpus; "" for the shipped one.
        questions_path: JSONL questions; "" for the shipped ones.
    """

    episode_type = _Episode

    def __init__(
        self,
        reward: str = "f1",
        hops: int = 0,
        top_k: int = 3,
        max_obs_chars: int = 600,
        max_turns: int = 4,
        format_penalty: float = -0.1,
        corpus_path: str = "",
        questions_path: str = "",
    ) -> None:
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        if hops not in (0, 1, 2):
            raise ValueError(f"hops must be 0 (all), 1 or 2, got {hops}")
        if not 1 <= top_k <= 10:
            raise ValueError(f"top_k must be in [1, 10], got {top_k}")
        if not 100 <= max_obs_chars <= 10_000:
            raise ValueError(f"max_obs_chars must be in [100, 10000], got {max_obs_chars}")
        if not 1 <= max_turns <= 100:
            raise ValueError(f"max_turns must be in [1, 100], got {max_turns}")
        if not -10.0 <= format_penalty <= 0.0:
            raise ValueError(f"format_penalty must be in [-10, 0], got {format_penalty}")
        self.reward, self.hops, self.top_k, self.max_obs_chars = reward, hops, top_k, max_obs_chars
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.index = shared_index(corpus_path)
        self.questions = load_questions(hops, questions_path)
        self.system_prompt = (
            "Answer the question about invented people, towns and companies. You cannot know the answer: "
            "search first. Reply with one action per turn:\nsearch[query] to search the documents\n"
            "answer[text] to give the final answer in a few words\nExample reply: search[Wovferk Group founder]"
        )
        self._episode: _Episode | None = None

    def reset(self, seed: int) -> str:
        """Pick question ``seed % n`` and return it."""
        question = self.questions[seed % len(self.questions)]
        self._episode = _Episode(question)
        return f"Question: {question['question']}"

    def step(self, action: str) -> StepResult:
        """Run a search or score an answer."""
        episode = self._episode
        if episode is None or episode.done:
            raise RuntimeError("SearchQAEnv.step called before reset() or after the episode ended")
        turn = episode.turn + 1
        truncated = turn >= self.max_turns
        parsed = parse_action(action)
        self._episode = replace(episode, turn=turn, done=truncated)
        info: dict[str, Any] = {"format_error": parsed is None}
        if truncated:
            info.update(success=False, em=0.0, f1=0.0)
        if parsed is None:
            obs = "Invalid action. Reply with search[query] or answer[text], e.g. search[Wovferk Group founder]."
            return StepResult(obs, self.format_penalty, False, truncated, info)
        name, arg = parsed
        if name == "answer":
            return self._answer(arg, episode.question)
        hits = self.index.search(arg, k=self.top_k)
        info.update(tool="search", query=arg, doc_ids=[h["id"] for h in hits])
        return StepResult(self._render(arg, hits, truncated), 0.0, False, truncated, info)

    def _answer(self, text: str, question: dict[str, Any]) -> StepResult:
        gold = str(question["answer"])
        em = float(normalize_answer(text) == normalize_answer(gold))
        f1 = f1_score(text, gold)
        self._episode = replace(self._episode, done=True) if self._episode else None
        info = {"format_error": False, "tool": "answer", "success": em == 1.0, "em": em, "f1": f1, "gold": gold}
        reward = em if self.reward == "em" else f1
        return StepResult(f"Your answer: {text}. Correct answer: {gold}.", reward, True, False, info)

    def _render(self, query: str, hits: list[dict[str, Any]], truncated: bool) -> str:
        body = format_hits(query, hits, self.max_obs_chars)
        tail = "Out of turns." if truncated else "Next: search[query] or answer[text]."
        return f"{body}\n{tail}"
