"""The layers of `agentrl` import only downward (docs/architecture.md): every module's imports are parsed, each
`agentrl` import must reach the module's own layer or a lower one, and the heavy frameworks stay in the layers
that own them. Imports inside functions and under ``TYPE_CHECKING`` count too: a lazy import is still a
dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import agentrl

SRC = Path(agentrl.__file__).parent

# lowest first; a module may import its own layer or any layer before it
LAYERS: list[tuple[str, ...]] = [
    ("agentrl", "agentrl.types", "agentrl.seeding", "agentrl.algorithms"),
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

# third-party frameworks and the layers allowed to import them
OWNERS: dict[str, tuple[str, ...]] = {
    "lightning": ("agentrl.tracking", "agentrl.training", "agentrl.cli"),
    "mlflow": ("agentrl.tracking", "agentrl.training"),
    "fastapi": ("agentrl.serve",),
    "uvicorn": ("agentrl.serve",),
    "httpx": ("agentrl.engines", "agentrl.serve"),
    "langchain": (),
    "langchain_core": (),
    "langgraph": (),
    "openai": (),  # OpenAI-API agents (the SDK, the openai client) are the user's: examples/, never the core
    "agents": (),  # the OpenAI Agents SDK's package
}


def layer_of(module: str) -> int:
    """Index of the layer holding ``module`` (the longest matching prefix)."""
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


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Absolute names of every module ``source`` imports (relative imports resolved)."""
    out: list[str] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append(name)
            # `from agentrl import training` imports a subpackage: judge it by the subpackage
            if name == "agentrl":
                out.extend(f"agentrl.{alias.name}" for alias in node.names)
    return out


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Why ``module``'s imports break the layer order (empty when they do not)."""
    own = layer_of(module)
    found = []
    for name in imported_modules(source, module, is_package):
        root = name.split(".")[0]
        if root == "agentrl":
            if name != "agentrl" and layer_of(name) > own:
                found.append(f"{module} (layer {own}) imports {name} (layer {layer_of(name)})")
        elif root in OWNERS and not any(module == o or module.startswith(o + ".") for o in OWNERS[root]):
            found.append(f"{module} imports {root}, which only {OWNERS[root] or 'the adapters'} may import")
    return found


def test_every_module_imports_only_downward() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 30
    problems = []
    for path in files:
        name = module_name(path)
        problems += violations(name, path.read_text(), path.name == "__init__.py")
    assert not problems, "\n".join(problems)


def test_the_checker_catches_upward_lazy_and_relative_imports() -> None:
    lazy = "def f():\n    from agentrl.training.module import AgentRLModule\n"
    assert violations("agentrl.engines.hf", lazy) == [
        "agentrl.engines.hf (layer 3) imports agentrl.training.module (layer 9)"]
    assert violations("agentrl.envs.guess", "from ..agents import llm\n")[0].startswith(
        "agentrl.envs.guess (layer 4) imports agentrl.agents")
    assert violations("agentrl.chat.tools", "from agentrl import collect\n")
    assert violations("agentrl.engines.hf", "import lightning.pytorch as pl\n")
    assert violations("agentrl.training.module", "from agentrl.engines.base import SamplingParams\n") == []


def test_no_source_file_is_over_450_lines() -> None:
    long = {module_name(p): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long
