"""pgr_adapters._flows: one flow, driven with blocking calls and with awaited ones, comes to the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pgr_adapters._flows import Flow, adrive, drive


class Boom(Exception):
    pass


def doubling_flow(values: list[int]) -> Flow[tuple[list[int], list[str]]]:
    """Asks for each value doubled; a failed ask is caught where it was made and noted."""
    got, failures = [], []
    for value in values:
        try:
            got.append((yield value))
        except Boom as exc:
            failures.append(str(exc))
    return got, failures


def perform(value: int) -> int:
    if value < 0:
        raise Boom(f"no double for {value}")
    return 2 * value


async def aperform(value: int) -> int:
    await asyncio.sleep(0)
    return perform(value)


def test_both_drivers_send_results_and_raise_failures_where_they_were_asked() -> None:
    expected = ([2, 6], ["no double for -1"])
    assert drive(doubling_flow([1, -1, 3]), perform) == expected
    assert asyncio.run(adrive(doubling_flow([1, -1, 3]), aperform)) == expected


def test_a_flow_that_asks_nothing_returns_at_once() -> None:
    calls: list[Any] = []
    assert drive(doubling_flow([]), calls.append) == ([], [])
    assert asyncio.run(adrive(doubling_flow([]), aperform)) == ([], [])
    assert calls == []


def test_a_failure_the_flow_does_not_handle_comes_out_of_the_driver() -> None:
    def strict() -> Flow[int]:
        return (yield -5)

    with pytest.raises(Boom, match="-5"):
        drive(strict(), perform)
    with pytest.raises(Boom, match="-5"):
        asyncio.run(adrive(strict(), aperform))


def test_an_interrupt_is_not_handed_to_the_flow() -> None:
    seen: list[BaseException] = []

    def catching() -> Flow[str]:
        try:
            yield 1
        except BaseException as exc:  # a flow never sees what is not an Exception
            seen.append(exc)
        return "handled"

    def interrupt(value: int) -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drive(catching(), interrupt)
    assert not [e for e in seen if isinstance(e, KeyboardInterrupt)]
