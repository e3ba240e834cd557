"""What a config check needs to know about a model without loading its weights: its context window and the names
of its modules (for LoRA ``target_modules``).

`agentrl.training.command.preflight` asks before anything loads, so that ``data.sampling.max_tokens`` beyond the context
or a LoRA target the model lacks stops the run in a second, by name, instead of after the load with a traceback.
A Hugging Face config (the tiny model's, a folder's ``config.json``, a cached hub id's) is built on the ``meta``
device, which allocates nothing; a GGUF file's context is read from its metadata header (the tensor table is not
read). What cannot be known cheaply is None and left to the load.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

import torch

from agentrl.models.loading import SMOLLM2, TINY_RANDOM, smollm2_gguf_path, tiny_config


def _hf_config(spec: str) -> Any | None:
    if spec == TINY_RANDOM:
        return tiny_config()
    if spec.endswith(".gguf") or spec == SMOLLM2:
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec, local_files_only=not Path(spec).expanduser().exists())
    except Exception:  # not cached, or not a transformers config: the load will say
        return None


def _gguf_path(spec: str) -> Path | None:
    if spec == SMOLLM2:
        return smollm2_gguf_path()
    return Path(spec).expanduser() if spec.endswith(".gguf") else None


def model_context(spec: str) -> int | None:
    """The context window (``max_position_embeddings``, GGUF ``<arch>.context_length``) of ``spec``, or None."""
    config = _hf_config(spec)
    if config is not None:
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if value else None
    path = _gguf_path(spec)
    if path is None or not path.is_file():
        return None
    meta = gguf_metadata(path, lambda found: any(k.endswith(".context_length") for k in found))
    return next((int(v) for k, v in meta.items() if k.endswith(".context_length")), None)


def module_names(spec: str) -> set[str] | None:
    """Every module name of ``spec``'s model and each name's last part (what peft matches ``target_modules``
    against), from its config on the meta device; None when no config is at hand without a load (GGUF)."""
    config = _hf_config(spec)
    if config is None:
        return None
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = {name for name, _ in model.named_modules() if name}
    return names | {name.rsplit(".", 1)[-1] for name in names}


# GGUF metadata value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): fixed sizes, 8 a string,
# 9 an array
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "Q")).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _FIXED:
        return _read(f, _FIXED[kind])
    if kind == 8:
        return _string(f)
    if kind == 9:
        item, count = _read(f, "I"), _read(f, "Q")
        if item in _FIXED:  # skipped, not decoded: a vocabulary is tens of thousands of entries
            f.seek(count * struct.calcsize("<" + _FIXED[item]), 1)
        else:
            for _ in range(count):
                _value(f, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: Path, enough: Any = None) -> dict[str, Any]:
    """The scalar metadata of a GGUF file (arrays are skipped), read until ``enough(found)`` is true."""
    found: dict[str, Any] = {}
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return found
            _read(f, "I")  # version
            _read(f, "Q")  # tensor count
            for _ in range(_read(f, "Q")):
                key = _string(f)
                found[key] = _value(f, _read(f, "I"))
                if enough is not None and enough(found):
                    break
    except (OSError, ValueError, struct.error):
        return found
    return found
