"""How long to wait for an LLM reply when nobody said.

A hosted API answers a prospection call in seconds; a small model on this machine's CPU takes one to
several minutes for the same call (Qwen2.5-1.5B on 2 cores: 15-60 s, longer for a long prompt). One
fixed default cannot serve both: 60 s degrades every call of a local model, 600 s leaves a script
hanging for ten minutes on a dead remote host. So the default follows the server: a server on this
machine or the private network gets :data:`LOCAL_TIMEOUT_S`, any other :data:`REMOTE_TIMEOUT_S`.
``PGR_LLM_TIMEOUT`` (and ``--llm-timeout``) override both.
"""

from __future__ import annotations

import ipaddress
import math
import os
from urllib.parse import urlsplit

from pgr_core.errors import InvalidArgumentError

__all__ = ["LOCAL_TIMEOUT_S", "REMOTE_TIMEOUT_S", "default_llm_timeout", "is_local_server"]

REMOTE_TIMEOUT_S = 60.0
LOCAL_TIMEOUT_S = 600.0
_LOCAL_NAMES = {"localhost", "host.docker.internal"}


def is_local_server(base_url: str | None) -> bool:
    """True for a URL whose host is this machine, a private network address or a ``.local`` name.

    >>> is_local_server("http://127.0.0.1:8081/v1"), is_local_server("https://api.openai.com/v1")
    (True, False)
    """
    if not base_url:
        return False
    host = (urlsplit(base_url if "//" in base_url else f"//{base_url}").hostname or "").lower()
    if host in _LOCAL_NAMES or host.endswith((".local", ".localhost", ".internal")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_unspecified or address.is_link_local


def env_llm_timeout() -> float | None:
    """``PGR_LLM_TIMEOUT`` in seconds, or None when unset; a bad value is an error naming the variable."""
    raw = os.environ.get("PGR_LLM_TIMEOUT", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"PGR_LLM_TIMEOUT must be a number of seconds > 0, got {raw!r}")
    return value


def default_llm_timeout(base_url: str | None) -> float:
    """Seconds per LLM request when the caller gave none: ``PGR_LLM_TIMEOUT``, else by server.

    >>> default_llm_timeout("http://127.0.0.1:8081/v1") if "PGR_LLM_TIMEOUT" not in os.environ else 600.0
    600.0
    """
    from_env = env_llm_timeout()
    if from_env is not None:
        return from_env
    return LOCAL_TIMEOUT_S if is_local_server(base_url) else REMOTE_TIMEOUT_S
