"""The ``mem0`` plugin: registers the ``mem0`` store factory and the ``mem0`` evaluation baseline.
Imports only pgr_core.

registry = pgr_core.plugins.registry.load()
store = registry.store("mem0", memory=my_memory)           # a mem0 Memory you built
store = registry.store("mem0", config={...})               # or Memory.from_config(config)
search = registry.baseline("mem0", facts=facts)            # mem0's own search (``pgr eval --methods mem0``)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pgr_core.errors import ConfigurationError
from pgr_core.plugins.hookspecs import Register, hookimpl

REQUIRES = ("mem0",)
EXTRA = "mem0"


def make_store(
    memory: Any = None,
    *,
    config: Mapping[str, Any] | None = None,
    asynchronous: bool = False,
    llm: Any = None,
    **options: Any,
) -> Any:
    """A :class:`~pgr_adapters.mem0.Mem0Store` over ``memory``, or over ``Memory.from_config(config)``
    (``AsyncMemory`` with ``asynchronous=True``). ``llm`` and other options (``search_path``, ``strategy``,
    PGRConfig fields) go to ``Mem0Store``. mem0's telemetry is off unless ``MEM0_TELEMETRY`` is set."""
    os.environ.setdefault("MEM0_TELEMETRY", "False")  # read by mem0 when it is first imported
    if (memory is None) == (config is None):
        raise ConfigurationError("the mem0 store needs exactly one of memory=<a mem0 Memory> or config={...}")
    try:
        from .store import Mem0Store

        if memory is None:
            from mem0 import AsyncMemory, Memory

            memory = (AsyncMemory if asynchronous else Memory).from_config(dict(config or {}))
    except ImportError as exc:
        raise ConfigurationError("the mem0 store needs mem0ai: pip install 'pgr[mem0]'") from exc
    return Mem0Store(memory, llm=llm, **options)


@hookimpl
def register_stores(register: Register) -> None:
    register("mem0", make_store)


def make_baseline(facts: Sequence[Any]) -> Callable[..., list[str]]:
    """mem0's own search over an offline mem0 Memory holding ``facts`` (see ``evaluation.py``)."""
    from .evaluation import mem0_baseline

    return mem0_baseline(facts)


@hookimpl
def register_baselines(register: Register) -> None:
    register("mem0", make_baseline)
