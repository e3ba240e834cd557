"""The weights the embedded engine (`agentrl.engines.hf.HFEngine`) decodes with: the policy's own, or a copy of them.

* **shared** (`SharedWeights`): the engine runs the trainer's modules. A push costs nothing, but the engine decodes
  in the trainer's storage dtype (fp32 by default: every decode step reads 4 bytes per parameter) and a forward
  can never overlap an optimizer step, which changes the very tensors it reads.
* **copy** (`WeightCopy`): the engine holds its own copy of the model in ``decode_dtype`` (``auto``: bf16 where the
  device has native bf16 matmuls, `agentrl.models.precision`), in eval mode, without gradients, refreshed at every
  push by an in-place ``copy_`` of the policy's current parameters. A decode step then reads 2 bytes per parameter
  in bf16 (the memory-bandwidth floor halves: ``benchmarks/results/roofline.json``), and the copy is separate
  storage, so an optimizer step on the policy changes nothing the engine reads until the next push. While nothing
  is being generated, the trainer's update (the run's memory peak) may ``release`` the copy's storage; the next
  push allocates it again from the updated weights (the same values an in-place refresh would give).

A LoRA (peft) policy is copied with its adapter layers, unmerged: the copy runs the same peft code as the trainer on
the same (adapter and base) values, so an fp32 copy gives the trainer's log-probs exactly; refreshing copies every
parameter by name, the frozen base included (a push costs one read of the policy's weights: the figure is logged as
``perf/engine_push_s``).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Literal

import torch
from torch import nn

from agentrl.models.policy import backbone_of, lm_head_of
from agentrl.models.precision import DtypeChoice, resolve_auto

WeightsMode = Literal["shared", "copy"]
WeightsSetting = Literal["auto", "shared", "copy"]
DecodeDType = Literal["auto", "float32", "bfloat16"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_decode_dtype(decode_dtype: DecodeDType, policy: Any) -> DtypeChoice:
    """The dtype a weight copy holds: the configured one, or ``auto``'s rule (the policy's: native bf16 on the
    policy's device and a model at least `agentrl.models.precision.MIN_WIDTH` wide, else fp32)."""
    if decode_dtype != "auto":
        return DtypeChoice(_DTYPES[decode_dtype], "set in the config")
    device = next(policy.model.parameters()).device
    return resolve_auto(device, int(policy.hidden_size))


def resolve_weights(weights: WeightsSetting, decode_dtype: DecodeDType, policy: Any) -> WeightsMode:
    """The engine's weights for a setting: ``shared`` or ``copy`` as set, or ``auto``'s rule — a copy exactly when
    it decodes in a cheaper dtype than fp32 (``decode_dtype`` resolved on the policy's device: bf16 where the device
    has native bf16 matmuls and the model is wide enough) and the policy is not sharded (a ``fully_shard``-ed
    model holds a slice of each weight: its modules are shared); otherwise the policy's own modules (an fp32 copy
    of an fp32 policy would cost its memory and decode no faster)."""
    if weights != "auto":
        return weights
    if _sharded(policy.model):
        return "shared"
    return "copy" if resolve_decode_dtype(decode_dtype, policy).dtype != torch.float32 else "shared"


def _sharded(model: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


class SharedWeights:
    """The policy's own modules (``weights: shared``): nothing to copy, nothing to refresh."""

    holds_copy = False
    released = False

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    @property
    def model(self) -> Any:
        return self.policy.model

    @property
    def backbone(self) -> Any:
        return self.policy.backbone

    @property
    def lm_head(self) -> Any:
        return self.policy.lm_head

    @property
    def nbytes(self) -> int:
        """Bytes of weights held by the engine itself: none."""
        return 0

    def refresh(self, policy: Any) -> float:
        """Nothing to copy: the engine reads the policy's tensors. Returns 0 seconds."""
        return 0.0


class WeightCopy:
    """The engine's own copy of ``policy.model`` in ``dtype`` (``weights: copy``; see the module docstring).

    Args:
        policy: The policy copied (its ``model``: a transformers causal LM, or a peft model around one).
        dtype: The copy's floating-point dtype (buffers keep theirs: the rotary frequencies stay fp32).
    """

    holds_copy = True

    def __init__(self, policy: Any, dtype: torch.dtype) -> None:
        self.dtype = dtype
        source = policy.model
        # deepcopy with the parameters swapped for detached converted tensors: the fp32 weights are never
        # duplicated in full on the way, and tied weights (SmolLM2's embeddings and LM head) stay tied; copy=True
        # because `.to` to the same dtype returns the very tensor (an fp32 "copy" would share the policy's storage)
        # built outside inference mode (`agentrl validate` builds the engine inside Lightning's): inference tensors
        # could not be refreshed in place by a later push ("Inplace update to inference tensor outside InferenceMode")
        with torch.inference_mode(False):
            memo: dict[int, Any] = {
                id(p): nn.Parameter(p.detach().to(dtype if p.is_floating_point() else p.dtype, copy=True),
                                    requires_grad=False)
                for p in source.parameters()}
            self.model: Any = copy.deepcopy(source, memo)
        self.model.eval()
        self.model.requires_grad_(False)
        self.last_refresh_s = 0.0
        self.released = False  # storage freed by `release` until the next `refresh`
        self._released_bytes = 0

    @property
    def backbone(self) -> Any:
        return backbone_of(self.model)

    @property
    def lm_head(self) -> Any:
        return lm_head_of(self.model)

    @property
    def nbytes(self) -> int:
        """Bytes of the copy's parameters (tied tensors counted once) and buffers."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)

    def release(self) -> int:
        """Free the parameters' storage (each becomes an empty tensor of its dtype, tied ones stay one object) until
        the next `refresh`, which allocates it again. Returns the bytes the copy's parameters no longer hold (the
        same figure when it was released already: two updates without a push between them, like Turn-PPO's value
        warm-up and its first update). The trainer releases the copy for its update, where nothing decodes and the
        copy would be replaced at the push anyway; a model step in between fails (`HFEngine` checks ``released``)."""
        if not self.released:
            self._released_bytes = 0
            with torch.no_grad():
                for param in self.model.parameters():
                    self._released_bytes += param.numel() * param.element_size()
                    param.data = param.data.new_empty(0)
            self.released = True
        return self._released_bytes

    @torch.no_grad()
    def refresh(self, policy: Any) -> float:
        """Copy ``policy``'s current parameters into the copy, in place, by name (converting to the copy's dtype);
        after a `release`, into newly allocated storage; follow the policy to another device first. Returns the
        seconds it took.

        Raises:
            ValueError: ``policy``'s parameter names differ from the copy's (another architecture or adapter set).
        """
        start = time.perf_counter()
        source = dict(policy.model.named_parameters())
        target = dict(self.model.named_parameters())
        if source.keys() != target.keys():
            missing = sorted(source.keys() ^ target.keys())[:3]
            raise ValueError(f"the engine's weight copy and the policy have different parameters (e.g. {missing}): "
                             "a copy refreshes from the policy it was built from")
        device = next(iter(source.values())).device
        if next(iter(target.values())).device != device:
            self.model.to(device)
            target = dict(self.model.named_parameters())
        for name, param in source.items():
            if self.released or target[name].shape != param.shape:  # released, or dropped (held packed elsewhere)
                target[name].data = param.detach().to(target[name].dtype, copy=True)
            else:
                target[name].copy_(param.detach())
        self.released = False
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.last_refresh_s = time.perf_counter() - start
        return self.last_refresh_s


EngineWeights = SharedWeights | WeightCopy


def engine_weights(policy: Any, mode: WeightsMode, decode_dtype: DecodeDType) -> EngineWeights:
    """The engine's weights for ``mode``: the policy's modules, or a copy in ``decode_dtype`` (resolved)."""
    if mode == "shared":
        return SharedWeights(policy)
    if mode == "copy":
        return WeightCopy(policy, resolve_decode_dtype(decode_dtype, policy).dtype)
    raise ValueError(f"engine.weights must be 'shared' or 'copy', got {mode!r}")
