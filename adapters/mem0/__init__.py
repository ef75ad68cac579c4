"""pgr adapter for mem0: wrap the ``Memory`` you already built (``pip install 'pgr[mem0]'``).

>>> from pgr_adapters.mem0 import Mem0Store                                   # doctest: +SKIP
>>> store = Mem0Store(memory)                    # a mem0 Memory or AsyncMemory  # doctest: +SKIP
>>> store.search("Should I join a soccer league?", filters={"user_id": "u1"}, top_k=5)  # doctest: +SKIP

Importing this package needs only pgr_core; the names below need mem0ai installed. mem0's telemetry is
switched off (``MEM0_TELEMETRY=False``) unless you set that variable yourself before first use.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from pgr_core.errors import ConfigurationError

__all__ = ["Mem0Fact", "Mem0Store"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    os.environ.setdefault("MEM0_TELEMETRY", "False")  # before anything imports mem0
    if importlib.util.find_spec("mem0") is None:
        raise ConfigurationError(f"pgr_adapters.mem0.{name} needs mem0ai: pip install 'pgr[mem0]'")
    from . import store

    return getattr(store, name)
