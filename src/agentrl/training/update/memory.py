"""Memory hand-offs around an update: what the rollouts held is given back before the update's peak, and what
the update held (activations, gradients) before the next rollouts.

The trainer's peak is the update (weights, gradients, AdamW state, activations of one micro-batch). Before it,
the embedded engine's prefix KV cache is dropped (the update makes it stale; the weight push would drop it
anyway), its weight copy's storage is freed when no collection is in flight (the push after the update allocates
it again) and freed heap pages go back to the OS (`agentrl.models.memory.release_memory`). After it, the gradients
are freed (the next minibatch would reset them anyway) and the pages are given back again, so the rollouts that
follow, which run in engine worker threads with their own allocator arenas, do not stack on top of them.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from agentrl.models.memory import release_memory


def before_update(release_engine: Callable[[], None]) -> None:
    """Have the engine give back what the update does not need (its prefix cache, stale once the weights change;
    its weight copy while nothing is generated) and return freed memory."""
    release_engine()
    release_memory()


def after_update(*trained: nn.Module | None) -> None:
    """Free the gradients of the ``trained`` modules (the next minibatch starts by resetting them) and return
    freed memory."""
    for module in trained:
        if module is not None:
            module.zero_grad(set_to_none=True)
    release_memory()
