"""The LLM options every ``pgr`` command shares, and the one way they become an :class:`~pgr_core.llm.LLM`."""

from __future__ import annotations

import argparse
import os

from ._argtypes import nonnegative_float
from ._timeouts import default_llm_timeout
from .errors import ConfigurationError
from .llm import LLM, OpenAICompatible

__all__ = ["add_llm_options", "llm_from_args", "llm_timeout"]

_TIMEOUT_HELP = (
    "seconds per LLM request (default: $PGR_LLM_TIMEOUT, else 600 for a server on this machine or the "
    "private network, 60 for any other)"
)


def add_llm_options(p: argparse.ArgumentParser, *, no_llm: bool = False) -> None:
    """``--base-url``, ``--model``, ``--llm-timeout`` (and ``--no-llm`` where a command can do without)."""
    if no_llm:
        p.add_argument("--no-llm", action="store_true", help="ignore any configured LLM")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible server (default: $PGR_LLM_BASE_URL)")
    p.add_argument("--model", default=None, help="model name (default: $PGR_LLM_MODEL)")
    p.add_argument("--llm-timeout", type=nonnegative_float, default=None, help=_TIMEOUT_HELP)


def _configured() -> bool:
    names = ("PGR_LLM_BASE_URL", "PGR_LLM_MODEL", "PGR_LLM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY")
    return os.environ.get("PGR_LLM", "").lower() != "none" and any(os.environ.get(n) for n in names)


def llm_timeout(args: argparse.Namespace) -> float:
    """``--llm-timeout`` when given, else the default for the server the command will talk to."""
    if args.llm_timeout is not None:
        return float(args.llm_timeout)
    url = args.base_url or os.environ.get("PGR_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
    return default_llm_timeout(url)


def llm_from_args(args: argparse.Namespace, *, required: str | None = None) -> LLM | None:
    """The LLM the options name (``--base-url``/``--model``) or the environment configures, or None.

    ``required`` names what needs one: without an LLM it is an error saying how to configure it."""
    llm: LLM | None = None
    if not getattr(args, "no_llm", False) and (args.base_url or args.model or _configured()):
        llm = OpenAICompatible(base_url=args.base_url, model=args.model, timeout=llm_timeout(args))
    if llm is None and required:
        raise ConfigurationError(
            f"{required} needs an LLM: pass --base-url and --model, or set PGR_LLM_BASE_URL and PGR_LLM_MODEL"
        )
    return llm
