"""The ``agentrl fit`` keys people change most, and command-line forms jsonargparse would misread.

Kept free of heavy imports: ``agentrl --help`` shows `COMMON_KEYS` without loading torch or Lightning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

COMMON_KEYS = """\
Common keys of `agentrl fit` (`agentrl fit --help` lists them all; every key works the same way):
  --config FILE                            a YAML config; configs/rtpo.yaml is the main job
  --model.policy.init_args.model NAME      smollm2-135m-instruct (default, offline), tiny-random, a model
                                           folder, a .gguf file or a Hugging Face hub id
  --data.steps N                           RL steps of the run
  --data.batch_size N                      episodes per step (whole groups of the algorithm)
  --model.algorithm NAME                   RTPO (default), TurnPPO, GRPO or TokenPPO (or a full class path);
                                           --model.algorithm.help RTPO lists its keys
  --model.algorithm.init_args.group_size G episodes per group (GRPO) or G-1 siblings per turn (RTPO)
  --model.optim.lr LR                      policy learning rate
  --model.engine.class_path agentrl.engines.vllm.VLLMEngineSpec --model.engine.init_args.base_urls
    '[http://127.0.0.1:8000]'              roll out on vLLM (or `agentrl serve`) servers instead of in process
  --trainer.logger.init_args.run_name NAME MLflow run name (default: <algorithm>-<task>-s<seed>)
  --ckpt_path last                         resume the run from its last checkpoint
  --print_config                           print the resolved config and exit
Values: `--key null` sets None; negative numbers work as `--key -1e-3` or `--key=-1e-3`.
Every value is checked before the model loads. AGENTRL_VERBOSE=1 shows the libraries' own output.
"""

_NULLS = {"null", "~", "none", "None", "Null", "NULL"}


def _is_negative_number(token: str) -> bool:
    if not token.startswith("-") or token.startswith("--"):
        return False
    try:
        value = float(token)
    except ValueError:
        return False
    return not math.isnan(value)


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Rewrite two command-line forms that jsonargparse misreads, keeping their meaning.

    * ``--key -1e-3``: argparse takes a token like ``-1e-3`` for an option; it becomes ``--key=-1e-3``.
    * ``--a.init_args.b.c null``: jsonargparse (4.53) re-parses keys below a ``class_path`` from text and turns
      None into the string ``'None'``; it becomes ``--a.init_args '{b: {c: null}}'``, which it merges correctly.
    """
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        token = args[i]
        key, value, width = token, None, 1
        if token.startswith("--") and "=" in token:
            key, value = token.split("=", 1)
        elif token.startswith("--") and i + 1 < len(args) and (
                _is_negative_number(args[i + 1]) or args[i + 1] in _NULLS):
            value, width = args[i + 1], 2
        if value is not None and value in _NULLS and ".init_args." in key:
            owner, rest = key.split(".init_args.", 1)
            nested = "null"
            for part in reversed(rest.split(".")):
                nested = f"{{{part}: {nested}}}"
            out += [f"{owner}.init_args", nested]
        elif value is not None:
            out.append(f"{key}={value}")
        else:
            out.append(token)
        i += width
    return out


_STRUCTURE = ("Parser key", "Key \"", "Does not validate", "Subtypes:", "Errors:", "Problem with given class_path",
              "Given value", "Expected a <class 'NoneType'>", "- Expected a <class 'NoneType'>")


def _plain_types(text: str) -> str:
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    return re.sub(r"a typing\.Literal\[(.*)\]", r"one of \1", text)


def parse_error_line(message: str) -> str:
    """jsonargparse's parse error in one line, naming the key: ``model.optim.lr: expected a float, got 'fast'``
    instead of its multi-line "Does not validate against any of the Union subtypes" dump (a typed value inside
    an ``X | None`` field, such as ``optim``, ``sampling`` or ``lora``, is reported that way)."""
    keys = re.findall(r'(?:Parser key|Key) "([^"]+)"', message)
    lines = [line.strip().removeprefix("- ").strip() for line in message.splitlines()]
    details = [line for line in lines if line and not line.startswith(_STRUCTURE)]
    given = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")), None)
    if details and all(d.startswith("Expected a") for d in details) and "Got value" not in details[0]:
        types = " or ".join(_plain_types(d.removeprefix("Expected a").strip().rstrip(".")) for d in details)
        detail = f"expected {types}" + (f", got {given!r}" if given is not None else "")
    elif details:
        detail = _plain_types(details[0]).replace("Expected ", "expected ", 1).replace(". Got value:", ", got")
    else:
        detail = " ".join(message.split())
    where = ".".join(dict.fromkeys(keys))
    return f"{where}: {detail}" if where else detail
