"""Short parser errors for ``agentrl fit``: the one message first, the key, what was expected, "did you mean".

jsonargparse reports a bad value after the whole usage (some 75 lines) and wraps it in its own nesting ("Parser
key ...: Problem with given class_path ...: Does not validate against any of the Union subtypes ..."). The
`AgentRLArgumentParser` that ``agentrl fit`` uses prints one line instead, in the form of agentrl's own config
errors (`agentrl.training.command.preflight`):

    agentrl fit: config error: unknown key data.batch_sizee (did you mean data.batch_size?)
    agentrl fit: config error: data.steps: expected int, got 'many'
    agentrl fit: config error: unknown key model.optim.lrr (did you mean model.optim.lr?)

each ending with a pointer to ``--help`` (the full usage). jsonargparse's Union dumps it does not recognise are
made one line by `agentrl.training.command.keys.parse_error_line`. ``JSONARGPARSE_DEBUG=1`` keeps jsonargparse's own
behaviour (the exception with its traceback).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

from jsonargparse import ArgumentParser
from lightning.pytorch.cli import LightningArgumentParser

from agentrl.training.command.keys import parse_error_line

_PARSER_KEY = re.compile(r'^\s*(?:- )?Parser key "([^"]+)":')
_CLASS_PATH = re.compile(r"^\s*(?:- )?Problem with given class_path '([^']+)':")
_NOT_ACCEPTED = re.compile(r"^\s*(?:- )?(?:Option|Key) '([^']+)' is not (?:accepted|expected)")
_EXPECTED = re.compile(r"^\s*(?:- )?Expected a <class '([^']+)'>\. Got value: (.*)$")
_REQUIRED = re.compile(r"^the following arguments are required: (.+)$")
_NOT_CALLABLE = re.compile(r"expects a function or a callable class: (.*)\. Got value: (.*)$")
_NOT_AN_OPTION = re.compile(r"does not accept option '([^']+)'")
_NOT_A_CLASS = re.compile(r"Expected a (?:path but|dot import path string:) (\S+)")


def parser_keys(parser: Any) -> list[str]:
    """Every ``--key`` of ``parser`` and its subcommand parsers, without the dashes."""
    keys: list[str] = []
    for action in getattr(parser, "_actions", []):
        keys += [s[2:] for s in action.option_strings if s.startswith("--")]
        for sub in (getattr(action, "_name_parser_map", None) or {}).values():
            keys += parser_keys(sub)
    return keys


def _import(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _init_args(class_path: str) -> list[str]:
    """The constructor arguments of the class at ``class_path`` (empty when it cannot be imported)."""
    try:
        return [p for p in inspect.signature(_import(class_path)).parameters if p not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return []


def _below(key: str, class_path: str | None) -> str:
    """The key prefix of a class's arguments: ``key.init_args`` (a class chosen by class_path), ``key`` for a
    dataclass (its fields are keys of their own, ``model.optim.lr``)."""
    return key if class_path is None or dataclasses.is_dataclass(_import(class_path)) else f"{key}.init_args"


def _did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{match[0]}?)" if match else ""


def _unrecognized(message: str, keys: list[str]) -> str | None:
    tokens = [t for t in message.split(":", 1)[-1].split() if t.startswith("--")]
    if not tokens:
        return None
    parts = []
    for token in tokens:
        key = token[2:].split("=", 1)[0]
        parts.append(f"unknown key {key}{_did_you_mean(key, keys)}")
    return "; ".join(parts)


def _nested(message: str) -> str | None:
    """The innermost problem of a ``Parser key "...":`` message, with its full key."""
    lines = message.splitlines()
    match = _PARSER_KEY.match(lines[0]) if lines else None
    if match is None:
        return None
    key, class_path = match.group(1), None
    for line in lines[1:]:
        if m := _CLASS_PATH.match(line):
            class_path = m.group(1)
        elif (m := _PARSER_KEY.match(line)) and class_path is not None:
            key = f"{_below(key, class_path)}.{m.group(1)}"
        elif m := _NOT_ACCEPTED.match(line):
            name, choices = m.group(1), _init_args(class_path) if class_path else []
            where = _below(key, class_path)
            cls = f" ({str(class_path).rsplit('.', 1)[-1]} takes {', '.join(choices)})" if choices else ""
            return f"unknown key {where}.{name}{_did_you_mean(name, choices, where + '.') or cls}"
        elif (m := _EXPECTED.match(line)) and m.group(1) != "NoneType":
            return f"{key}: expected {m.group(1)}, got {m.group(2).strip()!r}"
        elif m := _NOT_CALLABLE.search(line):
            return f"{key}: cannot import {m.group(2).strip()} ({m.group(1)})"
        elif m := _NOT_A_CLASS.search(line):
            return f"{key}: {m.group(1)} is not a class that can be chosen here (a class name such as RTPO, " \
                   f"or a full import path)"
    return None


def _required(key: str) -> str:
    if key == "model.algorithm":
        return ("model.algorithm is required: name it in the config (model: {algorithm: RTPO}) or on the command "
                "line (--model.algorithm RTPO); RTPO, TurnPPO, GRPO or TokenPPO")
    return f"{key} is required (neither the config nor the command line sets it)"


def short_error(message: str, parser: Any) -> str:
    """jsonargparse's error ``message`` as one line naming the key (the message itself when not recognised)."""
    text = message.strip()
    if text.lower().startswith("unrecognized arguments"):
        return _unrecognized(text, parser_keys(parser)) or text
    if m := _REQUIRED.match(text):
        return "; ".join(_required(k.strip().removeprefix("fit.")) for k in m.group(1).split(","))
    if m := _NOT_AN_OPTION.search(text):  # an unknown key in a config file
        return f"unknown key {m.group(1)}{_did_you_mean(m.group(1), parser_keys(parser))}"
    return _nested(text) or parse_error_line(text)


class AgentRLArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with one-line errors (`short_error`); ``--help`` still prints the full usage."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        from jsonargparse._common import debug_mode_active  # jsonargparse's own switch for the full report

        if not self.exit_on_error or debug_mode_active():
            super().error(message, ex)
        root = _root(self)
        sys.stderr.write(f"agentrl fit: config error: {short_error(message, root)} (agentrl fit --help lists the "
                         "keys)\n")
        self.exit(2)


def _root(parser: ArgumentParser) -> ArgumentParser:
    parent = getattr(parser, "parent_parser", None)
    return _root(parent) if isinstance(parent, ArgumentParser) else parser


class RaisingArgumentParser(AgentRLArgumentParser):
    """The same one-line errors raised as `ConfigError` instead of printed with exit status 2 (the Python API)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        from agentrl.training.command.preflight import ConfigError

        if not self.exit_on_error:  # jsonargparse's own tries (e.g. each type of a Union) catch its exception
            super().error(message, ex)
        raise ConfigError(short_error(message, _root(self))) from ex
