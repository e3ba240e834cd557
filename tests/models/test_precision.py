"""The dtype rule (`agentrl.models.precision`): ``auto`` follows the device's native bf16 support, never a timing;
an explicit bf16 on a CPU without native bf16 is refused by preflight before the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.models import precision
from agentrl.models.policy import Policy
from agentrl.models.precision import Bf16Support, auto_compute_dtype, cpu_bf16_support, resolve_auto

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs/smoke/grpo.yaml")
CPU = torch.device("cpu")
EPYC_AVX2 = Bf16Support(False, "CPU AMD EPYC 7B13 has no native bf16 (none of avx512_bf16, amx_bf16)")
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

# the first processor of /proc/cpuinfo on three machines (trimmed): AVX2-only, AVX-512 BF16 + AMX, Arm with BF16
CPUINFO = {
    "epyc-avx2": ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
                  "flags\t\t: fpu sse sse2 avx avx2 fma bmi2\n\nprocessor\t: 1\nmodel name\t: other\n"
                  "flags\t\t: avx512_bf16\n"),
    "sapphire-rapids": ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                        "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"),
    "graviton3": "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd sve bf16 i8mm\nCPU part\t: 0xd40\n",
}


def _simulate(monkeypatch: pytest.MonkeyPatch, support: Bf16Support) -> list[str]:
    """Replace the CPU probe; return the list its calls are recorded in."""
    calls: list[str] = []

    def probe() -> Bf16Support:
        calls.append("probe")
        return support

    monkeypatch.setattr(precision, "cpu_bf16_support", probe)
    return calls


@pytest.mark.parametrize("machine,native,reason", [
    ("epyc-avx2", False, "CPU AMD EPYC 7B13 has no native bf16"),  # the second processor's flags are not read
    ("sapphire-rapids", True, "CPU Intel(R) Xeon(R) Platinum 8480+ has avx512_bf16, amx_bf16"),
    ("graviton3", True, "has bf16"),
])
def test_the_probe_reads_the_cpu_flags(machine: str, native: bool, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO[machine])
    support = cpu_bf16_support(str(path))
    assert support.native is native and reason in support.reason


def test_auto_is_fp32_without_native_bf16_and_bf16_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same answer on every call (no timing, nothing remembered that load could have changed)."""
    calls = _simulate(monkeypatch, EPYC_AVX2)
    assert [auto_compute_dtype(CPU, 576) for _ in range(3)] == [torch.float32] * 3  # SmolLM2-135M's width
    assert resolve_auto(CPU, 576).reason == EPYC_AVX2.reason and len(calls) == 4
    _simulate(monkeypatch, Bf16Support(True, "CPU X has avx512_bf16"))
    assert resolve_auto(CPU, 576) == (torch.bfloat16, "CPU X has avx512_bf16")
    calls = _simulate(monkeypatch, Bf16Support(True, "CPU X has avx512_bf16"))
    assert auto_compute_dtype(CPU, 64) == torch.float32 and calls == []  # narrow models: fp32, no probe
    policy = Policy("tiny-random")
    assert policy.compute_dtype == torch.float32 and "always float32" in policy.resolved_compute_dtype.reason
    assert Policy("tiny-random", compute_dtype="bfloat16").resolved_compute_dtype == (torch.bfloat16,
                                                                                       "set in the config")
    with pytest.raises(ValueError, match="policy.compute_dtype"):
        Policy("tiny-random", compute_dtype="float16")  # type: ignore[arg-type]


def test_an_unknown_device_type_is_fp32() -> None:
    assert resolve_auto(torch.device("meta"), 576).dtype == torch.float32


@pytest.mark.parametrize("key", ["compute_dtype", "dtype"])
def test_an_explicit_bf16_is_refused_before_the_model_loads(key: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl
    from agentrl.training.command.preflight import ConfigError

    _simulate(monkeypatch, EPYC_AVX2)
    loads: list[Any] = []
    monkeypatch.setattr("agentrl.models.policy.load_model", lambda *a, **k: loads.append(a))
    monkeypatch.setattr("agentrl.training.command.cli.quiet_libraries", lambda: None)  # keep this process's logging
    monkeypatch.delenv(precision.ALLOW_SLOW_BF16, raising=False)
    monkeypatch.chdir(tmp_path)
    message = (rf"^model.policy.init_args.{key} is bfloat16, but CPU AMD EPYC 7B13 has no native bf16 \(none of "
               r"avx512_bf16, amx_bf16\): a bf16 matmul falls to a reference kernel there \(measured 1.2 GFLOP/s "
               r"against 29 in fp32 .*; use float32 or auto \(or set AGENTRL_ALLOW_SLOW_BF16=1")
    with pytest.raises(ConfigError, match=message):
        agentrl.fit(SMOKE, model={"policy": {"init_args": {key: "bfloat16"}}})
    assert loads == [] and not (tmp_path / "mlflow.db").exists()


def test_auto_passes_preflight_and_the_override_lets_bf16_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.training.command.preflight import PolicyPlan, check_bf16

    _simulate(monkeypatch, EPYC_AVX2)
    monkeypatch.delenv(precision.ALLOW_SLOW_BF16, raising=False)
    check_bf16(PolicyPlan("tiny-random", False), "cpu")  # auto / float32: never refused
    bf16 = PolicyPlan("tiny-random", False, compute_dtype="bfloat16")
    with pytest.raises(ValueError, match="model.policy.init_args.compute_dtype is bfloat16"):
        check_bf16(bf16, "auto" if not torch.cuda.is_available() else "cpu")
    monkeypatch.setenv(precision.ALLOW_SLOW_BF16, "1")
    check_bf16(bf16, "cpu")
    monkeypatch.delenv(precision.ALLOW_SLOW_BF16)
    _simulate(monkeypatch, Bf16Support(True, "CPU X has amx_bf16"))
    check_bf16(bf16, "cpu")  # native bf16: an explicit bf16 runs
    if not torch.cuda.is_available():
        check_bf16(bf16, "gpu")  # no GPU here: Lightning says so, not a bf16 message


def test_cpu_identity_names_the_model_and_the_isa_flags() -> None:
    identity = precision.cpu_identity()
    assert identity["model"] and set(identity["flags"]) == set(precision.ISA_FLAGS)
    assert all(isinstance(v, bool) for v in identity["flags"].values())


def test_every_benchmark_result_names_the_cpu() -> None:
    """Each ``"machine"`` a benchmark writes has the CPU identity beside it, from the one helper (issue 31)."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    for script in scripts:
        text = script.read_text()
        # every machine with its CPU beside it (a script may name the CPU more often: per run, as async.py does)
        assert text.count('"machine":') <= text.count('"cpu": cpu_identity()'), script.name
    assert sum('"cpu": cpu_identity()' in s.read_text() for s in scripts) >= 7
