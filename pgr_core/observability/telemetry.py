"""What a call reports while it runs: OpenTelemetry spans and metrics, and short progress lines.

The spans follow the OpenTelemetry GenAI semantic conventions (docs/observability.md has the table)::

    invoke_workflow pgr.retrieve     one root per PGR.retrieve / answer / query_only (and their a* twins)
    ├── retrieval InMemoryStore      one per store round: every probe of the round in one call
    ├── chat qwen2.5-1.5b            one per LLM call, with its phase and round
    └── ...

and two histograms, ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``, with the
bucket boundaries the conventions recommend. Without ``opentelemetry-api`` (``pip install 'pgr[otel]'``)
nothing is made; progress lines need no package.

Text is personal data here: the query, q_A, the probes, the facts found, prompts, replies and scope
values go on spans only when the user opts in (``PGR(record_content=True)`` or the conventions' variable
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``). Without it a span holds counts, names and
ids of pgr's own (phases, stop reasons), and which scope keys were given, never their values; an error
is named by its class, its message (which may quote a prompt) left out.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from pgr_core.observability.trace import Answer, RetrievalResult, Trace

if TYPE_CHECKING:
    from pgr_core.flow.effects import Ask, Search
    from pgr_core.models.llm import LLM, Completion
    from pgr_core.stores.contract import Store

__all__ = ["CONTENT_ENV", "DURATION_BUCKETS", "TOKEN_BUCKETS", "Progress", "Telemetry"]

log = logging.getLogger("pgr")

#: The conventions' switch for recording message content.
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: Bucket boundaries the GenAI conventions recommend for the two histograms.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

#: Called with one short line before each LLM call and after each store round.
Progress = Callable[[str], object]

_PHASE_WORDS = {
    "augment": "query augmentation",
    "initial": "initial prospection",
    "personalized": "personalisation round",
    "query_only": "query only",
    "summary": "summary",
    "answer": "answer",
}
R = TypeVar("R", RetrievalResult, Answer)


def _load_api() -> tuple[Any, Any] | None:
    """The OpenTelemetry API modules, or None when the package is not installed."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    return trace, metrics


def _opted_in(record_content: bool) -> bool:
    return record_content or os.environ.get(CONTENT_ENV, "").strip().lower() == "true"


class _NoSpan:
    """Stands in for a span when the API is absent: accepts everything, records nothing."""

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def set_status(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record_exception(self, *args: Any, **kwargs: Any) -> None:
        pass

    def end(self, end_time: int | None = None) -> None:
        pass


_NO_SPAN = _NoSpan()


class Telemetry:
    """What one :class:`~pgr_core.policy.pgr.PGR` reports: spans and metrics through the given providers (the
    global ones when None), and progress lines to ``progress``. Every method is cheap when unused."""

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        record_content: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self.record_content = _opted_in(record_content)
        self.progress = progress
        self._api = _load_api()
        self._tracer: Any = None
        self._tokens: Any = None
        self._duration: Any = None
        if self._api is None:
            return
        from pgr_core import __version__

        otel_trace, otel_metrics = self._api
        self._tracer = otel_trace.get_tracer("pgr", __version__, tracer_provider=tracer_provider)
        meter = otel_metrics.get_meter("pgr", __version__, meter_provider=meter_provider)
        self._tokens = _histogram(
            meter, "gen_ai.client.token.usage", "{token}", "Tokens of pgr's LLM calls", TOKEN_BUCKETS
        )
        self._duration = _histogram(
            meter,
            "gen_ai.client.operation.duration",
            "s",
            "Duration of pgr's LLM calls and store rounds",
            DURATION_BUCKETS,
        )

    @property
    def enabled(self) -> bool:
        """Whether spans and metrics are made (the OpenTelemetry API is installed)."""
        return self._api is not None

    # ------------------------------------------------------------------ progress

    def say(self, line: str) -> None:
        """Hand one line to the progress callback; a callback that raises is logged, never fatal."""
        if self.progress is None:
            return
        try:
            self.progress(line)
        except Exception:
            log.warning("the progress callback raised; the call goes on", exc_info=True)

    # ------------------------------------------------------------------ spans

    @contextmanager
    def root(self, operation: str, strategy: str) -> Iterator[_Root]:
        """The span of one public call (``operation``: "retrieve", "answer", "query_only"), current while
        the call runs so its LLM calls and store rounds become its children."""
        if self._tracer is None:
            yield _Root(_NO_SPAN, False)
            return
        attributes = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": f"pgr.{operation}",
            "pgr.strategy": strategy,
        }
        with self._tracer.start_as_current_span(
            f"invoke_workflow pgr.{operation}",
            kind=self._api_kind("INTERNAL"),
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield _Root(span, self.record_content)
            except BaseException as exc:
                self._failed(span, exc)
                raise

    def watch(self, store: Store, llm: LLM | None) -> _Watch:
        """What one drive of a flow reports (see :class:`_Watch`)."""
        return _Watch(self, store, llm)

    # ------------------------------------------------------------------ helpers

    def _api_kind(self, name: str) -> Any:
        assert self._api is not None
        return getattr(self._api[0].SpanKind, name)

    def _start(self, name: str, attributes: Mapping[str, Any]) -> Any:
        """A client span, child of the current one (not yet current itself)."""
        if self._tracer is None:
            return _NO_SPAN
        return self._tracer.start_span(name, kind=self._api_kind("CLIENT"), attributes=_clean(attributes))

    def _records(self, span: Any) -> bool:
        """Whether content (opted in) goes on ``span``: only a recording span is worth the text."""
        return self.record_content and span.is_recording()

    def _current(self, span: Any) -> Any:
        """Make ``span`` current meanwhile, so an instrumented HTTP client nests its spans under it."""
        if self._api is None:
            return nullcontext()
        return self._api[0].use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)

    @contextmanager
    def _around(self, span: Any, metric: Mapping[str, Any], failed: str | None = None) -> Iterator[_Seen]:
        """Run one call with ``span`` current and time it. A failure ends the span as failed, records the
        failed call's duration and says ``failed`` (with the error's class), then goes on up."""
        seen = _Seen()
        t0 = time.perf_counter()
        try:
            with self._current(span):
                yield seen
        except BaseException as exc:
            self._failed(span, exc)
            span.end()
            self._measure(self._duration, time.perf_counter() - t0, {**metric, "error.type": type(exc).__name__})
            if failed is not None:
                self.say(f"{failed} ({type(exc).__name__})")
            raise
        seen.seconds = time.perf_counter() - t0

    def _failed(self, span: Any, exc: BaseException) -> None:
        """``error.type`` and status ERROR; the message (it may quote content) only when opted in."""
        span.set_attribute("error.type", type(exc).__name__)
        if self._api is not None:
            status = self._api[0].Status(self._api[0].StatusCode.ERROR, str(exc) if self.record_content else None)
            span.set_status(status)
        if self.record_content:
            span.record_exception(exc)

    def _measure(self, histogram: Any, value: float, attributes: Mapping[str, Any]) -> None:
        if histogram is not None:
            histogram.record(value, attributes=_clean(attributes))


class _Root:
    """The root span, given the call's outcome when it returns (:meth:`finish`)."""

    def __init__(self, span: Any, content: bool) -> None:
        self.span = span
        self._content = content

    def finish(self, result: R) -> R:
        """Record what the finished call did (stop reason, degraded, budget hit, usage); return ``result``."""
        if not self.span.is_recording():
            return result
        retrieval = result.retrieval if isinstance(result, Answer) else result
        trace = retrieval.trace
        attributes: dict[str, Any] = {
            "pgr.prospector": trace.prospector,
            "pgr.stop_reason": trace.stop_reason,
            "pgr.degraded": result.degraded,
            "pgr.budget_hit": trace.budget_hit,
            "pgr.budget_phase": trace.budget_phase,
            "pgr.rounds": len(trace.rounds),
            "pgr.facts": len(retrieval.facts),
            "pgr.llm_calls": trace.usage.llm_calls,
            "pgr.store_calls": trace.store_calls,
            "pgr.errors": len(trace.errors),
            "pgr.ranking": trace.ranking,
            "pgr.scope.keys": sorted(trace.scope),
            "gen_ai.usage.input_tokens": trace.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": trace.usage.completion_tokens,
        }
        if trace.reused_phase1_from is not None:
            attributes["pgr.reused_phase1"] = True
        if self._content:
            attributes.update(_root_content(trace, result))
        self.span.set_attributes(_clean(attributes))
        return result


def _root_content(trace: Trace, result: RetrievalResult | Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"pgr.query.text": trace.query}
    if trace.intent and trace.intent != trace.query:
        out["pgr.intent.text"] = trace.intent
    out.update({f"pgr.scope.{key}": value for key, value in trace.scope.items()})
    if isinstance(result, Answer):
        out["pgr.answer.text"] = result.text
    return out


@dataclass
class _Seen:
    """What comes back from inside a span: the effect's result (set by the driver), and how long it took."""

    value: Any = None
    seconds: float = 0.0


@dataclass
class _Finished:
    """A store round whose call has returned, its span still open until the flow folds the hits in."""

    span: Any
    effect: Search
    hits: list[Any]
    end_ns: int


class _Watch:
    """The spans and lines of one drive. A store round's Δ (its new facts) is known only once the flow
    has merged the hits, so its span ends, with the count, when the flow moves on (:meth:`moved_on`)."""

    def __init__(self, telemetry: Telemetry, store: Store, llm: LLM | None) -> None:
        self._t = telemetry
        self._store_id = data_source_id(store)
        self._llm = _llm_attributes(llm)
        self._phase2: dict[int, int] = {}  # trace round index -> its number within Phase 2 (1, 2, ...)
        self._finished: _Finished | None = None

    @contextmanager
    def ask(self, effect: Ask) -> Iterator[_Seen]:
        """One LLM call: a line before it, a ``chat`` span and the two metrics around it."""
        t = self._t
        round_index = round_of(effect)
        call = effect.trace.usage.llm_calls + 1
        t.say(f"{self._label(effect.phase, round_index)}: waiting for the LLM (call {call})")
        model = self._llm.get("gen_ai.request.model")
        attributes = {
            "gen_ai.operation.name": "chat",
            **self._llm,
            "gen_ai.request.max_tokens": effect.max_tokens,
            "gen_ai.output.type": "json" if effect.schema is not None else "text",
            "pgr.phase": effect.phase,
            "pgr.round": round_index,
            "pgr.call": call,
        }
        span = t._start(f"chat {model}" if model else "chat", attributes)
        if t._records(span):
            span.set_attribute("gen_ai.input.messages", _input_messages(effect.messages))
        metric = _metric(attributes)
        with t._around(span, metric) as seen:
            yield seen
        self._answered(span, seen.value, metric, seen.seconds)

    def _answered(self, span: Any, completion: Completion, metric: dict[str, Any], seconds: float) -> None:
        t, usage = self._t, completion.usage
        reason = "length" if completion.truncated else "stop"
        span.set_attributes(
            _clean(
                {
                    "gen_ai.usage.input_tokens": usage.prompt_tokens,
                    "gen_ai.usage.output_tokens": usage.completion_tokens,
                    "gen_ai.response.model": completion.model or None,
                    "gen_ai.response.finish_reasons": [reason],
                    "pgr.usage.estimated": usage.estimated,
                }
            )
        )
        if t._records(span):
            span.set_attribute("gen_ai.output.messages", _output_messages(completion.text, reason))
        span.end()
        if completion.model:
            metric = {**metric, "gen_ai.response.model": completion.model}
        t._measure(t._duration, seconds, metric)
        t._measure(t._tokens, usage.prompt_tokens, {**metric, "gen_ai.token.type": "input"})
        t._measure(t._tokens, usage.completion_tokens, {**metric, "gen_ai.token.type": "output"})

    @contextmanager
    def search(self, effect: Search) -> Iterator[_Seen]:
        """One store round: a ``retrieval`` span (ended by :meth:`moved_on`) and the duration metric."""
        t, rnd = self._t, effect.round
        attributes = {
            "gen_ai.operation.name": "retrieval",
            "gen_ai.data_source.id": self._store_id,
            "gen_ai.request.top_k": float(effect.params.top_k),
            "pgr.phase": rnd.phase if rnd is not None else None,
            "pgr.round": rnd.index if rnd is not None else None,
            "pgr.probes": len(effect.probes),
        }
        span = t._start(f"retrieval {self._store_id}", attributes)
        if t._records(span):
            span.set_attribute("gen_ai.retrieval.query.text", "\n".join(effect.probes))
        metric = _metric(attributes)
        with t._around(span, metric, failed=f"{self._round_label(effect)}: the store failed") as seen:
            yield seen
        t._measure(t._duration, seen.seconds, metric)
        self._finished = _Finished(span, effect, list(seen.value), time.time_ns())

    def moved_on(self) -> None:
        """The flow has taken the last store round's hits in: end its span with Δ, and say the line."""
        done, self._finished = self._finished, None
        if done is None:
            return
        rnd = done.effect.round
        if rnd is not None:  # what the policy kept of each probe's list (its own K and floor), as the trace
            probes = rnd.probes[len(rnd.probes) - len(done.effect.probes) :]
            direct, neighbours = sum(len(pr.hits) for pr in probes), sum(len(pr.neighbours) for pr in probes)
        else:
            direct = sum(1 for hits in done.hits for h in hits if h.neighbour_of is None)
            neighbours = sum(len(hits) for hits in done.hits) - direct
        new = len(rnd.new_fact_ids) if rnd is not None else None
        done.span.set_attributes(_clean({"pgr.hits": direct, "pgr.neighbours": neighbours, "pgr.new_facts": new}))
        if self._t._records(done.span):
            done.span.set_attribute("gen_ai.retrieval.documents", _documents(done.hits))
        done.span.end(end_time=done.end_ns)
        line = f"{self._round_label(done.effect)}: {_count(len(done.effect.probes), 'probe')}"
        if rnd is None or rnd.phase == "augment":  # the augmentation context is read, not merged into R
            line += f", {_count(direct, 'hit')}"
        if rnd is not None and (rnd.new_fact_ids or rnd.phase != "augment"):
            line += f", {_count(len(rnd.new_fact_ids), 'new fact')}"
        self._t.say(line)

    # ------------------------------------------------------------------ labels

    def _round_label(self, effect: Search) -> str:
        rnd = effect.round
        return self._label(rnd.phase, rnd.index) if rnd is not None else "store round"

    def _label(self, phase: str, round_index: int | None) -> str:
        words = _PHASE_WORDS.get(phase, phase)
        if phase == "personalized" and round_index is not None:
            number = self._phase2.setdefault(round_index, len(self._phase2) + 1)
            return f"{words} {number}"
        return words


_METRIC_KEYS = frozenset(
    {
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.data_source.id",
        "server.address",
        "server.port",
        "pgr.phase",
    }
)


def round_of(effect: Ask) -> int | None:
    """The trace round an LLM call belongs to: augmentation, Phase 1 and each Phase-2 round open their
    round before they ask, so it is the latest one when its phase is the call's (the summary and the
    answer belong to none)."""
    rounds = effect.trace.rounds
    return rounds[-1].index if rounds and rounds[-1].phase == effect.phase else None


def data_source_id(store: Store) -> str:
    """``gen_ai.data_source.id``: a store's own ``data_source_id`` when it sets one, else its class name."""
    own = getattr(store, "data_source_id", None)
    return own if isinstance(own, str) and own else type(store).__name__


def _llm_attributes(llm: LLM | None) -> dict[str, Any]:
    """Provider, model and server of an LLM, as far as it tells: ``openai`` for anything speaking the
    OpenAI API (``base_url``), else its ``provider_name`` or the first word of its ``name``."""
    if llm is None:
        return {"gen_ai.provider.name": "unknown"}
    base_url = getattr(llm, "base_url", None)
    provider = getattr(llm, "provider_name", None)
    if not isinstance(provider, str) or not provider:
        from pgr_core.models.llm import OpenAICompatible

        provider = "openai" if isinstance(llm, OpenAICompatible) else str(getattr(llm, "name", "llm")).split(":")[0]
    out: dict[str, Any] = {"gen_ai.provider.name": provider}
    model = getattr(llm, "model", None)
    if isinstance(model, str) and model:
        out["gen_ai.request.model"] = model
    if isinstance(base_url, str) and base_url:
        parsed = urlparse(base_url)
        if parsed.hostname:
            out["server.address"] = parsed.hostname
            try:
                port = parsed.port
            except ValueError:
                port = None
            if port is None and parsed.scheme in ("http", "https"):
                port = 443 if parsed.scheme == "https" else 80
            if port is not None:
                out["server.port"] = port
    return out


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _input_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """The prompt in the conventions' input-messages shape, as JSON."""
    shaped = [
        {"role": m.get("role", "user"), "parts": [{"type": "text", "content": m.get("content", "")}]} for m in messages
    ]
    return json.dumps(shaped, ensure_ascii=False)


def _output_messages(text: str, finish_reason: str) -> str:
    shaped = [{"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": finish_reason}]
    return json.dumps(shaped, ensure_ascii=False)


def _documents(hit_lists: Sequence[Sequence[Any]]) -> str:
    """The facts a store round returned, once each, as the conventions' retrieval documents."""
    seen: dict[str, dict[str, Any]] = {}
    for hits in hit_lists:
        for h in hits:
            doc = seen.setdefault(h.key, {"id": h.fact.id, "score": 0.0, "content": h.fact.text})
            if h.neighbour_of is None:
                doc["score"] = max(doc["score"], round(float(h.score), 6))
    return json.dumps(list(seen.values()), ensure_ascii=False)


def _metric(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The span attributes a metric carries too (:data:`_METRIC_KEYS`)."""
    return {k: v for k, v in attributes.items() if k in _METRIC_KEYS}


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes without the unknown ones (OpenTelemetry refuses None)."""
    return {k: v for k, v in attributes.items() if v is not None}


def _histogram(meter: Any, name: str, unit: str, description: str, buckets: Sequence[float]) -> Any:
    try:
        return meter.create_histogram(
            name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:  # an API older than the bucket advice: the SDK's default buckets then
        return meter.create_histogram(name, unit=unit, description=description)
