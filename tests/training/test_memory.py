"""Memory hand-offs around an update (`agentrl.training.update.memory`): the update does not hold the rollouts' prefix
KV, the next rollouts do not hold the update's gradients, and freed pages go back to the OS on glibc."""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl import cli
from agentrl.models.memory import KERNEL_CACHE_CAPACITY, PeakRise, bound_kernel_caches, release_memory, resident_mib
from agentrl.runview import StepProgress
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.update.settings import PPOSettings
from tests.training.helpers import fit, guess_data, make_module


def test_the_update_holds_no_rollout_kv_and_leaves_no_gradients() -> None:
    module = make_module(GRPO(group_size=2, ppo=PPOSettings(epochs=1)))
    kv_before: list[int] = []
    kv_during: list[int] = []
    grads_after: list[int] = []
    original = module.update

    def update(*args: Any, **kwargs: Any) -> dict[str, float]:
        kv_before.append(module.session.engine._prefix.tokens)  # type: ignore[attr-defined]
        out = original(*args, **kwargs)
        grads_after.append(sum(p.grad is not None for p in module.parameters()))
        return out

    def training_forward(*_: Any) -> None:
        if torch.is_grad_enabled():  # not the engine's or the scoring passes
            kv_during.append(module.session.engine._prefix.tokens)  # type: ignore[attr-defined]

    module.update = update  # type: ignore[method-assign]
    hook = module.policy.backbone.register_forward_pre_hook(training_forward)
    try:
        fit(module, guess_data(batch_size=2, steps=2))
    finally:
        hook.remove()
    assert len(kv_before) == 2 and all(t > 0 for t in kv_before)  # the rollouts left reusable KV behind
    assert kv_during and set(kv_during) == {0}  # dropped before the update's forward passes
    assert grads_after == [0, 0]  # gradients freed after each update


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not Path("/proc/self/statm").exists(),
                    reason="malloc_trim and /proc/self/statm are glibc's and Linux's")
def test_release_memory_gives_freed_heap_pages_back_on_glibc() -> None:
    """At least 64 MiB of small tensors (heap chunks, not mmaps) freed with every 64th one kept, the last included:
    glibc can give nothing back by itself (no free chunk reaches the top of the heap), so the resident set stays up
    until `release_memory`'s ``malloc_trim`` returns the free pages between the kept tensors."""
    release_memory()
    base = _resident_bytes()
    blocks: list[torch.Tensor] = []
    # 1 KiB each, until the resident set has grown by 64 MiB: free chunks that earlier tests left resident in the
    # heap (small bins malloc_trim cannot return) are reused first, so a fixed count can grow it by less (46.7 MiB
    # for 64 MiB of tensors in one full-suite worker)
    while _resident_bytes() - base < 64 * 2**20 and len(blocks) < 512 * 1024:
        blocks += [torch.ones(256) for _ in range(4096)]
    grown = _resident_bytes() - base
    kept = blocks[63::64]
    count = len(blocks)
    del blocks
    held = _resident_bytes() - base
    assert grown >= 64 * 2**20 and held >= 0.9 * grown  # freed, but still resident: free() alone returned nothing
    assert release_memory() is True
    returned = held - (_resident_bytes() - base)
    assert returned >= 48 * 2**20, f"{returned / 2**20:.1f} MiB of {held / 2**20:.1f} MiB went back"
    assert len(kept) == count // 64


def test_resident_mib_reads_the_resident_set_and_its_peak(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  4194304 kB\nVmRSS:\t  1048576 kB\nThreads:\t3\n")
    assert resident_mib(status) == (1024.0, 4096.0)  # kB -> MiB, now and peak
    assert resident_mib(tmp_path / "missing") is None
    status.write_text("Name:\tpython\n")  # no Vm* lines (a kernel thread): no figures, no error
    assert resident_mib(status) is None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmRSS and VmHWM are Linux's")
def test_resident_mib_sees_a_touched_allocation_in_the_resident_set_and_the_peak() -> None:
    before = resident_mib()
    assert before is not None and 0 < before[0] <= before[1]
    block = torch.ones(256 * 2**20 // 4)  # 256 MiB, written: resident
    during = resident_mib()
    assert during is not None
    assert during[0] - before[0] >= 240 and during[1] >= during[0]
    del block
    release_memory()
    after = resident_mib()
    # the peak keeps the high-water mark (the kernel updates it from per-thread counters: it may lag by a few pages)
    assert after is not None and after[1] - before[0] >= 240 and after[0] < during[0]


def test_onednn_kernel_caches_are_capped_unless_the_user_sized_them() -> None:
    env: dict[str, str] = {}
    bound_kernel_caches(env)
    assert env == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"} and KERNEL_CACHE_CAPACITY == 64
    env = {"LRU_CACHE_CAPACITY": "512"}
    bound_kernel_caches(env)
    assert env == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "512"}
    env = {"DNNL_PRIMITIVE_CACHE_CAPACITY": "8"}  # oneDNN's older name, read after the new one: left to decide
    bound_kernel_caches(env)
    assert env == {"DNNL_PRIMITIVE_CACHE_CAPACITY": "8", "LRU_CACHE_CAPACITY": "64"}


def test_the_agentrl_command_caps_the_kernel_caches_first(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """oneDNN reads its cache sizes once, at its first kernel: the command sets them before any subcommand runs."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.setenv(name, "")  # recorded, so the values set below are undone after the test
        monkeypatch.delenv(name)
    assert cli.main([]) == 0
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == os.environ["LRU_CACHE_CAPACITY"] == "64"


def test_peak_rise_charges_each_rise_of_the_peak_to_the_phase_that_ended() -> None:
    peaks = iter([1000.0, 1000.0, 1200.0, 1250.0, 1250.0, 1400.0, 1400.0, 1500.0])
    account = PeakRise(read=lambda: (0.0, next(peaks)))  # opens at 1000
    progress = StepProgress()
    progress.on_boundary(account.boundary)
    with progress.phase("collecting"):  # start: 1000 (no rise), end: 1200 -> collecting +200
        pass
    # updating's start: 1250 -> +50 between phases; scoring's start: 1250, its end: 1400 -> scoring +150
    with progress.phase("updating"), progress.phase("scoring"):
        pass
    # the update's end: 1400, no rise (its nested scoring set the peak)
    assert account.take("collecting", "scoring", "updating", "between") == {
        "collecting": 200.0, "scoring": 150.0, "updating": 0.0, "between": 50.0}
    assert account.take("collecting", "scoring") == {"collecting": 0.0, "scoring": 0.0}  # taken: reset
    account.boundary("evaluating")  # 1500: +100
    assert account.take("evaluating", "updating") == {"evaluating": 100.0, "updating": 0.0}
    nothing = PeakRise(read=lambda: None)  # no procfs: nothing is ever charged
    nothing.boundary("updating")
    assert nothing.take("updating") == {"updating": 0.0}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_peak_rise_charges_a_real_allocation_to_its_phase() -> None:
    # a fresh interpreter: this test process's peak may already sit far above its resident set
    script = (
        "import torch\n"
        "from agentrl.models.memory import PeakRise, release_memory\n"
        "from agentrl.runview import StepProgress\n"
        "account, progress = PeakRise(), StepProgress()\n"
        "progress.on_boundary(account.boundary)\n"
        "with progress.phase('collecting'):\n"
        "    small = torch.ones(2**20)\n"
        "with progress.phase('updating'):\n"
        "    block = torch.ones(256 * 2**20 // 4)\n"
        "    del block\n"
        "release_memory()\n"
        "with progress.phase('scoring'):\n"
        "    again = torch.ones(128 * 2**20 // 4)\n"  # under the update's peak: charged nothing
        "print(account.take('collecting', 'updating', 'scoring'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    charged = ast.literal_eval(out.strip().splitlines()[-1])
    assert 240 <= charged["updating"] <= 280, charged
    assert charged["collecting"] < 20 and charged["scoring"] < 20, charged
