"""One flow, two drivers: how an adapter writes a sync method and its async twin once.

The house pattern of :mod:`pgr_core.flow.effects`, for the backend calls of an adapter. A method is written
once as a *flow*, a generator that yields the calls it needs (the adapter's own effect objects) and
receives what each came to; a call that fails raises its exception at the ``yield`` that asked for it,
so the flow maps it (to a :class:`~pgr_core.errors.StoreError`, say) where it knows what it was doing.
:func:`drive` performs the effects with blocking calls, :func:`adrive` awaits them::

    def _count_flow(self) -> Flow[int]:
        with self._backend("count"):
            reply = yield Call("count", self.collection)
        return reply.count

    def count(self) -> int:
        return drive(self._count_flow(), self._perform)

    async def acount(self) -> int:
        return await adrive(self._count_flow(), self._aperform)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["Flow", "adrive", "drive"]

T = TypeVar("T")

Flow = Generator[Any, Any, T]
"""A flow returning a ``T``: it yields effects and is sent what each came to."""

_Outcome = tuple[Any, Exception | None]  # an effect's result, or the exception it raised


class _Run:
    """A flow being driven: :meth:`resume` hands it the last effect's outcome and returns the next
    effect; once the flow has returned, ``done`` is set and ``value`` is what it returned."""

    def __init__(self, flow: Flow[Any]) -> None:
        self._flow = flow
        self.done = False
        self.value: Any = None

    def resume(self, result: Any = None, failure: Exception | None = None) -> Any:
        try:
            return self._flow.throw(failure) if failure is not None else self._flow.send(result)
        except StopIteration as stop:
            self.done, self.value = True, stop.value
            return None


def drive(flow: Flow[T], perform: Callable[[Any], Any]) -> T:
    """Run ``flow`` to its end, each effect performed by the blocking ``perform(effect)``."""
    run = _Run(flow)
    effect = run.resume()
    while not run.done:
        effect = run.resume(*_outcome(perform, effect))
    return run.value  # type: ignore[no-any-return]


async def adrive(flow: Flow[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """Run ``flow`` to its end, each effect performed by awaiting ``perform(effect)``."""
    run = _Run(flow)
    effect = run.resume()
    while not run.done:
        effect = run.resume(*await _aoutcome(perform(effect)))
    return run.value  # type: ignore[no-any-return]


def _outcome(perform: Callable[[Any], Any], effect: Any) -> _Outcome:
    """(result, None), or (None, the exception) to raise inside the flow. Anything that is not an
    ``Exception`` (an interrupt, a cancellation) propagates from the driver at once."""
    try:
        return perform(effect), None
    except Exception as exc:
        return None, exc


async def _aoutcome(call: Awaitable[Any]) -> _Outcome:
    """:func:`_outcome` of an awaited call."""
    try:
        return await call, None
    except Exception as exc:
        return None, exc
