"""What the trainer needs from torch.distributed when Lightning runs several ranks (DDP).

Each rank collects its own episodes, so ranks do different amounts of work per step (different numbers of
rows, of RTPO depths, of micro-batches). DDP's automatic gradient all-reduce needs the same backward calls on
every rank, which variable rollouts cannot promise; so the module runs its backward passes under ``no_sync`` and
sums gradients itself, once per optimizer step (losses are normalised by unit counts summed over the ranks), after
agreeing with the other ranks on how many optimizer steps there are. Every rank then takes identical optimizer
steps and the weights stay identical. On one process these functions do nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sync_max(value: int, device: torch.device | None = None) -> int:
    """The largest ``value`` over the ranks."""
    if not active():
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def sync_all(flag: bool, device: torch.device | None = None) -> bool:
    """True only if ``flag`` is true on every rank."""
    if not active():
        return flag
    t = torch.tensor([int(flag)], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def sum_tensor(t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """``t`` summed over the ranks (a copy; ``t`` itself on one process)."""
    if not active():
        return t
    out = t.to(device=device).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.cpu()


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replace each gradient by its sum over the ranks (a rank without a gradient contributes zeros). The losses
    are normalised by global unit counts (see `agentrl.training.update.objective`), so the sum is the gradient one
    process would compute over every rank's data."""
    if not active() or not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
        offset += n


def check_in_sync(params: list[torch.nn.Parameter], device: torch.device | None = None) -> None:
    """Raise if the parameters differ across ranks (a checksum compared once per step: cheap insurance that every
    rank took the same optimizer steps)."""
    if not active():
        return
    with torch.no_grad():
        total = torch.stack([p.detach().double().sum() for p in params]).sum() if params else torch.zeros(())
    t = torch.stack([total, -total]).to(device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if float(t[0]) != -float(t[1]):
        raise RuntimeError(f"the policy's weights differ across ranks (checksums span {float(-t[1])}..{float(t[0])})")
