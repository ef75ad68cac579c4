"""What the adapters share about owner keys: the guess their refusal of an unscoped collection offers."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["owner_key_guess"]

_OWNER_WORDS = ("owner", "user", "tenant", "account")


def owner_key_guess(seen: Sequence[str], besides: str | None = None) -> str:
    """The key of ``seen`` (other than ``besides``, the text's) most likely to hold the owner, for the
    refusal's example; a placeholder if none."""
    for key in seen:
        if key != besides and any(word in key.lower() for word in _OWNER_WORDS):
            return key
    return "<the key holding the user id>"
