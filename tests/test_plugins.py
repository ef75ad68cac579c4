"""Plugins: entry points load (or fail) one by one, PGR_LOAD_PLUGINS selects, factories build."""

from __future__ import annotations

import types
from importlib import metadata

import pytest

from pgr_core import ConfigurationError, HashingEmbedder, InMemoryStore
from pgr_core.plugins import registry as plugins
from pgr_core.plugins.hookspecs import hookimpl

EPS = [
    metadata.EntryPoint(name="memory", value="pgr_core.stores.builtin", group="pgr"),
    metadata.EntryPoint(name="broken", value="pgr_no_such_module_xyz", group="pgr"),
]


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [e for e in EPS if e.group == group])


def test_a_broken_plugin_is_reported_not_fatal(fake_entry_points: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGR_LOAD_PLUGINS", raising=False)
    registry = plugins.load()
    assert "memory" in registry.stores
    status = {name: (usable, note) for name, usable, note in registry.status()}
    assert status["memory"] == (True, "")
    assert status["broken"][0] is False and "pgr_no_such_module_xyz" in status["broken"][1]


def test_pgr_load_plugins_selects_entry_points(fake_entry_points: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGR_LOAD_PLUGINS", "memory")
    registry = plugins.load()
    assert "broken" not in registry.failed and list(registry.modules) == ["memory"]


def test_a_plugin_that_needs_a_missing_framework_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("pgr_fake_adapter")
    module.REQUIRES = ("pgr_framework_that_is_not_installed.core",)  # a dotted name: its parent is missing  # type: ignore[attr-defined]
    module.EXTRA = "fake"  # type: ignore[attr-defined]

    def make_store(**options: object) -> object:
        raise ConfigurationError("the fake store needs its extra: pip install 'pgr[fake]'")

    @hookimpl
    def register_stores(register):  # type: ignore[no-untyped-def]
        register("fake", make_store)

    module.register_stores = register_stores  # type: ignore[attr-defined]
    registry = plugins.load([module], entry_points=False)
    row = next(r for r in registry.status() if r[0] == "pgr_fake_adapter")
    assert row[1] is False and "pip install 'pgr[fake]'" in row[2]
    with pytest.raises(ConfigurationError, match=r"pgr\[fake\]"):
        registry.store("fake")
    with pytest.raises(ConfigurationError, match="no store named 'nope'"):
        registry.store("nope")


def test_the_memory_factory_builds_and_loads_stores(tmp_path) -> None:  # type: ignore[no-untyped-def]
    registry = plugins.load(entry_points=False)
    store = registry.store("memory", embedder=HashingEmbedder())
    assert isinstance(store, InMemoryStore)
    store.add("a fact", scope={"user_id": "u"})
    path = store.save(tmp_path / "s.pgr")
    again = registry.store("memory", path=str(path), embedder=HashingEmbedder())
    assert len(again) == 1
