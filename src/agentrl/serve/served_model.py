"""The model behind ``agentrl serve``: a `Policy`, embedded engines, and LoRA hot-loading.

* **Two engines, one model.** With LoRA, the served model is peft-wrapped. Requests for the base model name run
  on one `HFEngine` with the adapter switched off; requests for the loaded adapter's name run on a second engine
  with it on. A lock serialises their model steps (they share the modules, and peft's adapter switch is global).
* **One adapter resident.** vLLM holds many adapters (``--max-loras``); ``agentrl serve`` holds one. Loading
  adapter B copies B's weights (``adapter_model.safetensors``, read with safetensors, never pickle) into the served
  model's LoRA slots and makes B the only adapter name that resolves: requests naming the replaced adapter get 404.
  A load waits for the requests in flight on the adapter to finish, holds new ones back while it copies, then
  drops the adapter engine's prefix cache (its KV was computed with the old weights).
* The adapter must match the served LoRA shape: same rank, alpha and target modules as ``--lora-rank``,
  ``--lora-alpha``, ``--lora-target-modules``; a mismatch is a 400 that names the field.
* **Adapters load from one folder.** ``lora_path`` must lie inside the adapter root (``--lora-modules-root``,
  default `DEFAULT_LORA_ROOT` in the server's working directory, which is where the trainer's
  ``VLLMEngineSpec(adapter_dir="adapters")`` writes when started from the same directory); a relative
  ``lora_path`` is taken inside the root. Paths are resolved (symbolic links followed) before the check, and a
  path outside the root is refused with the same answer whether it exists or not. Error messages name the adapter
  and the file, never a path, so the API tells nobody what exists on the server's disk. A malformed adapter
  (config that is not a UTF-8 JSON object, unreadable weights, a pickle that ``torch.load(weights_only=True)``
  refuses) is a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import reprlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy, unwrap

_SAVED_KEY = re.compile(r"^(.*\.lora_[AB])\.weight$")
_ADAPTER = "default"  # the peft adapter slot of the served model
DEFAULT_LORA_ROOT = "adapters"
"""Default adapter root, relative to the server's working directory."""


class ServeError(Exception):
    """An error with an HTTP status and an OpenAI error type (the server turns it into the error JSON)."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param


def not_found(model: str | None) -> ServeError:
    return ServeError(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")


@dataclass
class Resident:
    """The adapter held in the served model's LoRA slots."""

    name: str
    path: str


class _Gate:
    """Requests on the adapter enter and leave freely; a load waits until none is in flight and holds new ones
    back until it is done (an asyncio readers-writer lock)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing)
            self._writing = True
            await self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._writing = False
                self._cond.notify_all()


class ServedModel:
    """A policy served under ``name``, with an optional hot-loaded LoRA adapter.

    Args:
        policy: The policy (peft-wrapped when it has LoRA settings).
        name: Served model name (``model`` field of requests for the base weights).
        max_batch_size: Most sequences one engine decodes together.
        prefix_cache_tokens: Token budget of each engine's prefix KV store.
        max_context: Context window (default: the model's).
        lora_root: The only folder adapters load from (default: `DEFAULT_LORA_ROOT` in the working directory).
    """

    def __init__(self, policy: Policy, name: str, *, max_batch_size: int = 32, prefix_cache_tokens: int = 32768,
                 max_context: int | None = None, lora_root: str | Path | None = None) -> None:
        self.policy = policy.eval()  # never trained here; dropout (if any) stays off in scoring passes too
        self.name = name
        self.lora_root = Path(lora_root if lora_root is not None else DEFAULT_LORA_ROOT).resolve()
        self._lock = threading.Lock()
        kw: dict[str, Any] = {"max_batch_size": max_batch_size, "prefix_cache_tokens": prefix_cache_tokens,
                              "max_context": max_context}
        self.base = HFEngine(policy, step_context=self.base_step, **kw)
        self.adapter_engine = HFEngine(policy, step_context=self.adapter_step, **kw) if policy.uses_lora else None
        self.resident: Resident | None = None
        self.replaced: str | None = None  # the adapter the last load replaced: already unloaded
        self._gate = _Gate()

    @property
    def max_context(self) -> int:
        return self.base.max_context

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def vocab_size(self) -> int:
        model: Any = unwrap(self.policy.model)
        return int(model.get_input_embeddings().num_embeddings)

    # ------------------------------------------------------------------ model steps (worker threads)

    @contextlib.contextmanager
    def base_step(self) -> Iterator[None]:
        """Serialise with the other engine; the adapter is off."""
        with self._lock, self.policy.adapter_disabled() if self.policy.uses_lora else contextlib.nullcontext():
            yield

    @contextlib.contextmanager
    def adapter_step(self) -> Iterator[None]:
        with self._lock:
            yield

    # ------------------------------------------------------------------ routing

    def check_model(self, model: str | None) -> None:
        """404 for a name that is neither the base model nor the resident adapter (checked first, as vLLM does)."""
        if model is not None and model != self.name and (self.resident is None or self.resident.name != model):
            raise not_found(model)

    @contextlib.asynccontextmanager
    async def engine_for(self, model: str | None) -> AsyncIterator[tuple[HFEngine, bool]]:
        """The engine serving ``model`` and whether it is the base; a load cannot swap the adapter meanwhile."""
        if model is None or model == self.name:
            yield self.base, True
            return
        if self.adapter_engine is None:
            raise not_found(model)
        async with self._gate.read():
            if self.resident is None or self.resident.name != model:
                raise not_found(model)
            yield self.adapter_engine, False

    # ------------------------------------------------------------------ LoRA hot-loading

    async def load_adapter(self, name: str, path: str) -> None:
        """Copy the adapter saved in folder ``path`` into the served model and serve it as ``name``."""
        if self.adapter_engine is None:
            raise ServeError("agentrl serve was started without --lora-rank: it has no LoRA slots to load "
                             "adapters into", 400, "InvalidUserInput")
        if name == self.name:
            raise ServeError(f"lora_name '{name}' is the base model's name", 400, "InvalidUserInput", "lora_name")
        if self.resident is not None and self.resident.name == name:
            raise ServeError(f"The lora adapter '{name}' has already been loaded.", 400, "InvalidUserInput")
        folder = self._adapter_folder(name, path)
        tensors = await asyncio.to_thread(self._read_adapter, name, folder)
        async with self._gate.write():
            await asyncio.to_thread(self._copy_in, tensors)
            # a new version drops the KV of the old weights
            await self.adapter_engine.update_weights(version=self.adapter_engine.version + 1)
            self.replaced = self.resident.name if self.resident is not None else None
            self.resident = Resident(name, str(folder))

    def unload_adapter(self, name: str) -> None:
        """Unload ``name``. The adapter that the last load replaced counts as loaded until then, so the vLLM
        sequence "load the new adapter, then unload the old one" succeeds; any other name is a 404."""
        if self.replaced == name:
            self.replaced = None
            return
        if self.resident is None or self.resident.name != name:
            raise ServeError(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")
        self.resident = None

    def _adapter_folder(self, name: str, lora_path: str) -> Path:
        """``lora_path`` resolved, if it lies inside the adapter root (else a 400 that says nothing about it)."""
        try:
            path = Path(lora_path)
            folder = (path if path.is_absolute() else self.lora_root / path).resolve()
        except (OSError, ValueError, RuntimeError):  # NUL bytes, over-long names, symbolic-link loops
            folder = None
        if folder is None or not folder.is_relative_to(self.lora_root):
            raise ServeError(f"lora_path of adapter '{name}' is not inside the server's adapter folder: adapters load "
                             "only from agentrl serve --lora-modules-root", 400, "InvalidUserInput", "lora_path")
        return folder

    def _adapter_file(self, folder: Path, filename: str) -> Path | None:
        """``folder/filename`` if it is a file inside the root (a link out of the root does not count)."""
        file = folder / filename
        try:
            return file if file.is_file() and file.resolve().is_relative_to(self.lora_root) else None
        except (OSError, RuntimeError):
            return None

    def _read_adapter(self, name: str, folder: Path) -> dict[str, Tensor]:
        """Check ``adapter_config.json`` against the served LoRA and read the weights into served names."""
        config_file = self._adapter_file(folder, "adapter_config.json")
        if config_file is None:
            raise ServeError(f"No adapter '{name}' found at its lora_path (no adapter_config.json)", 404,
                             "NotFoundError", "lora_path")
        try:
            config = json.loads(config_file.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            config = None
        if not isinstance(config, dict):
            raise ServeError(f"adapter '{name}': adapter_config.json is not a UTF-8 JSON object", 400,
                             "InvalidUserInput", "lora_path")
        self._check_config(config)
        return self._map_names(self._read_weights(name, folder))

    def _read_weights(self, name: str, folder: Path) -> dict[str, Tensor]:
        """The saved tensors: safetensors, or a ``.bin`` that ``torch.load(weights_only=True)`` accepts."""
        weights = self._adapter_file(folder, "adapter_model.safetensors")
        pickled = weights is None
        weights = weights or self._adapter_file(folder, "adapter_model.bin")
        if weights is None:
            raise ServeError(f"No adapter '{name}' found at its lora_path (no adapter_model.safetensors)", 404,
                             "NotFoundError", "lora_path")
        try:
            if pickled:
                saved = torch.load(weights, map_location="cpu", weights_only=True)
            else:
                from safetensors.torch import load_file

                saved = load_file(str(weights))
        except Exception:  # any reader error is the file's fault: corrupt, truncated, or a refused pickle
            saved = None
        if not (isinstance(saved, dict) and all(isinstance(k, str) and isinstance(v, Tensor) and v.is_floating_point()
                                                for k, v in saved.items())):
            what = ("could not be read as tensors only (torch.load weights_only=True); save it with safetensors"
                    if pickled else "is not a readable safetensors file")
            raise ServeError(f"adapter '{name}': {weights.name} {what}", 400, "InvalidUserInput", "lora_path")
        return saved

    def _check_config(self, config: dict[str, Any]) -> None:
        lora = self.policy.lora
        assert lora is not None
        expected = {"peft_type": "LORA", "r": lora.r, "lora_alpha": lora.alpha}
        for key, want in expected.items():
            if config.get(key) != want:
                raise ServeError(f"adapter {key} is {reprlib.repr(config.get(key))} but the served model's LoRA has "
                                 f"{want!r} (agentrl serve --lora-rank/--lora-alpha must match the trainer's "
                                 "policy.lora)")
        targets = config.get("target_modules") or []
        if not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)) or set(targets) != set(
                lora.target_modules):
            raise ServeError(f"adapter target_modules {reprlib.repr(targets)} differ from the served model's "
                             f"{sorted(lora.target_modules)} (--lora-target-modules)")
        for flag in ("use_dora", "use_rslora"):
            if config.get(flag):
                raise ServeError(f"adapter uses {flag}, which agentrl serve does not support")

    def _map_names(self, saved: dict[str, Tensor]) -> dict[str, Tensor]:
        """Saved peft names (``...q_proj.lora_A.weight``) to served ones (``...q_proj.lora_A.default.weight``);
        every served LoRA weight must be given once, with its exact shape."""
        params = {n: p for n, p in self.policy.model.named_parameters() if ".lora_" in n}
        out: dict[str, Tensor] = {}
        for key, tensor in saved.items():
            match = _SAVED_KEY.match(key)
            target = f"{match.group(1)}.{_ADAPTER}.weight" if match else key
            if target not in params:
                raise ServeError(f"adapter weight {key} has no place in the served model")
            if tuple(tensor.shape) != tuple(params[target].shape):
                raise ServeError(f"adapter weight {key} has shape {tuple(tensor.shape)}, the served model's "
                                 f"{tuple(params[target].shape)}")
            out[target] = tensor
        missing = sorted(set(params) - set(out))
        if missing:
            raise ServeError(f"adapter lacks {len(missing)} LoRA weights of the served model, e.g. {missing[0]}")
        return out

    def _copy_in(self, tensors: dict[str, Tensor]) -> None:
        params = dict(self.policy.model.named_parameters())
        with self._lock, torch.no_grad():
            for name, tensor in tensors.items():
                params[name].copy_(tensor.to(params[name].dtype))
