"""agentrl-langchain: fine-tune an existing LangChain / LangGraph agent with agentrl (Turn-PPO, RTPO).

``LangChainAgent(build, reward)`` is an agentrl `Agent`: per episode it builds the user's agent around an
`AgentRLChatModel` whose every call is a recorded, token-exact turn of the episode's `LLMClient`.
"""

from agentrl.agents.scoring import Score
from agentrl_langchain.agent import LangChainAgent, LangChainAgentError, question_input
from agentrl_langchain.chat_model import AgentRLChatModel
from agentrl_langchain.messages import RAW_TEXT_KEY, model_replies, to_ai_message, to_chat

__version__ = "0.1.0"

__all__ = [
    "RAW_TEXT_KEY",
    "AgentRLChatModel",
    "LangChainAgent",
    "LangChainAgentError",
    "Score",
    "model_replies",
    "question_input",
    "to_ai_message",
    "to_chat",
]
