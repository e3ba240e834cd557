"""Seeds derived from names: the same parts give the same seed in every process (unlike ``hash``).

Episode sampling seeds come from (step, task, sample), minibatch orders from (seed, step, tag): a run and its resume
make the same rollouts and updates (CONVENTIONS rule 12)."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
