"""Sharded training (FSDP2) under Lightning's `ModelParallelStrategy`: what changes when weights are sharded.

Select it with ``--trainer.strategy lightning.pytorch.strategies.ModelParallelStrategy`` and
``data_parallel_size: N, tensor_parallel_size: 1`` (configs/scale/rtpo_fsdp2_gpu.yaml). `AgentRLModule.configure_model`
then shards (`shard_for_training`) every decoder layer of the policy (and of the critic's backbone) with
``torch.distributed.fsdp.fully_shard`` over the data-parallel mesh (see `shard`). Three things change:

* **Lockstep forwards.** A sharded layer all-gathers its weights in every forward and reduce-scatters its
  gradients in every backward, so every rank must run the same number of forwards and backwards. Ranks hold
  different numbers of micro-batches by design; they agree on the largest count and the others run empty
  micro-batches (`pad_micro_batches`: one padding token, no response token, a zero loss that still backpropagates).
* **Summed gradients.** FSDP's reduce-scatter averages gradients over the ranks; the trainer's losses are already
  normalised by global unit counts (`agentrl.training.update.objective`), so the shards are multiplied back by the world
  size and the replicated parameters' gradients are all-reduced (`sum_gradients`) — the sum DDP's path computes.
* **A full copy for the engine.** The embedded engine samples on each rank independently, which sharded weights
  cannot do; it serves an unsharded copy of the policy made before sharding and refreshed from the gathered full
  state dict at every weight push (`refresh_full_copy`, a collective: every rank pushes at the same points).

Checkpoints are the strategy's distributed checkpoints (a folder per checkpoint; resume with ``--ckpt_path``).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from agentrl.training.update import distributed
from agentrl.training.update.batching import Row

M = TypeVar("M", bound=nn.Module)


def is_sharded(module: nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def shard(model: nn.Module, mesh: Any) -> None:
    """``fully_shard`` every decoder layer of ``model`` (modules named ``…DecoderLayer``: the bulk of the weights).
    Embeddings, final norm, LM head and value head stay replicated: the policy calls its backbone and its head
    separately (the head only on response positions) and the embeddings may be tied to the head, so they are
    not one FSDP unit; their gradients are summed with one all-reduce (`sum_gradients`)."""
    from torch.distributed.fsdp import fully_shard

    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(f"found no decoder layers to shard in {type(model).__name__}")
    for layer in layers:
        fully_shard(layer, mesh=mesh)


def pad_micro_batches(micro: list[list[Row]], count: int, pad_id: int) -> list[list[Row]]:
    """``micro`` followed by empty micro-batches up to ``count`` (see the module docstring)."""
    return micro + [[Row([pad_id])] for _ in range(count - len(micro))]


def sum_gradients(params: list[nn.Parameter]) -> None:
    """Gradients summed over the ranks: FSDP's averaged shards are multiplied back by the world size; the
    replicated parameters' gradients are all-reduced (`agentrl.training.update.distributed.sum_gradients`)."""
    world = dist.get_world_size()
    replicated = []
    for p in params:
        if is_dtensor(p):
            if p.grad is not None:
                p.grad.mul_(world)
        else:
            replicated.append(p)
    distributed.sum_gradients(replicated)


def is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


@torch.no_grad()
def refresh_full_copy(sharded: nn.Module, full: nn.Module) -> None:
    """Load the gathered full weights of ``sharded`` into its unsharded copy ``full`` (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True))
    full.load_state_dict(state)


def served(policy: M, full: list[M]) -> M:
    """The policy the engine runs: ``policy`` itself, or under sharded training its unsharded copy, refreshed with
    the gathered weights (a collective: every rank calls it)."""
    if not full:
        return policy
    refresh_full_copy(policy, full[0])
    return full[0]


def shard_for_training(policy: nn.Module, critic: nn.Module | None, mesh: Any) -> Any:
    """Shard the policy and the critic (FSDP2) over ``mesh`` and return an unsharded copy of the policy, made
    before sharding, for the engine (see the module docstring)."""
    full = copy.deepcopy(policy)
    shard(policy, mesh)
    if critic is not None:
        shard(critic, mesh)
    return full
