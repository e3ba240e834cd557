"""The training package stays readable: `AgentRLModule` thin, no class that grows into a room of its own, and the
run's parts passed around typed (docs/architecture.md, "Inside training").

Measured from the source (AST), nothing is imported: the module file at most 300 lines; no class in
`agentrl.training` over 250 lines; and no parameter anywhere in `agentrl.training` that carries one of the run's
parts (the module, the trainer, the schedule's learner, the policy, the critic, the rollout session, the engine
spec, an evaluation) annotated ``Any`` or left unannotated: a part handed on as ``Any`` is how the module grew back
by moving its code into functions that take it untyped.
"""

from __future__ import annotations

import ast
from pathlib import Path

import agentrl

TRAINING = Path(agentrl.__file__).parent / "training"
MODULE = TRAINING / "system" / "module.py"
MODULE_LINES, CLASS_LINES = 300, 250

# parameter names that carry a part of the run; such a parameter is typed with the part's class or protocol
RUN_PARTS = frozenset({"module", "pl_module", "lightning_module", "trainer", "learner", "policy", "critic",
                       "session", "engine_spec", "held_out", "evaluator", "meter", "counters"})


def _parameters(tree: ast.AST) -> list[tuple[int, str, ast.arg]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            extra = [x for x in (a.vararg, a.kwarg) if x is not None]
            out += [(node.lineno, node.name, arg) for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *extra]]
    return out


def untyped_parts(source: str, where: str) -> list[str]:
    """The parameters of ``source`` named after a run part that are annotated ``Any`` (or ``typing.Any``) or not
    annotated."""
    found = []
    for line, function, arg in _parameters(ast.parse(source)):
        if arg.arg not in RUN_PARTS:
            continue
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else None
        if annotation in (None, "Any", "typing.Any", "'Any'", '"Any"'):
            found.append(f"{where}:{line} {function}({arg.arg}: {annotation or 'no annotation'})")
    return found


def long_classes(source: str, where: str) -> list[str]:
    return [f"{where}:{node.lineno} class {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > CLASS_LINES]


def _training_sources() -> dict[str, str]:
    return {str(p.relative_to(TRAINING.parent)): p.read_text() for p in sorted(TRAINING.rglob("*.py"))}


def test_the_module_file_is_at_most_300_lines() -> None:
    lines = len(MODULE.read_text().splitlines())
    assert lines <= MODULE_LINES, f"{MODULE.relative_to(TRAINING.parent)}: {lines} lines (at most {MODULE_LINES})"


def test_no_class_in_training_is_over_250_lines() -> None:
    sources = _training_sources()
    assert len(sources) > 30
    long = [c for where, source in sources.items() for c in long_classes(source, where)]
    assert not long, "\n".join(long)


def test_no_run_part_is_passed_as_any_in_training() -> None:
    found = [p for where, source in _training_sources().items() for p in untyped_parts(source, where)]
    assert not found, "run parts typed Any or untyped (type them with their class or protocol):\n" + "\n".join(found)


def test_the_checks_catch_what_they_name() -> None:
    assert untyped_parts("def publish(module: Any, metrics: dict) -> None: ...\n", "x.py") == [
        "x.py:1 publish(module: Any)"]
    assert untyped_parts("class C:\n    def hook(self, trainer, pl_module: typing.Any, held_out: Any): ...\n",
                         "y.py") == ["y.py:2 hook(trainer: no annotation)", "y.py:2 hook(pl_module: typing.Any)",
                                     "y.py:2 hook(held_out: Any)"]
    assert untyped_parts("def f(module: nn.Module, trainer: pl.Trainer | None, batch: Any) -> None: ...\n",
                         "z.py") == []
    big = "class Big:\n" + "    x = 1\n" * CLASS_LINES
    assert long_classes(big, "b.py") == [f"b.py:1 class Big: {CLASS_LINES + 1} lines"]
    assert long_classes("class Small:\n    x = 1\n", "s.py") == []
