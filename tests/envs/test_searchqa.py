"""SearchQA: shipped data, BM25 retrieval of gold documents, answer scoring, tool-call parsing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.envs import SearchIndex, SearchQAEnv
from agentrl.envs.searchqa import f1_score, normalize_answer, parse_action


@pytest.fixture(scope="module")
def env() -> SearchQAEnv:
    return SearchQAEnv()


def test_shipped_data_shape(env: SearchQAEnv) -> None:
    docs = env.index.docs
    assert 150 <= len(docs) <= 300
    assert len({d["id"] for d in docs}) == len(docs)
    ids = {d["id"] for d in docs}
    assert 150 <= len(env.questions) <= 300
    assert {q["hops"] for q in env.questions} == {1, 2}
    for q in env.questions:
        assert len(q["docs"]) == q["hops"] and set(q["docs"]) <= ids
        gold_text = " ".join(d["text"] for d in docs if d["id"] == q["docs"][-1])
        assert q["answer"] in gold_text


def test_gold_documents_are_retrieved(env: SearchQAEnv) -> None:
    """The question finds its first gold document; the bridge entity's name finds the second."""
    titles = {d["id"]: d["title"] for d in env.index.docs}
    first = second = 0
    two_hop = [q for q in env.questions if q["hops"] == 2]
    for q in env.questions:
        first += q["docs"][0] in [h["id"] for h in env.index.search(q["question"], k=3)]
    for q in two_hop:
        bridge = titles[q["docs"][1]]
        second += q["docs"][1] in [h["id"] for h in env.index.search(bridge, k=3)]
    assert first >= 0.95 * len(env.questions)
    assert second >= 0.95 * len(two_hop)


def test_answering_gold_gives_reward_one(env: SearchQAEnv) -> None:
    for seed in range(0, 200, 7):
        q = env.questions[seed % len(env.questions)]
        assert env.reset(seed) == f"Question: {q['question']}"
        result = env.step(f"answer[{q['answer'].upper()}]")
        assert result.reward == 1.0 and result.terminated
        assert result.info["success"] is True and result.info["em"] == 1.0


def test_two_hop_episode_with_tool_calls(env: SearchQAEnv) -> None:
    seed = next(i for i, q in enumerate(env.questions) if q["hops"] == 2)
    q = env.questions[seed]
    env.reset(seed)
    call = {"name": "search", "arguments": {"query": q["question"]}}
    result = env.step(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
    assert not result.info["format_error"] and q["docs"][0] in result.info["doc_ids"]
    assert len(result.observation) <= env.max_obs_chars + 60
    call = {"name": "answer", "arguments": json.dumps({"text": q["answer"]})}
    result = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert result.reward == 1.0 and result.info["success"]


def test_partial_answer_earns_f1_or_zero_with_em() -> None:
    q = SearchQAEnv().questions[0]
    for reward, expected in (("f1", f1_score(f"{q['answer']} town river", q["answer"])), ("em", 0.0)):
        env = SearchQAEnv(reward=reward)
        env.reset(0)
        result = env.step(f"answer: {q['answer']} town river")
        assert result.reward == pytest.approx(expected)
        assert result.info["success"] is False and 0 < result.info["f1"] < 1


def test_normalisation_and_f1() -> None:
    assert normalize_answer("The  Lake, Varn!") == "lake varn"
    assert f1_score("Lake Varn", "lake varn") == 1.0
    assert f1_score("Varn", "Lake Varn") == pytest.approx(2 / 3)
    assert f1_score("", "Lake Varn") == 0.0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("search[who founded X]", ("search", "who founded X")),
        ("I will Search: river of Foo\nthen answer", ("search", "river of Foo")),
        ("answer(Lake Bar)", ("answer", "Lake Bar")),
        ("<answer>Lake Bar</answer>", ("answer", "Lake Bar")),
        ('<tool_call>{"name": "answer", "arguments": {"answer": "x"}}</tool_call>', ("answer", "x")),
        ('<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>', None),
        ('<tool_call>{"name": "delete", "arguments": {"query": "x"}}</tool_call>', None),
        ("<tool_call>[1, 2]</tool_call>", None),
        ("The answer is Lake Bar", None),
        ("search[]", None),
    ],
)
def test_parse_action(reply: str, expected: tuple[str, str] | None) -> None:
    assert parse_action(reply) == expected


def test_search_index_custom_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "title": "Alpha", "text": "apples"}\n{"id": "b", "title": "Beta", "text": "pears"}\n')
    index = SearchIndex(path)
    assert [h["id"] for h in index.search("pears please")] == ["b"]
    assert index.search("the of and") == []


def test_shipped_data_is_what_the_script_makes(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    out = tmp_path
    script = root / "scripts" / "make_searchqa_data.py"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, capture_output=True, timeout=60)
    for name in ("searchqa_corpus.jsonl", "searchqa_questions.jsonl"):
        shipped = root / "src" / "agentrl" / "envs" / "data" / name
        assert (out / name).read_bytes() == shipped.read_bytes(), name
