"""The two drivers of a flow (see :mod:`pgr_core.flow.effects`): one performs its effects with blocking
calls, one with awaitable calls, so the sync and async APIs share one flow. What they share is written
once (:meth:`Driver._steps`): they keep the call's budget (:mod:`pgr_core.flow.budget`), bill every LLM
call to the trace and report every effect (:mod:`pgr_core.observability.telemetry`); each driver only
performs the effects."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pgr_core.errors import ConfigurationError, LLMError, LLMTimeoutError, StoreError
from pgr_core.flow.budget import BudgetStop, Meter
from pgr_core.flow.effects import Ask, Effect, Flow, Search, Typicality
from pgr_core.models.caches import counting_embeddings
from pgr_core.models.llm import LLM, Completion, plausible_usage
from pgr_core.observability.trace import Usage
from pgr_core.types import Budget

if TYPE_CHECKING:
    from pgr_core.observability.telemetry import Telemetry
    from pgr_core.policy.centring import MemoryCentre
    from pgr_core.policy.config import PGRConfig
    from pgr_core.stores.contract import Store

__all__ = ["Driver"]

Outcome = tuple[Any, BaseException | None]  # an effect's result, or the exception it raised

_ABANDONED = "no answer in the {seconds:.3g}s the deadline left; the call was abandoned"


class Driver:
    """Runs a :class:`~pgr_core.policy.pgr.PGR`'s flows against its store and LLM: :meth:`drive` with
    blocking calls, :meth:`adrive` with awaitable ones."""

    def __init__(
        self,
        store: Store,
        llm: LLM | None,
        config: PGRConfig,
        telemetry: Telemetry,
        centre: MemoryCentre | None,
    ) -> None:
        self.store = store
        self.llm = llm
        self.config = config
        self.telemetry = telemetry  # spans, metrics and progress lines of every effect
        self.centre = centre  # the scopes' mean vectors, for centred scores (None: centring off)

    def drive(self, flow: Flow, meter: Meter | None = None) -> Any:
        """Run a flow with blocking calls (its embeddings counted, and cached or not, as configured)."""
        meter = meter or Meter(Budget())
        run = _Run(self._steps(flow, meter))
        with counting_embeddings(use_cache=self.config.embedding_cache):
            effect = run.resume()
            while effect is not None:
                effect = run.resume(*_outcome(self._perform, effect, meter))
        return run.value

    async def adrive(self, flow: Flow, meter: Meter | None = None) -> Any:
        """Run a flow with awaitable calls. The embedding count lives in this task's context, and worker
        threads of ``asyncio.to_thread`` inherit it, so concurrent calls never mix their counts."""
        meter = meter or Meter(Budget())
        run = _Run(self._steps(flow, meter))
        with counting_embeddings(use_cache=self.config.embedding_cache):
            effect = run.resume()
            while effect is not None:
                effect = run.resume(*await _aoutcome(self._aperform(effect, meter)))
        return run.value

    def _steps(self, flow: Flow, meter: Meter) -> Flow:
        """The loop both drivers run, written once: step the flow; hold each LLM call to the budget, bill
        it and watch it (span, metrics, progress line); yield the effect for the driver to perform, and
        send its result back into the flow, or throw in the failure that the flow handles."""
        watch = self.telemetry.watch(self.store, self.llm)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            effect: Effect | None = None
            try:
                effect = flow.throw(to_throw) if to_throw is not None else flow.send(to_send)
            except StopIteration as stop:
                return stop.value
            finally:
                if not isinstance(effect, Typicality):  # (a round's centring comes before its merge)
                    watch.moved_on()  # the flow has folded the last round's hits in: its Δ is known
            to_send, to_throw = None, None
            try:
                if isinstance(effect, Search):
                    with watch.search(effect) as seen:
                        seen.value = yield effect
                    to_send = seen.value
                elif isinstance(effect, Typicality):
                    try:
                        to_send = yield effect
                    except Exception as exc:  # centring refines an order: the flow goes on without it
                        to_throw = exc
                else:
                    meter.admit(effect)
                    with watch.ask(effect) as seen, self._billing(effect) as box:
                        box.append((yield effect))
                        seen.value = box[0]
                    to_send = box[0]
            except (LLMError, StoreError, BudgetStop) as exc:
                to_throw = meter.explain(exc, effect)

    def _perform(self, effect: Effect, meter: Meter) -> Any:
        """One effect with a blocking call."""
        if isinstance(effect, Search):
            return self.store._checked_search(effect.probes, effect.scope, effect.params)
        if isinstance(effect, Typicality):
            return self._typicality(effect)
        return self._ask(effect, meter.time_left())

    async def _aperform(self, effect: Effect, meter: Meter) -> Any:
        """One effect with an awaited call."""
        if isinstance(effect, Search):
            return await self.store._achecked_search(effect.probes, effect.scope, effect.params)
        if isinstance(effect, Typicality):  # reads the store and may embed: off the event loop
            return await asyncio.to_thread(self._typicality, effect)
        return await self._aask(effect, meter.time_left())

    def _typicality(self, effect: Typicality) -> dict[str, float]:
        if self.centre is None:
            raise ConfigurationError("centring is off (centring=None)")
        return self.centre.typicality(effect.scope, effect.facts)

    def _ask(self, effect: Ask, time_left: float | None) -> Completion:
        """One blocking LLM call, bounded by the time the deadline leaves (None: unbounded)."""
        llm = self._llm()

        def call(**extra: Any) -> Completion:
            return llm.complete(effect.messages, schema=effect.schema, max_tokens=effect.max_tokens, **extra)

        if time_left is None:
            return _completion(call(), llm, effect)
        if llm.accepts_timeout:
            return _completion(call(timeout=time_left), llm, effect)
        return _completion(_abandon_after(time_left, call), llm, effect)

    async def _aask(self, effect: Ask, time_left: float | None) -> Completion:
        """One awaited LLM call; past the deadline the await is abandoned (the call is cancelled)."""
        llm = self._llm()
        extra: dict[str, Any] = {"timeout": time_left} if time_left is not None and llm.accepts_timeout else {}
        call = llm.acomplete(effect.messages, schema=effect.schema, max_tokens=effect.max_tokens, **extra)
        if time_left is None:
            return _completion(await call, llm, effect)
        try:
            return _completion(await asyncio.wait_for(call, time_left), llm, effect)
        except TimeoutError:
            raise LLMTimeoutError(_ABANDONED.format(seconds=time_left)) from None

    def _llm(self) -> LLM:
        if self.llm is None:  # a prospector that needs an LLM is refused at construction
            raise ConfigurationError("this step needs an LLM: pass llm=... to PGR")
        return self.llm

    @contextmanager
    def _billing(self, effect: Ask) -> Iterator[list[Completion]]:
        """Time one LLM call and bill it to the trace; a custom LLM's own exception becomes LLMError."""
        t0, box = time.perf_counter(), list[Completion]()
        try:
            yield box
        except LLMError:
            self._bill(effect, None, time.perf_counter() - t0)
            raise
        except Exception as exc:
            self._bill(effect, None, time.perf_counter() - t0)
            raise LLMError(f"{type(exc).__name__}: {exc}") from exc
        self._bill(effect, box[0] if box else None, time.perf_counter() - t0)

    @staticmethod
    def _bill(effect: Ask, completion: Completion | None, seconds: float) -> None:
        """Count one LLM call (failed ones too) in the trace, overall and for its phase."""
        spent = Usage(llm_calls=1, seconds=seconds)
        if completion is not None:
            spent.prompt_tokens = completion.usage.prompt_tokens
            spent.completion_tokens = completion.usage.completion_tokens
        effect.trace.usage.add(spent)
        effect.trace.usage_by_phase.setdefault(effect.phase, Usage()).add(spent)


class _Run:
    """A flow being driven (through :meth:`Driver._steps`): :meth:`resume` hands it the last effect's
    outcome and returns the next effect, or None once the flow has returned ``value``."""

    def __init__(self, steps: Flow) -> None:
        self._steps = steps
        self.value: Any = None

    def resume(self, result: Any = None, failure: BaseException | None = None) -> Effect | None:
        try:
            return self._steps.throw(failure) if failure is not None else self._steps.send(result)
        except StopIteration as stop:
            self.value = stop.value
            return None


def _outcome(perform: Callable[[Effect, Meter], Any], effect: Effect, meter: Meter) -> Outcome:
    """(result, None) or (None, the exception): every failure goes back into the flow's steps, which
    handle what they know and close their spans on the rest before it propagates."""
    try:
        return perform(effect, meter), None
    except BaseException as exc:
        return None, exc


async def _aoutcome(call: Awaitable[Any]) -> Outcome:
    """:func:`_outcome` of an awaited call (a cancellation is handed back too, and re-raised there)."""
    try:
        return await call, None
    except BaseException as exc:
        return None, exc


def _completion(value: object, llm: LLM, effect: Ask) -> Completion:
    """The reply of any LLM, its token counts believed only when plausible (:func:`plausible_usage`):
    a custom client reporting -5 tokens cannot undo ``max_tokens`` any more than a server can."""
    if not isinstance(value, Completion):
        raise LLMError(f"{llm!r} returned a {type(value).__name__}, not a Completion")
    usage = value.usage
    checked = plausible_usage(
        getattr(usage, "prompt_tokens", None),
        getattr(usage, "completion_tokens", None),
        effect.messages,
        value.text if isinstance(value.text, str) else "",
        max_tokens=effect.max_tokens,
    )
    if (checked.prompt_tokens, checked.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens):
        return value
    return dataclasses.replace(value, usage=checked)


def _abandon_after(seconds: float, call: Callable[[], Completion]) -> Completion:
    """Run a blocking call in a daemon thread and stop waiting after ``seconds``: for LLM clients that
    take no timeout. An abandoned call runs on in the background; its reply is dropped."""
    box: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread, never lost
            box.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="pgr-llm-call", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        raise LLMTimeoutError(_ABANDONED.format(seconds=seconds))
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
