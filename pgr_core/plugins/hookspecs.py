"""Every pgr plugin hook, in one place.

A plugin is a module registered in the ``pgr`` entry-point group (or passed to
:func:`pgr_core.plugins.registry.load`); it implements any of the hooks below with ``@hookimpl``. A plugin
module imports only pgr_core: it registers factories that import their framework when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("pgr")
hookimpl = pluggy.HookimplMarker("pgr")

#: ``register(name, factory)``: ``factory(**options)`` builds the thing named ``name``.
Register = Callable[[str, Callable[..., Any]], None]


@hookspec
def register_stores(register: Register) -> None:
    """Called once when plugins load. Register store factories: ``register("qdrant", make_store)``,
    where ``make_store(**options) -> pgr_core.Store``."""


@hookspec
def register_llms(register: Register) -> None:
    """Called once when plugins load. Register LLM factories: ``factory(**options) -> pgr_core.LLM``."""


@hookspec
def register_embedders(register: Register) -> None:
    """Called once when plugins load. Register embedder factories: ``factory(**options) -> Embedder``."""


@hookspec
def register_baselines(register: Register) -> None:
    """Called once when plugins load. Register evaluation baselines (``pgr eval --methods <name>``):
    ``factory(facts) -> search``, where ``search(question, scope, top_k) -> list[str]`` is fact ids, best first."""
