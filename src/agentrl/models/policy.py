"""The policy: a causal LM (optionally with LoRA) that scores the exact token ids recorded at rollout.

`Policy.logprobs` computes log π(x_t | x_<t) and the entropy only at response positions: the backbone runs on
the whole sequence, but the vocabulary projection (49 k wide for SmolLM2, the most expensive layer of a small
model) runs only where a loss needs it. With LoRA the frozen base (adapter disabled) is the KL reference at no
extra memory (score inside `Policy.adapter_disabled`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from agentrl.models import tree
from agentrl.models.loading import SMOLLM2, load_model, stop_token_ids
from agentrl.models.precision import DtypeChoice, resolve_auto
from agentrl.types import TurnBatch

DType = Literal["float32", "bfloat16"]
ComputeDType = Literal["auto", "float32", "bfloat16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOGIT_CHUNK_ROWS = 256  # scored positions per LM-head chunk (see `Policy.logprobs_from_hidden`)


class LoRATargetError(ValueError):
    """LoRA ``target_modules`` that name no module of the model."""


@dataclass
class LoRASettings:
    """LoRA adapter settings (peft).

    Attributes:
        r: Rank of the update matrices.
        alpha: Scaling numerator (the update is scaled by alpha / r).
        dropout: Dropout on the adapter input (keep 0 for exact rollout/training log-prob agreement).
        target_modules: Names of the linear layers that get an adapter.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module")


class LogProbs(NamedTuple):
    """Per-token log-probs (N, L) and entropy (N, L) or None; zero outside the requested positions."""

    logprobs: Tensor
    entropy: Tensor | None


def unwrap(model: Any) -> Any:
    """The transformers model inside a peft wrapper (LoRA layers stay injected in its modules)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def backbone_of(model: Any) -> Any:
    """The decoder stack (without the LM head) of a causal LM, through a peft wrapper."""
    inner = unwrap(model)
    return getattr(inner, inner.base_model_prefix)


def lm_head_of(model: Any) -> Any:
    """The output embeddings (LM head) of a causal LM, through a peft wrapper."""
    head = unwrap(model).get_output_embeddings()
    assert head is not None
    return head


class Policy(nn.Module):
    """A causal LM policy.

    Args:
        model: Short name (``smollm2-135m-instruct``, ``tiny-random``), hub id, local folder or ``.gguf`` path.
        lora: LoRA settings; None trains every weight.
        dtype: Storage dtype of the weights.
        compute_dtype: ``bfloat16`` runs forward passes under CPU/GPU autocast; ``float32`` does not; ``auto`` (the
            default) picks bfloat16 where the model's device has native bf16 matmuls (CPU flags ``avx512_bf16`` /
            ``amx_bf16``, or CUDA's bf16 support: `agentrl.models.precision`), else float32; with bf16 the trainer
            recomputes π_old (`agentrl.training.update.mismatch`).
        gradient_checkpointing: Trade compute for activation memory in training forwards.
        seed: Initialisation seed of random models (``tiny-random``).
    """

    def __init__(
        self,
        model: str = SMOLLM2,
        *,
        lora: LoRASettings | None = None,
        dtype: DType = "float32",
        compute_dtype: ComputeDType = "auto",
        gradient_checkpointing: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES or (compute_dtype != "auto" and compute_dtype not in _DTYPES):
            raise ValueError(f"policy.dtype must be one of {list(_DTYPES)} and policy.compute_dtype one of "
                             f"{['auto', *_DTYPES]}, got {dtype!r}, {compute_dtype!r}")
        loaded = load_model(model, dtype=_DTYPES[dtype], seed=seed)
        self.name = model
        self.tokenizer = loaded.tokenizer
        self._compute_dtype = None if compute_dtype == "auto" else _DTYPES[compute_dtype]
        self.lora = lora
        lm = loaded.model
        lm.config.use_cache = False
        if gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            try:
                lm = get_peft_model(
                    lm,
                    LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                               target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
                )
            except ValueError as exc:  # peft's NoMatchingPeftModuleError (a GGUF model: not checked before the load)
                raise LoRATargetError(f"lora.target_modules {list(lora.target_modules)} do not match the modules of "
                                      f"{model}: {' '.join(str(exc).split())[:200]}") from None
        self.model: Any = lm
        self.stop_token_ids = stop_token_ids(self.tokenizer)

    # ------------------------------------------------------------------ structure

    @property
    def backbone(self) -> Any:
        return backbone_of(self.model)

    @property
    def lm_head(self) -> Any:
        return lm_head_of(self.model)

    @property
    def hidden_size(self) -> int:
        return int(unwrap(self.model).config.hidden_size)

    @property
    def max_context(self) -> int:
        return int(unwrap(self.model).config.max_position_embeddings)

    @property
    def uses_lora(self) -> bool:
        return self.lora is not None

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of forward passes: the configured one, or ``auto``'s choice on the weights' current device."""
        return self.resolved_compute_dtype.dtype

    @property
    def resolved_compute_dtype(self) -> DtypeChoice:
        """The compute dtype and why: set in the config, or ``auto``'s rule on the weights' current device."""
        if self._compute_dtype is not None:
            return DtypeChoice(self._compute_dtype, "set in the config")
        device = next(self.model.parameters()).device
        return resolve_auto(device, self.hidden_size)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = self.compute_dtype
        if dtype == torch.float32:
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=dtype)

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """Run the frozen base model (LoRA off): the reference policy."""
        if not self.uses_lora:
            raise RuntimeError("reference log-probs through a disabled adapter need LoRA (policy.lora)")
        with self.model.disable_adapter():
            yield

    def save(self, path: str | Path, *, tokenizer: bool = False) -> None:
        """Write the trainable weights to ``path`` with ``save_pretrained``: the LoRA adapter (peft format, what
        vLLM's ``/v1/load_lora_adapter`` reads) or the full model; ``tokenizer`` adds the tokenizer files."""
        # an adapter never touches the embeddings: skip peft's vocabulary check (it warns on GGUF-loaded models)
        extra = {"save_embedding_layers": False} if self.uses_lora else {}
        self.model.save_pretrained(str(path), **extra)
        if tokenizer:
            self.tokenizer.save_pretrained(str(path))

    # ------------------------------------------------------------------ scoring

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, branch: Tensor | None = None) -> Tensor:
        """(N, L, H) last hidden states; position ids follow the attention mask (padding-safe) and, for
        shared-prefix rows (``branch``), each token's own sequence (`agentrl.models.tree`)."""
        position_ids = tree.position_ids(attention_mask, branch)
        with self.autocast():
            out = self.backbone(input_ids=input_ids, attention_mask=tree.model_mask(self.backbone, attention_mask,
                                                                                    branch),
                                position_ids=position_ids, use_cache=False)
        return out.last_hidden_state

    def logprobs_from_hidden(
        self, hidden: Tensor, input_ids: Tensor, positions: Tensor, *, temperature: float = 1.0,
        with_entropy: bool = False, entropy_grad: bool = True, attention_mask: Tensor | None = None,
        branch: Tensor | None = None,
    ) -> LogProbs:
        """Log-probs of ``input_ids`` at the True ``positions`` (N, L) from hidden states (N, L, H).

        Token t is scored from the hidden state at t − 1 (in shared-prefix rows, ``branch`` with its
        ``attention_mask``: at its predecessor in its own sequence), so position 0 is never scored. The vocabulary
        projection runs on `LOGIT_CHUNK_ROWS` scored positions at a time and, when gradients are on, each chunk is
        recomputed in the backward pass (activation checkpointing) instead of keeping its (rows × vocabulary)
        logits: for SmolLM2 that is 196 KB per scored token and per saved tensor in fp32, the largest activation
        of the update. ``entropy_grad=False`` computes the entropy without a graph (it is then only logged).
        """
        if bool(positions[:, 0].any()):
            raise ValueError("position 0 has no context and cannot be scored")
        h = tree.scoring_states(hidden, positions, attention_mask, branch)  # (M, H): the state before each scored token
        targets = input_ids[positions]
        checkpointed = torch.is_grad_enabled() and h.requires_grad and h.shape[0] > 0
        parts: list[tuple[Tensor, Tensor | None]] = []
        # no scored position still runs the head once on zero rows: the loss keeps its graph through every layer
        # (sharded ranks must all run the same backward, see `agentrl.training.update.sharding`)
        for start in range(0, h.shape[0], LOGIT_CHUNK_ROWS) if h.shape[0] else [0]:
            rows = (h[start:start + LOGIT_CHUNK_ROWS], targets[start:start + LOGIT_CHUNK_ROWS])
            if checkpointed:
                parts.append(checkpoint(self._score_rows, *rows, temperature, with_entropy, entropy_grad,
                                        use_reentrant=False))
            else:
                parts.append(self._score_rows(*rows, temperature, with_entropy, entropy_grad))
        logp = torch.zeros(positions.shape, dtype=torch.float32, device=hidden.device)
        logp = logp.masked_scatter(positions, torch.cat([lp for lp, _ in parts]))
        entropy = None
        if with_entropy:
            entropy = torch.zeros_like(logp).masked_scatter(positions,
                                                            torch.cat([e for _, e in parts if e is not None]))
        return LogProbs(logp, entropy)

    def _score_rows(
        self, h: Tensor, targets: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-prob of each target (and the entropy) from hidden states ``h`` (M, H) through the LM head."""
        with self.autocast():
            logits = self.lm_head(h)
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            with contextlib.nullcontext() if entropy_grad else torch.no_grad():
                entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    def token_logprobs(
        self, input_ids: Tensor, attention_mask: Tensor, positions: Tensor, *, temperature: float = 1.0,
        with_entropy: bool = False, entropy_grad: bool = True, branch: Tensor | None = None,
    ) -> LogProbs:
        hidden = self.hidden_states(input_ids, attention_mask, branch)
        return self.logprobs_from_hidden(hidden, input_ids, positions, temperature=temperature,
                                         with_entropy=with_entropy, entropy_grad=entropy_grad,
                                         attention_mask=attention_mask, branch=branch)

    def logprobs(self, batch: TurnBatch, *, temperature: float = 1.0, with_entropy: bool = False) -> LogProbs:
        """Log-probs (and entropy) of the response tokens of a `TurnBatch`, aligned with ``old_logprobs``."""
        return self.token_logprobs(batch.input_ids, batch.attention_mask, batch.response_mask,
                                   temperature=temperature, with_entropy=with_entropy, branch=batch.branch)
