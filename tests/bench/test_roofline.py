"""`benchmarks/roofline.py`: the decode-step floor arithmetic, by hand, and a tiny run's result file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import roofline


def test_smollm2_parameters_by_hand() -> None:
    # per layer: q, o 576x576; k, v 576x192; gate, up, down 576x1536; two norms of 576. Tied embedding 49152x576.
    layer = 2 * 331_776 + 2 * 110_592 + 3 * 884_736 + 2 * 576
    assert layer == 3_540_096
    assert roofline.smollm2_parameters() == 30 * layer + 576 + 28_311_552 == 134_515_008  # "135M"


def test_the_floors_follow_the_measurements() -> None:
    """Weight bytes over the best read bandwidth of large tensors (a small, cached tensor's is not used); the
    matmul floor is 30 layers of (2 q/o + 2 k/v + 2 gate/up + 1 down) plus one LM head."""
    sums = [{"threads": 1, "op": "sum (read)", "mib": 32, "gb_per_s": 50.0},  # in the cache: ignored
            {"threads": 1, "op": "sum (read)", "mib": 512, "gb_per_s": 10.0}]
    ms = {"q/o 576->576": 1.0, "k/v 576->192": 0.5, "gate/up 576->1536": 2.0, "down 1536->576": 3.0,
          "lm_head 576->49152": 7.0}
    mm = [{"threads": 1, "kind": "decode", "dtype": d, "m": m, "name": name, "ms": t}
          for d in ("float32", "bfloat16") for m in (12, 16) for name, t in ms.items()]
    out = roofline.floors({"bandwidth": sums, "matmul": mm}, 1)
    assert out["read_gb_per_s"] == 10.0
    assert out["float32"]["bandwidth_floor_ms"] == pytest.approx(134_515_008 * 4 / 10e9 * 1e3)  # 53.8 ms
    assert out["bfloat16"]["bandwidth_floor_ms"] == pytest.approx(134_515_008 * 2 / 10e9 * 1e3)
    assert out["float32"]["matmul_sum_ms"][12] == pytest.approx(30 * (2 + 1 + 4 + 3) + 7)  # 307 ms


def test_a_tiny_run_writes_the_table_and_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "roofline.json"
    roofline.main(["--threads", "1", "--mib", "1", "--repeats", "1", "--min-seconds", "0", "--cold-mib", "0",
                   "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["cpu"]["flags"]) == {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert len(result["matmul"]) == 2 * (5 * 6 + 3) and all(r["gflop_per_s"] > 0 for r in result["matmul"])
    assert result["decode_floor"][0]["float32"]["weight_mb"] == pytest.approx(538.06, abs=0.01)
