"""The vLLM-CPU server settings of ``agentrl vllm-serve`` (no server): the KV cache size reaches vLLM as an integer
``VLLM_CPU_KVCACHE_SPACE`` or, for a fraction of a GiB, as ``--kv-cache-memory-bytes`` with the variable unset
(vLLM reads the variable with ``int()``, so ``0.5`` crashed the server at start, and the variable overrides the
flag)."""

from __future__ import annotations

import pytest

from agentrl.serve.vllm_cpu import kv_cache_flags, server_env


def test_whole_gib_go_in_the_variable() -> None:
    env = server_env(2.0, base={}, cpus=[0, 1])
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert kv_cache_flags(2.0) == []


def test_a_fraction_of_a_gib_is_a_flag_and_the_variable_is_unset() -> None:
    env = server_env(0.25, base={"VLLM_CPU_KVCACHE_SPACE": "4"}, cpus=[1])
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert kv_cache_flags(0.25) == ["--kv-cache-memory-bytes", str(256 << 20)]


@pytest.mark.parametrize("size", [0, -1.0])
def test_no_cache_is_refused(size: float) -> None:
    with pytest.raises(ValueError, match=r"--kv-cache-gib must be > 0 \(GiB of KV cache\), got"):
        kv_cache_flags(size)
