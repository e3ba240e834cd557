"""The same agent for inference through LangChain's ``ChatOpenAI`` against ``agentrl serve`` (a real subprocess on
127.0.0.1), and train/serve parity: the server renders a LangChain conversation with tools to the same prompt ids
as the trainer's `AgentRLChatModel`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from agentrl_langchain_examples.search_agent import (
    SEARCH_BONUS,
    SYSTEM_PROMPT,
    SearchQATasks,
    answer,
    build,
    reward,
    search,
    with_demonstration,
)
from langchain_core.messages import AIMessage, SystemMessage, convert_to_openai_messages
from langchain_core.utils.function_calling import convert_to_openai_tool
from tests.support.server import start_server

from agentrl.agents.base import Task
from agentrl.agents.llm import LLMClient
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy
from agentrl_langchain import AgentRLChatModel


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_server(tmp_path_factory.mktemp("serve"), "--log-level", "warning")
    try:
        yield server.url
    finally:
        server.stop()


def test_the_agent_runs_on_chat_openai(server_url: str) -> None:
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=f"{server_url}/v1", api_key="unused", model="tiny-random", max_tokens=16,
                       temperature=1.0)
    task = SearchQATasks(hops=1).task(0)
    result = build(model).invoke(with_demonstration(task))
    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and final.usage_metadata is not None
    assert final.usage_metadata["output_tokens"] <= 16
    score = reward(task, result)  # the reward reads the ChatOpenAI result as it reads the agentrl chat model's
    assert score.info["gold"] == task.data["answer"] and 0.0 <= score.info["f1"] <= 1.0
    assert score.reward == pytest.approx(score.info["f1"] + SEARCH_BONUS * score.info["searched"])


def test_server_and_trainer_render_a_tool_conversation_identically(server_url: str, tiny_policy: Policy) -> None:
    task = Task("t", data={"question": "Who founded Wovferk Group?"})
    conversation = [SystemMessage(SYSTEM_PROMPT), *with_demonstration(task)["messages"]]
    tools = [search, answer]
    body: dict[str, Any] = {"model": "tiny-random", "messages": convert_to_openai_messages(conversation),
                            "tools": [convert_to_openai_tool(t) for t in tools], "max_tokens": 1,
                            "return_token_ids": True}
    served = httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=60)
    assert served.status_code == 200, served.text
    llm = LLMClient(HFEngine(tiny_policy), tiny_policy.tokenizer, SamplingParams(max_tokens=1))

    async def trainer_side() -> None:
        await AgentRLChatModel(client=llm).bind_tools(tools).ainvoke(conversation)

    asyncio.run(trainer_side())
    assert served.json()["prompt_token_ids"] == llm.turns[0].prompt_ids
