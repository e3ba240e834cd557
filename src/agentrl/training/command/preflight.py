"""Check a parsed ``agentrl fit`` config before any work: no model weights, no hub, no MLflow run until it is good.

jsonargparse checks types while parsing, but value checks live in the config's own classes (``__post_init__`` of
the settings dataclasses, ``__init__`` of schedules, environments, engine specs, the data module), which run only
when the classes are built, and LightningCLI builds the model (loading its weights) and the MLflow logger
(creating its store) first. `preflight` therefore builds every cheap part of the config once, with jsonargparse's
own instantiation, swapping in stand-ins for the three expensive parts:

* the `Policy`: its model name is resolved without loading weights (`check_model_spec`: a typo'd hub id fails in
  about a second, offline at once);
* the `AgentRLModule`: its arguments are checked together (`AgentRLModule.check_args`) without building a critic;
* the loggers: not created (an MLflow logger creates its store when built).

Then it runs the checks that span parts (the batch must hold whole groups of the algorithm; a vLLM engine's declared
log-prob mode must report the sampling temperature's distribution, `agentrl.engines.logprobs_mode`; an explicit
bf16 needs a device with native bf16 matmuls, `agentrl.models.precision`). A wrong value
raises `ConfigError` naming the key; jsonargparse's "Does not validate against any of the Union subtypes" wrapping (from
``OptimSettings | None`` and similar) is unwrapped to the class's own message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.loggers import Logger

from agentrl.engines.specs import HFEngineSpec
from agentrl.models.facts import model_context, module_names
from agentrl.models.loading import SMOLLM2, check_model_spec
from agentrl.models.policy import Policy
from agentrl.models.precision import check_explicit_bf16
from agentrl.training.rollout.async_collect import check_async
from agentrl.training.system.checkpoint_io import CheckpointError, check_checkpoint
from agentrl.training.system.module import AgentRLModule


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and what was expected."""


@dataclass
class PolicyPlan:
    """What the checks need to know about the policy, without its weights."""

    model: str
    uses_lora: bool
    dtype: str = "float32"
    compute_dtype: str = "auto"


@dataclass
class ModulePlan:
    """The checked arguments of `AgentRLModule`, without building it."""

    policy: PolicyPlan
    algorithm: Any
    engine: Any = None


def class_keys(cfg: Any, prefix: str = "") -> dict[str, str]:
    """``{class_path: config key}`` of every ``class_path`` in a parsed config (the first key wins)."""
    out: dict[str, str] = {}
    items = cfg.items() if isinstance(cfg, dict) else vars(cfg).items() if isinstance(cfg, Namespace) else []
    for key, value in items:
        path = f"{prefix}{key}"
        if key == "class_path" and isinstance(value, str):
            out.setdefault(value, prefix[:-1])
        elif isinstance(value, Namespace | dict):
            for cls, where in class_keys(value, f"{path}.").items():
                out.setdefault(cls, where)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                for cls, where in class_keys(item, f"{path}[{i}].").items():
                    out.setdefault(cls, where)
    return out


def preflight(parser: ArgumentParser, config: Namespace, subcommand: str = "fit") -> None:
    """Build the cheap parts of ``config`` (their own checks run) and check across parts.

    Raises:
        ConfigError: the first wrong value, naming its key.
    """
    where = class_keys(config.get(subcommand, config))
    errors: list[str] = []

    def _located(cls: type, exc: Exception) -> str:
        # a config may name a class by a re-export (agentrl.envs.GuessNumberEnv): match the class name too
        key = where.get(f"{cls.__module__}.{cls.__qualname__}") or next(
            (k for path, k in where.items() if path.rsplit(".", 1)[-1] == cls.__qualname__), None)
        return f"{exc} (in {key}: {cls.__qualname__})" if key else f"{exc} (in {cls.__qualname__})"

    def build(cls: type, *args: Any, **kwargs: Any) -> Any:
        try:
            return cls(*args, **kwargs)
        except Exception as exc:
            errors.append(_located(cls, exc))
            raise

    def plan_policy(cls: type, model: str = SMOLLM2, **kwargs: Any) -> PolicyPlan:
        _recorded(errors, check_model_spec, model, suffix=" (key model.policy.init_args.model)")
        _recorded(errors, check_lora_targets, model, kwargs.get("lora"))
        return PolicyPlan(model=model, uses_lora=kwargs.get("lora") is not None,
                          dtype=kwargs.get("dtype", "float32"), compute_dtype=kwargs.get("compute_dtype", "auto"))

    def plan_module(cls: type, policy: PolicyPlan, algorithm: Any, **kwargs: Any) -> ModulePlan:
        _recorded(errors, AgentRLModule.check_args, policy.uses_lora, algorithm, kwargs.get("micro_batch_tokens", 4096))
        _recorded(errors, _check_peak_flops, kwargs.get("peak_flops"))
        return ModulePlan(policy=policy, algorithm=algorithm, engine=kwargs.get("engine"))

    def no_logger(cls: type, *args: Any, **kwargs: Any) -> None:
        check = getattr(cls, "check_settings", None)  # the logger's own checks, without creating its store
        if callable(check):
            _recorded(errors, check, **{k: v for k, v in kwargs.items() if k in ("timeout_s", "max_retries")})

    try:
        built = parser.instantiate(config, instantiators=[
            (plan_policy, Policy, True), (plan_module, AgentRLModule, True), (no_logger, Logger, True),
            (build, object, True),
        ])
    except Exception as exc:
        raise ConfigError(errors[-1] if errors else str(exc)) from None
    fit = built.get(subcommand, built)
    module, data = fit.get("model"), fit.get("data")
    try:
        _check_trainer(config.get(subcommand, config))
        if isinstance(module, ModulePlan):
            check_bf16(module.policy, config.get(subcommand, config).get("trainer.accelerator"), module.engine)
        if isinstance(module, ModulePlan) and hasattr(data, "configure"):
            _check_across(module, data)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _recorded(errors: list[str], check: Any, *args: Any, suffix: str = "", **kwargs: Any) -> None:
    """Run ``check``; on an error, record its message (with ``suffix``) for `ConfigError` and raise it on."""
    try:
        check(*args, **kwargs)
    except Exception as exc:
        errors.append(f"{exc}{suffix}")
        raise


def _check_across(module: ModulePlan, data: Any) -> None:
    """The batch holds whole groups; ``data.max_staleness`` >= 1 has an engine and update that allow it; a vLLM
    engine's declared log-prob mode reports the sampling temperature and its policy trains a LoRA adapter (the only
    verified weight sync); the token budget of a turn fits the model's context window."""
    data.configure(module.algorithm.episodes_per_task)
    engine = module.engine if module.engine is not None else HFEngineSpec()  # the module's default engine
    check_async(getattr(data, "max_staleness", 0), engine, getattr(module.algorithm, "ppo", None))
    check_sampling = getattr(module.engine, "check_sampling", None)
    if check_sampling is not None and hasattr(data, "sampling"):
        check_sampling(data.sampling)
    check_policy = getattr(module.engine, "check_policy", None)  # an HTTP engine syncs weights as a LoRA adapter
    if check_policy is not None:
        check_policy(module.policy.uses_lora)
    sampling = getattr(data, "sampling", None)
    context = getattr(module.engine, "max_context", None) or model_context(module.policy.model)
    if sampling is not None and context and sampling.max_tokens >= context:
        raise ValueError(f"data.sampling.max_tokens must be less than the model's context window ({context} tokens "
                         f"for {module.policy.model}), got {sampling.max_tokens}")


def check_bf16(policy: PolicyPlan, accelerator: Any, engine: Any = None) -> None:
    """An explicit bf16 (compute or weights, or the embedded engine's weight copy) on a device without native bf16
    matmuls stops here, naming the key (`agentrl.models.precision.check_explicit_bf16`); ``auto`` never does: it
    resolves to fp32 there."""
    device = _device_type(accelerator)
    if device is None:
        return
    for key, value in (("compute_dtype", policy.compute_dtype), ("dtype", policy.dtype)):
        if value == "bfloat16":
            check_explicit_bf16(f"model.policy.init_args.{key}", torch.device(device))
    if getattr(engine, "weights", None) in ("auto", "copy") and getattr(engine, "decode_dtype", None) == "bfloat16":
        check_explicit_bf16("model.engine.init_args.decode_dtype", torch.device(device))


def _device_type(accelerator: Any) -> str | None:
    """The torch device type a Lightning ``trainer.accelerator`` trains on; None where agentrl has no bf16 rule, or
    for a GPU this machine lacks (Lightning names that itself)."""
    name = str(accelerator or "auto").lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(name)
    return None if device == "cuda" and not torch.cuda.is_available() else device


def _check_peak_flops(value: Any) -> None:
    if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"model.peak_flops must be a positive number of FLOP/s or null (measured), got {value!r}")


def check_lora_targets(model: str, lora: Any) -> None:
    """LoRA ``target_modules`` (a list of names) must each name modules of the model (from its config, no weights)."""
    targets = getattr(lora, "target_modules", None)
    if not isinstance(targets, list | tuple):
        return
    names = module_names(model)
    missing = [t for t in targets if names is not None and t not in names]
    if missing:
        linear = sorted(n for n in names or () if n.endswith("_proj") and "." not in n)
        raise ValueError(f"model.policy.init_args.lora.target_modules names {missing}, which {model} does not have "
                         f"(its projections: {', '.join(linear) or 'see the model'})")


_RESUME_WORDS = ("last", "best", "hpc", "registry")  # Lightning's ckpt_path keywords


def _check_trainer(fit: Any) -> None:
    """What Lightning checks only after the model is loaded: gradient accumulation (agentrl's manual optimization
    has its own: ``ppo.minibatch_size``, ``model.micro_batch_tokens``) and the ``--ckpt_path`` file."""
    accumulate = fit.get("trainer.accumulate_grad_batches")
    if accumulate not in (None, 1):
        raise ValueError(f"trainer.accumulate_grad_batches must be 1, got {accumulate!r}: agentrl optimizes manually "
                         "(set model.algorithm.init_args.ppo.minibatch_size or model.micro_batch_tokens instead)")
    ckpt = fit.get("ckpt_path")
    if ckpt is None:
        return
    if str(ckpt) in _RESUME_WORDS:
        if str(ckpt) == "last":
            last = Path(fit.get("checkpoint.dirpath") or "checkpoints") / "last.ckpt"
            if last.is_file():
                _checked(last)
        return
    if not Path(ckpt).is_file():
        raise ValueError(f"ckpt_path: no checkpoint file {ckpt}" + (" (it is a folder)" if Path(ckpt).is_dir()
                                                                    else ""))
    _checked(Path(ckpt))


def _checked(path: Path) -> None:
    try:
        check_checkpoint(path)
    except CheckpointError as exc:
        raise ValueError(f"ckpt_path: {exc}") from None
