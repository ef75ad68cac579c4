"""Loading plugins and looking up what they registered."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from pgr_core.errors import ConfigurationError
from pgr_core.plugins import hookspecs
from pgr_core.stores import builtin

__all__ = ["Registry", "load"]

GROUP = "pgr"


@dataclass
class Registry:
    """What the loaded plugins registered, by kind and name."""

    stores: dict[str, Callable[..., Any]] = field(default_factory=dict)
    llms: dict[str, Callable[..., Any]] = field(default_factory=dict)
    embedders: dict[str, Callable[..., Any]] = field(default_factory=dict)
    baselines: dict[str, Callable[..., Any]] = field(default_factory=dict)  # evaluation baselines
    plugins: list[str] = field(default_factory=list)
    modules: dict[str, ModuleType] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # entry point -> why it did not load

    def status(self) -> list[tuple[str, bool, str]]:
        """(plugin, usable here, note) for every plugin: usable when the framework it needs imports.

        A plugin module may declare ``REQUIRES`` (module names) and ``EXTRA`` (the pgr extra)."""
        rows = []
        for name, module in self.modules.items():
            missing = [m for m in getattr(module, "REQUIRES", ()) if not _importable(m)]
            extra = getattr(module, "EXTRA", None)
            note = f"missing {', '.join(missing)}: pip install 'pgr[{extra}]'" if missing and extra else ""
            rows.append((name, not missing, note or ("missing " + ", ".join(missing) if missing else "")))
        rows += [(name, False, f"failed to load: {why}") for name, why in self.failed.items()]
        return rows

    def store(self, name: str, **options: Any) -> Any:
        return self._make("store", self.stores, name, options)

    def llm(self, name: str, **options: Any) -> Any:
        return self._make("LLM", self.llms, name, options)

    def embedder(self, name: str, **options: Any) -> Any:
        return self._make("embedder", self.embedders, name, options)

    def baseline(self, name: str, **options: Any) -> Any:
        return self._make("baseline", self.baselines, name, options)

    @staticmethod
    def _make(kind: str, table: dict[str, Callable[..., Any]], name: str, options: dict[str, Any]) -> Any:
        if name not in table:
            known = ", ".join(sorted(table)) or "none"
            raise ConfigurationError(f"no {kind} named {name!r} is registered (known: {known}); see `pgr plugins`")
        return table[name](**options)


def _importable(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it (a missing parent counts as missing)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def load(extra: Iterable[ModuleType] = (), *, entry_points: bool = True) -> Registry:
    """Load the built-in plugin, the ``pgr`` entry points and ``extra`` modules, and collect their
    registrations. ``PGR_LOAD_PLUGINS`` (comma-separated entry-point names) picks which entry points
    load; unset, all do."""
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    registry = Registry()
    if entry_points:
        wanted = os.environ.get("PGR_LOAD_PLUGINS")
        chosen = None if wanted is None else {n.strip() for n in wanted.split(",") if n.strip()}
        for ep in metadata.entry_points(group=GROUP):
            if chosen is not None and ep.name not in chosen:
                continue
            try:
                module = ep.load()
            except Exception as exc:
                registry.failed[ep.name] = f"{type(exc).__name__}: {exc}"
                continue
            if not pm.is_registered(module):
                pm.register(module, name=ep.name)
                registry.modules[ep.name] = module
    if not pm.is_registered(builtin):  # the ``memory`` entry point is the built-in module itself
        pm.register(builtin, name="memory")
        registry.modules["memory"] = builtin
    for module in extra:
        if not pm.is_registered(module):
            pm.register(module)
            registry.modules[module.__name__] = module
    registry.plugins = [pm.get_name(p) or repr(p) for p in pm.get_plugins()]

    def into(table: dict[str, Callable[..., Any]]) -> hookspecs.Register:
        def register(name: str, factory: Callable[..., Any]) -> None:
            table[name] = factory

        return register

    pm.hook.register_stores(register=into(registry.stores))
    pm.hook.register_llms(register=into(registry.llms))
    pm.hook.register_embedders(register=into(registry.embedders))
    pm.hook.register_baselines(register=into(registry.baselines))
    return registry
