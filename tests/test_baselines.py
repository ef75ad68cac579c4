"""Evaluation baselines come from the plugin registry: the core runs the ``mem0`` method without
importing the mem0 adapter."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest
from conftest import U1, U2, make_store

import pgr_core
from pgr_core.errors import ConfigurationError
from pgr_core.evaluation import EvalQuestion, EvalSet, make_method, run_eval
from pgr_core.plugins import registry as plugins
from pgr_core.plugins.hookspecs import hookimpl
from pgr_core.types import Scope


def _entry_points(monkeypatch: pytest.MonkeyPatch, *extra: metadata.EntryPoint) -> None:
    eps = [metadata.EntryPoint(name="memory", value="pgr_core.stores.builtin", group="pgr"), *extra]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [e for e in eps if e.group == group])
    monkeypatch.delenv("PGR_LOAD_PLUGINS", raising=False)


def test_the_mem0_method_runs_the_baseline_a_plugin_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[list[str]] = []

    def make_baseline(facts):  # type: ignore[no-untyped-def]
        built.append([f.id for f in facts])

        def search(question: str, scope: Scope, top_k: int) -> list[str]:
            return [f.id for f in facts if f.scope == scope][::-1][:top_k]

        return search

    module = types.ModuleType("pgr_fake_baseline_plugin")

    @hookimpl
    def register_baselines(register):  # type: ignore[no-untyped-def]
        register("mem0", make_baseline)

    module.register_baselines = register_baselines  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    _entry_points(monkeypatch, metadata.EntryPoint(name="fake", value=module.__name__, group="pgr"))

    store = make_store()
    questions = [
        EvalQuestion(id="a", question="how do I get around?", scope=U1, gold=["s1:3"]),
        EvalQuestion(id="b", question="how do I get around?", scope=U2, gold=["other:3"]),
    ]
    rows = run_eval(EvalSet("tiny", store.facts, questions), ["mem0"], store)
    by_question = {r["question"]: r["ids"] for r in rows}
    u1 = [f.id for f in store.facts if f.scope == U1][::-1][:20]
    u2 = [f.id for f in store.facts if f.scope == U2][::-1][:20]
    assert by_question == {"a": u1, "b": u2}
    assert built == [[f.id for f in store.facts]]  # built once, on first use, from the data set's facts


def test_without_the_mem0_plugin_the_method_says_what_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_points(monkeypatch)
    store = make_store()
    method = make_method("mem0", store, facts=store.facts)
    with pytest.raises(ConfigurationError, match="no baseline named 'mem0' is registered"):
        method.run(EvalQuestion(id="a", question="q", scope=U1))


@pytest.mark.skipif(importlib.util.find_spec("mem0") is not None, reason="mem0 is installed here")
def test_without_mem0_installed_the_method_says_which_extra() -> None:
    store = make_store()
    method = make_method("mem0", store, facts=store.facts)
    with pytest.raises(ConfigurationError, match=r"pip install 'pgr\[mem0,local\]'"):
        method.run(EvalQuestion(id="a", question="q", scope=U1))


def test_no_core_module_imports_an_adapter() -> None:
    root = Path(pgr_core.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] == "pgr_adapters"]
    assert offenders == []
