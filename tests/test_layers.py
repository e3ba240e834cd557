"""The layers of `agentrl` import only downward (docs/architecture.md): every module's imports are parsed, each
`agentrl` import must reach the module's own layer or a lower one, no import circle runs inside a layer, every
third-party package a layer imports is on that layer's allowlist, and the core never imports the adapters or the
examples.

Imports inside functions and under ``TYPE_CHECKING`` count too, for every check: a lazy import is still a
dependency, and a circle closed only by a ``TYPE_CHECKING`` import, harmless at run time, still means that neither
module can be read or changed without the other (issue 25: "no import circle inside training/").
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import agentrl

SRC = Path(agentrl.__file__).parent
REPO = SRC.parents[1]

# lowest first; a module may import its own layer or any layer before it
LAYERS: list[tuple[str, ...]] = [
    ("agentrl.types", "agentrl.seeding", "agentrl.algorithms", "agentrl.runview", "agentrl.credit"),
    ("agentrl.chat",),
    ("agentrl.models",),
    ("agentrl.engines",),
    ("agentrl.envs",),
    ("agentrl.agents",),
    ("agentrl.collect",),
    ("agentrl.serve",),
    ("agentrl.tracking",),
    ("agentrl.training",),
    ("agentrl.cli", "agentrl.__main__"),
]
# the package itself (`agentrl/__init__.py`: `__version__` and `agentrl.fit`) is the public facade above every layer;
# it matches by its exact name only, so a new module that is in no layer is still refused
FACADE = "agentrl"

# the third-party packages each layer may import (top-level names, by layer index; nothing is inherited from the
# layers below: a layer lists what it imports itself). Lightning, MLflow, HTTP frameworks and clients, LangChain
# and the OpenAI SDKs are on no list but their owners'.
THIRD_PARTY: dict[int, frozenset[str]] = {
    0: frozenset({"torch"}),  # types, seeding, algorithms: pure torch
    1: frozenset(),  # chat: templates come with the tokenizer object it is handed
    2: frozenset({"torch", "transformers", "peft", "tokenizers", "huggingface_hub"}),  # models
    3: frozenset({"torch", "transformers", "httpx"}),  # engines: kvcache.py's DynamicLayer; vllm.py's client
    4: frozenset({"numpy", "bm25s"}),  # envs: seeded generators; searchqa.py's retriever
    5: frozenset(),  # agents
    6: frozenset(),  # collect
    7: frozenset({"torch", "safetensors", "fastapi", "starlette", "uvicorn", "pydantic", "pydantic_core", "httpx",
                  "jinja2"}),  # serve (httpx: vllm_cpu.py waits on the server's /health)
    8: frozenset({"torch", "lightning", "mlflow", "requests", "matplotlib", "numpy",
                  "filelock"}),  # tracking (store lock; numpy: the credit figure)
    9: frozenset({"torch", "lightning", "torchmetrics", "jsonargparse", "transformers",
                  "datasets"}),  # training (hf_tasks.py: `datasets`, imported lazily)
    10: frozenset(),  # cli: starts without importing anything heavy
}

# inside `agentrl.training`, lowest floor first: a module may import its own subpackage or one on a lower floor;
# subpackages on one floor stand side by side and import neither other (docs/architecture.md, "Inside training")
TRAINING = "agentrl.training"
TRAINING_FLOORS: list[tuple[str, ...]] = [
    ("update", "rollout"),  # the PPO update / the rollout side: neither knows the other
    ("schedules",),  # the algorithms, talking to the trainer through the `Learner` protocol
    ("system",),  # the Lightning system: AgentRLModule and the parts it owns, callbacks
    ("command",),  # `agentrl fit` / `agentrl validate`, preflight, progress, `agentrl.fit`
]

# packages beside the core (adapters/, examples/): the core never imports them
OUTSIDE_THE_CORE: dict[str, str] = {
    "agentrl_langchain": "adapters/langchain/src/agentrl_langchain",
    "agentrl_langchain_examples": "adapters/langchain/examples",
    "agentrl_examples": "examples/agentrl_examples",
}


def layer_of(module: str) -> int:
    """Index of the layer holding ``module`` (the longest matching prefix; the facade: the top)."""
    if module == FACADE:
        return len(LAYERS) - 1
    best, index = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, index = len(name), i
    if index < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and to docs/architecture.md")
    return index


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(source: str, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """``(absolute module, names imported from it)`` for every import statement (relative ones resolved)."""
    out: list[tuple[str, list[str]]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append((name, [alias.name for alias in node.names]))
    return out


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Absolute names of every module ``source`` imports (relative imports resolved)."""
    out: list[str] = []
    for name, names in _imports(source, module, is_package):
        out.append(name)
        # `from agentrl import training` imports a subpackage: judge it by the subpackage; `from agentrl import
        # __version__` takes a name of the facade itself
        if name == "agentrl":
            out.extend(f"agentrl.{alias}" for alias in names
                       if (SRC / alias).is_dir() or (SRC / f"{alias}.py").is_file())
    return out


def training_floor(module: str) -> tuple[int, str]:
    """``(floor, subpackage)`` of a module inside `agentrl.training` (a module directly in it is refused)."""
    sub = module.removeprefix(TRAINING + ".").split(".")[0]
    for floor, names in enumerate(TRAINING_FLOORS):
        if sub in names:
            return floor, sub
    raise AssertionError(f"{module} is in no subpackage of {TRAINING}: add it to TRAINING_FLOORS and to "
                         "docs/architecture.md")


def training_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Why ``module``'s imports break the order of the subpackages of `agentrl.training` (empty when they do not).
    The package itself (``agentrl.training``: short names, imported on use) is above them all; no module inside
    imports it."""
    if not module.startswith(TRAINING + "."):
        return []
    own, own_sub = training_floor(module)
    found = []
    for name in imported_modules(source, module, is_package):
        if name == TRAINING:
            found.append(f"{module} imports {TRAINING} itself: import from the subpackage that holds the name")
        elif name.startswith(TRAINING + "."):
            floor, sub = training_floor(name)
            if floor > own:
                found.append(f"{module} ({own_sub}, floor {own}) imports {name} ({sub}, floor {floor})")
            elif floor == own and sub != own_sub:
                found.append(f"{module} ({own_sub}) imports {name} ({sub}): they stand side by side on floor {own}")
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Why ``module``'s imports break the layer order or its layer's allowlist (empty when they do not)."""
    own = layer_of(module)
    found = []
    for name in imported_modules(source, module, is_package):
        root = name.split(".")[0]
        if root == "agentrl":
            if name != "agentrl" and layer_of(name) > own:
                found.append(f"{module} (layer {own}) imports {name} (layer {layer_of(name)})")
        elif root in OUTSIDE_THE_CORE:
            found.append(f"{module} imports {name}: the core never imports {OUTSIDE_THE_CORE[root]}/")
        elif root != "__future__" and root not in sys.stdlib_module_names and root not in THIRD_PARTY[own]:
            allowed = ", ".join(sorted(THIRD_PARTY[own])) or "no third-party package"
            found.append(f"{module} imports {root}; layer {own} ({', '.join(LAYERS[own])}) may import {allowed}")
    return found + training_violations(module, source, is_package)


def import_graph(sources: Mapping[str, str], packages: Iterable[str] = ()) -> dict[str, set[str]]:
    """Which of the ``sources`` (module name -> source) each one imports: ``from a import b`` reaches the module
    ``a.b`` when there is one, else ``a``; ``packages`` names the modules that are packages (``__init__``)."""
    packages = set(packages)
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for module, source in sources.items():
        for name, names in _imports(source, module, module in packages):
            targets = {f"{name}.{alias}" if f"{name}.{alias}" in sources else name for alias in names} or {name}
            graph[module] |= (targets & sources.keys()) - {module}
    return graph


def cycles_within_layers(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles among modules of one layer, one per strongly connected group of modules: each as a
    path ``[a, b, ..., a]`` (a shortest circle through the group's first module), followed by any other members
    of the group in brackets."""
    same = {m: {t for t in targets if layer_of(t) == layer_of(m)} for m, targets in graph.items()}
    found, seen = [], set()
    for start in sorted(same):
        if start in seen:
            continue
        path = _shortest_path(same, start, start)
        if path is None:
            continue
        group = {m for m in same if _shortest_path(same, start, m) and _shortest_path(same, m, start)}
        seen |= group
        others = sorted(group - set(path))
        found.append(path + ([f"[also {', '.join(others)}]"] if others else []))
    return found


def _shortest_path(graph: Mapping[str, set[str]], start: str, goal: str) -> list[str] | None:
    """Shortest import path from ``start`` to ``goal`` (at least one step), breadth first."""
    frontier, parent = [start], {start: ""}
    while frontier:
        nxt = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target == goal:
                    path = [goal, node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] if path[-1] == start and len(path) > 1 else None
                if target not in parent:
                    parent[target] = node
                    nxt.append(target)
        frontier = nxt
    return None


def _sources() -> tuple[dict[str, str], set[str]]:
    files = sorted(SRC.rglob("*.py"))
    sources = {module_name(p): p.read_text() for p in files}
    return sources, {module_name(p) for p in files if p.name == "__init__.py"}


def test_every_module_imports_only_downward_and_what_its_layer_allows() -> None:
    sources, packages = _sources()
    assert len(sources) > 30
    problems = []
    for name, source in sources.items():
        problems += violations(name, source, name in packages)
    assert not problems, "\n".join(problems)


def test_no_import_circle_inside_a_layer() -> None:
    sources, packages = _sources()
    circles = cycles_within_layers(import_graph(sources, packages))
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_packages_beside_the_core_are_named_right() -> None:
    """The names the core must not import are the adapters' and examples' real packages (installed by
    scripts/install.sh from these folders), so the check cannot go stale after a rename."""
    for package, folder in OUTSIDE_THE_CORE.items():
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None, package
        assert Path(spec.origin).resolve().parent == (REPO / folder).resolve(), (package, spec.origin)


def test_the_checker_catches_upward_lazy_and_relative_imports() -> None:
    lazy = "def f():\n    from agentrl.training.system.module import AgentRLModule\n"
    assert violations("agentrl.engines.hf", lazy) == [
        "agentrl.engines.hf (layer 3) imports agentrl.training.system.module (layer 9)"]
    assert violations("agentrl.envs.guess", "from ..agents import llm\n")[0].startswith(
        "agentrl.envs.guess (layer 4) imports agentrl.agents")
    assert violations("agentrl.chat.tools", "from agentrl import collect\n")
    assert violations("agentrl.engines.hf", "import lightning.pytorch as pl\n")
    assert violations("agentrl.training.system.module", "from agentrl.engines.base import SamplingParams\n") == []


def test_the_checker_catches_third_party_imports_off_the_layers_allowlist() -> None:
    assert violations("agentrl.algorithms.losses", "import transformers\n") == [
        "agentrl.algorithms.losses imports transformers; layer 0 (agentrl.types, agentrl.seeding, agentrl.algorithms, "
        "agentrl.runview, agentrl.credit) may import torch"]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from starlette.requests import Request\n"
    assert violations("agentrl.algorithms.advantages", typed)[0].startswith(
        "agentrl.algorithms.advantages imports starlette;")
    assert violations("agentrl.chat.render", "def f():\n    import jinja2\n")  # lazy: jinja2 is serve's
    assert violations("agentrl.collect.collector", "import langchain_core.messages\n")
    assert violations("agentrl.serve.server", "import fastapi, starlette, uvicorn, json, os.path\n") == []
    assert violations("agentrl.training.command.cli", "from __future__ import annotations\nimport jsonargparse\n") == []


def test_the_checker_catches_the_core_importing_adapters_or_examples() -> None:
    assert violations("agentrl.training.command.cli", "import agentrl_langchain\n") == [
        "agentrl.training.command.cli imports agentrl_langchain: the core never imports adapters/langchain/src/"
        "agentrl_langchain/"]
    assert violations("agentrl.agents.http_agent", "def f():\n    from agentrl_examples.searchqa import x\n")
    assert violations("agentrl.envs.searchqa", "from agentrl_langchain_examples import search_agent\n")


def test_the_checker_catches_circles_inside_a_layer() -> None:
    sources = {
        "agentrl.training.a": "from agentrl.training import b\n",  # `from package import module`
        "agentrl.training.b": "def f():\n    from .c import C\n",  # lazy and relative
        "agentrl.training.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from agentrl.training.a import A\n"),  # closed under TYPE_CHECKING
        "agentrl.training.d": "import agentrl.training.a\n",  # imports the circle, is not in it
        "agentrl.engines.x": "from agentrl.engines.y import Y\n",
        "agentrl.engines.y": "import agentrl.engines.x\n",
        "agentrl.models.p": "from agentrl.engines import x\n",  # an upward import is another test's business
        "agentrl.engines.z": "from agentrl.models.p import P\n",
    }
    assert cycles_within_layers(import_graph(sources)) == [
        ["agentrl.engines.x", "agentrl.engines.y", "agentrl.engines.x"],
        ["agentrl.training.a", "agentrl.training.b", "agentrl.training.c", "agentrl.training.a"],
    ]
    package = {"agentrl.envs": "from agentrl.envs.guess import GuessEnv\n",
               "agentrl.envs.guess": "from agentrl.envs import base\n", "agentrl.envs.base": "import random\n"}
    assert cycles_within_layers(import_graph(package, packages={"agentrl.envs"})) == []
    package["agentrl.envs.guess"] = "from agentrl.envs import TextEnv\n"  # the package's __init__ itself
    assert cycles_within_layers(import_graph(package, packages={"agentrl.envs"})) == [
        ["agentrl.envs", "agentrl.envs.guess", "agentrl.envs"]]


def test_the_checker_catches_imports_against_the_training_floors() -> None:
    assert violations("agentrl.training.update.ppo", "from agentrl.training.system.module import AgentRLModule\n") == [
        "agentrl.training.update.ppo (update, floor 0) imports agentrl.training.system.module (system, floor 2)"]
    lazy = "def f():\n    from ..command import cli\n"  # lazy and relative, from a package's __init__
    assert violations("agentrl.training.schedules", lazy, is_package=True) == [
        "agentrl.training.schedules (schedules, floor 1) imports agentrl.training.command (command, floor 3)"]
    assert violations("agentrl.training.rollout.session", "from agentrl.training.update import batching\n") == [
        "agentrl.training.rollout.session (rollout) imports agentrl.training.update (update): they stand side by "
        "side on floor 0"]
    assert violations("agentrl.training.system.module", "from agentrl.training import RTPO\n")[0].endswith(
        "imports agentrl.training itself: import from the subpackage that holds the name")
    assert violations("agentrl.training.command.cli", "from agentrl.training.system import module\n"
                      "from agentrl.training.update.ppo import PPOUpdate\nimport agentrl.training.command.keys\n") == []
    try:
        violations("agentrl.training.loose", "import os\n")
    except AssertionError as e:
        assert "agentrl.training.loose is in no subpackage of agentrl.training" in str(e)
    else:
        raise AssertionError("a module directly in agentrl.training was not refused")


def test_the_checker_catches_circles_across_the_training_subpackages() -> None:
    sources = {
        "agentrl.training.update.ppo": "from agentrl.training.update.rowplan import RowPlan\n",
        "agentrl.training.update.rowplan": "def f():\n    from agentrl.training.system import module\n",
        "agentrl.training.system.module": "from agentrl.training.update import ppo\n",
    }
    assert cycles_within_layers(import_graph(sources)) == [
        ["agentrl.training.system.module", "agentrl.training.update.ppo", "agentrl.training.update.rowplan",
         "agentrl.training.system.module"]]


def test_no_source_file_is_over_450_lines() -> None:
    long = {module_name(p): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long
