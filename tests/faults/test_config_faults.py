"""Config mistakes stop ``agentrl fit`` before any work: no model load, no hub, no MLflow store, no checkpoint.

Each case is a mistake a user makes on the command line of a smoke config. All cases run through the real CLI in
one subprocess (`fit_probe.py`: one interpreter start instead of seventeen), each in its own directory, with the
model loader wrapped so that a load that *starts* is recorded. A case passes when the run ends with an exit code,
names the key in a readable message (not jsonargparse's "Does not validate against any of the Union subtypes"
dump, not a traceback), and left no ``mlflow.db``, no ``mlruns``, no checkpoints and no model load behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# one worker runs every case through `agentrl fit` once (the module fixture `results`), not each worker
pytestmark = pytest.mark.xdist_group("config_faults")

ROOT = Path(__file__).resolve().parents[2]
RTPO = str(ROOT / "configs/smoke/rtpo.yaml")
GRPO = str(ROOT / "configs/smoke/grpo.yaml")
VLLM = ["--model.engine.class_path", "agentrl.engines.vllm.VLLMEngineSpec"]

# name: (config, arguments, text the error must contain)
CASES: dict[str, tuple[str, list[str], str]] = {
    "negative-lr": (RTPO, ["--model.optim.lr=-1e-3"], "optim.lr"),
    "group-size-0": (GRPO, ["--model.algorithm.init_args.group_size", "0"], "group_size"),
    "clip-low-1.5": (RTPO, ["--model.algorithm.init_args.ppo.clip_low", "1.5"], "ppo.clip_low"),
    "temperature-negative": (RTPO, ["--data.sampling.temperature", "-1"], "sampling.temperature"),
    "episode-timeout-0": (RTPO, ["--data.episode_timeout", "0"], "data.episode_timeout"),
    "steps-0": (RTPO, ["--data.steps", "0"], "data.steps"),
    "checkpoint-every-negative": (RTPO, ["--checkpoint.every_n_steps", "-1"], "checkpoint.every_n_steps"),
    "tracking-every-negative": (RTPO, ["--tracking.every_n_steps", "-1"], "tracking.every_n_steps"),
    "env-low-above-high": (RTPO, ["--data.agent.init_args.env.init_args.low", "9",
                                  "--data.agent.init_args.env.init_args.high", "3"], "env.high"),
    "url-without-scheme": (RTPO, [*VLLM, "--model.engine.init_args.base_urls", "[127.0.0.1:8000]"],
                           "engine.base_urls"),
    "batch-not-whole-groups": (GRPO, ["--data.batch_size", "5"], "data.batch_size"),
    "max-failed-fraction-1.5": (RTPO, ["--data.max_failed_fraction", "1.5"], "data.max_failed_fraction"),
    "typo-model-name": (RTPO, ["--model.policy.init_args.model", "HuggingFaceTB/SmolLM2-135M-Instruc"],
                        "model 'HuggingFaceTB/SmolLM2-135M-Instruc'"),
    "lora-rank-0": (RTPO, ["--model.policy.init_args.lora", "{r: 0}"], "lora.r"),
    "micro-batch-tokens-0": (RTPO, ["--model.micro_batch_tokens", "0"], "micro_batch_tokens"),
    "kl-without-lora": (RTPO, ["--model.algorithm.init_args.ppo.kl_coef", "0.1"], "kl_coef"),
    "max-tokens-0": (RTPO, ["--data.sampling.max_tokens", "0"], "sampling.max_tokens"),
    "vllm-raw-logprobs-at-temperature-0.7": (str(ROOT / "configs/rtpo_vllm.yaml"),
                                             ["--model.engine.init_args.logprobs_mode", "raw_logprobs"],
                                             "model.engine.init_args.logprobs_mode"),
    "correction-cap-0.5": (RTPO, ["--model.algorithm.init_args.ppo.correction_cap", "0.5"], "ppo.correction_cap"),
    "compute-dtype-float16": (RTPO, ["--model.policy.init_args.compute_dtype", "float16"], "compute_dtype"),
    # issue 29, item 4: not stopped before the model load, or not by name, before
    "eval-every-without-eval-episodes": (RTPO, ["--data.eval_every", "2"], "data.eval_every"),
    "eval-every-tokens-without-eval-episodes": (RTPO, ["--data.eval_every_tokens", "100"], "data.eval_every_tokens"),
    "eval-greedy-without-eval-episodes": (RTPO, ["--data.eval_greedy", "true"], "data.eval_greedy"),
    "max-tokens-beyond-the-context": (RTPO, ["--data.sampling.max_tokens", "1000000"], "data.sampling.max_tokens"),
    "peak-flops-negative": (RTPO, ["--model.peak_flops=-1"], "model.peak_flops"),
    "peak-flops-0": (RTPO, ["--model.peak_flops", "0"], "model.peak_flops"),
    "lora-target-the-model-lacks": (RTPO, ["--model.policy.init_args.lora", "{r: 8, target_modules: [c_attn]}"],
                                    "lora.target_modules"),
    "accumulate-grad-batches-2": (RTPO, ["--trainer.accumulate_grad_batches", "2"], "trainer.accumulate_grad_batches"),
    "ckpt-path-missing": (RTPO, ["--ckpt_path", "/nonexistent/step-000003.ckpt"], "ckpt_path"),
    "checkpoint-dirpath-is-a-file": (RTPO, ["--checkpoint.dirpath", str(ROOT / "pyproject.toml")],
                                     "checkpoint.dirpath"),
    "lr-nan": (RTPO, ["--model.optim.lr", "nan"], "model.optim.lr"),
    "lr-fast": (RTPO, ["--model.optim.lr", "fast"], "model.optim.lr"),
    "temperature-nan": (RTPO, ["--data.sampling.temperature", "nan"], "data.sampling.temperature"),
    "max-grad-norm-nan": (RTPO, ["--model.optim.max_grad_norm", "nan"], "model.optim.max_grad_norm"),
    "lora-unknown-key": (RTPO, ["--model.policy.init_args.lora", "{r: 8, bogus: 1}"], "bogus"),
    "seed-everything-abc": (RTPO, ["--seed_everything", "abc"], "seed_everything"),
    "correction-cap-inf": (RTPO, ["--model.algorithm.init_args.ppo.correction_cap", "inf"], "ppo.correction_cap"),
    "logger-timeout-0": (RTPO, ["--trainer.logger.init_args.timeout_s", "0"], "timeout_s"),
    # item 7: an unreadable checkpoint (made by the fixture under {base}) is one line naming the loadable one
    "ckpt-path-truncated": (RTPO, ["--ckpt_path", "{base}/ckpts/step-000002.ckpt"],
                            "step-000002.ckpt is not a torch checkpoint"),
    "ckpt-path-last-planted-pickle": (RTPO, ["--checkpoint.dirpath", "{base}/ckpts", "--ckpt_path", "last"],
                                      "the newest loadable checkpoint beside it is {base}/ckpts/step-000001.ckpt"),
}


def _checkpoints(folder: Path) -> None:
    """A loadable step 1, a truncated step 2, and a ``last.ckpt`` holding a pickle that safe loading refuses."""
    import torch

    folder.mkdir()
    torch.save({"state_dict": {"w": torch.zeros(64)}}, folder / "step-000001.ckpt")
    whole = (folder / "step-000001.ckpt").read_bytes()
    (folder / "step-000002.ckpt").write_bytes(whole[: len(whole) // 2])
    torch.save({"hook": print}, folder / "last.ckpt")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    base = tmp_path_factory.mktemp("faults")
    _checkpoints(base / "ckpts")
    cases = {}
    for name, (config, args, _) in CASES.items():
        cwd = base / name
        cwd.mkdir()
        cases[name] = {"cwd": str(cwd), "args": ["--config", config, *(a.replace("{base}", str(base)) for a in args)]}
    (base / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fit_probe.py")), str(base / "cases.json"),
                           str(base / "out.json")], capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, dict[str, Any]] = json.loads((base / "out.json").read_text())
    for name, record in out.items():
        record["cwd"] = cases[name]["cwd"]
        record["expected"] = CASES[name][2].replace("{base}", str(base))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_config_mistake_stops_before_any_work_naming_the_key(results: dict[str, dict[str, Any]], name: str) -> None:
    record = results[name]
    output = record["stderr"] + record["stdout"]
    assert record["code"] not in (0, None, "exception"), output[-2000:]
    assert record["expected"] in output, output[-2000:]
    assert "weights_only=False" not in output
    assert "Does not validate against any of the Union subtypes" not in output
    assert "Traceback" not in output
    assert len(record["stderr"].strip().splitlines()) == 1, record["stderr"][-2000:]  # one line, no usage dump
    assert record["model_loads"] == [], f"a model load started: {record['model_loads']}"
    cwd = Path(record["cwd"])
    left = sorted(p.name for p in cwd.iterdir())
    assert left == [], f"the failed run left {left} behind (MLflow store or checkpoints)"
