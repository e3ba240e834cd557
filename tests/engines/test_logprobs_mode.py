"""vLLM's log-prob mode against the sampling temperature: refused before any rollout with a named error, checked
against a server's ``/server_info`` where it answers, and ``configs/rtpo_vllm.yaml`` at temperature 0.7 running for
real against ``agentrl serve`` over HTTP (declared ``processed_logprobs``) with the mismatch metrics logged."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agentrl.engines.base import SamplingParams
from agentrl.engines.logprobs_mode import KEY, LogprobsModeError
from agentrl.engines.vllm import VLLMEngine, VLLMEngineSpec
from tests.support.server import LORA_ARGS, Server, start_server

ROOT = Path(__file__).resolve().parents[2]
T07 = SamplingParams(max_tokens=4, temperature=0.7)


def test_raw_mode_at_temperature_07_is_refused_before_any_request(served: Server) -> None:
    engine = VLLMEngine([served.url], api_key=served.api_key, retries=0)  # raw_logprobs: vLLM's default
    before = served.output(tail=None).count("POST /v1/completions")
    with pytest.raises(LogprobsModeError, match=KEY):
        asyncio.run(engine.preflight(T07))
    with pytest.raises(LogprobsModeError, match="processed_logprobs"):
        asyncio.run(engine.generate([5, 6, 7], T07))
    assert served.output(tail=None).count("POST /v1/completions") == before  # nothing was sampled
    asyncio.run(engine.preflight(SamplingParams(temperature=1.0)))  # temperature 1: raw is the sampling dist.
    with pytest.raises(LogprobsModeError, match=KEY):
        VLLMEngineSpec([served.url]).check_sampling(T07)


def test_processed_mode_runs_at_temperature_07(served: Server) -> None:
    engine = VLLMEngine([served.url], api_key=served.api_key, retries=0, logprobs_mode="processed_logprobs")
    asyncio.run(engine.preflight(T07))  # agentrl serve has no /server_info (404): the declaration stands
    out = asyncio.run(engine.generate([5, 6, 7], T07))
    assert len(out.token_ids) == len(out.logprobs) > 0


class _ServerInfo(BaseHTTPRequestHandler):
    """Stand-in for vLLM's development endpoint ``GET /server_info`` (vLLM itself needs a GPU): it answers with
    the JSON shape vLLM's ``config_format=json`` gives, reporting ``mode``."""

    mode = "raw_logprobs"

    def do_GET(self) -> None:
        if not self.path.startswith("/server_info"):
            self.send_error(404)
            return
        body = json.dumps({"vllm_config": {"model_config": {"logprobs_mode": self.mode}}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server_info() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ServerInfo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_reported_mode_that_contradicts_the_declared_one_is_refused(server_info: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{server_info.server_address[1]}"
    engine = VLLMEngine([url], retries=0, logprobs_mode="processed_logprobs")
    _ServerInfo.mode = "raw_logprobs"
    with pytest.raises(LogprobsModeError, match="runs with --logprobs-mode raw_logprobs"):
        asyncio.run(engine.preflight(T07))
    _ServerInfo.mode = "processed_logprobs"
    asyncio.run(engine.preflight(T07))


def test_an_unknown_mode_names_the_key() -> None:
    with pytest.raises(ValueError, match=KEY):
        VLLMEngineSpec(["http://127.0.0.1:1"], logprobs_mode="processed")  # type: ignore[arg-type]


def test_the_shipped_config_samples_at_07_with_the_processed_mode() -> None:
    cfg = yaml.safe_load((ROOT / "configs/rtpo_vllm.yaml").read_text())
    assert cfg["data"]["sampling"]["temperature"] == 0.7
    assert cfg["model"]["engine"]["init_args"]["logprobs_mode"] == "processed_logprobs"


def _fit(tmp_path: Path, server: Server, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["--model.policy.init_args.model", "tiny-random", "--model.engine.init_args.base_urls", f"[{server.url}]",
            "--trainer.accelerator", "cpu", "--data.batch_size", "2", "--data.steps", "1",
            "--data.sampling.max_tokens", "6", "--model.peak_flops", "1e11", "--checkpoint.dirpath", "ckpt", *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", "--config", str(ROOT / "configs/rtpo_vllm.yaml"),
                           *args], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_rtpo_vllm_config_at_07_trains_through_agentrl_serve(tmp_path: Path) -> None:
    server = start_server(tmp_path, *LORA_ARGS)
    try:
        (tmp_path / "raw").mkdir()
        refused = _fit(tmp_path / "raw", server, "--model.engine.init_args.logprobs_mode", "raw_logprobs")
        assert refused.returncode != 0
        assert KEY in refused.stderr and not (tmp_path / "raw" / "mlflow.db").exists()  # stopped before work
        proc = _fit(tmp_path, server)
        assert proc.returncode == 0, proc.stderr[-4000:] + server.output()
        with sqlite3.connect(tmp_path / "mlflow.db") as con:
            logged = dict(con.execute("SELECT key, value FROM metrics WHERE key LIKE 'rollout/%'").fetchall())
        # π_old recomputed at T = 0.7 by the trainer; agentrl serve reported log-probs after temperature too
        assert 0 <= logged["rollout/logprob_mismatch_kl"] < 1e-6
        assert logged["rollout/logprob_max_abs_diff"] < 1e-3
        assert logged["rollout/is_corrected_frac"] == 0.0
    finally:
        server.stop()
