"""One call's budget as the drivers keep it: what is left, and the stop thrown into a flow when a cap
refuses an LLM call (the phase that asked catches it and keeps what it has)."""

from __future__ import annotations

import time

from pgr_core.errors import LLMError
from pgr_core.flow.effects import Ask, Effect
from pgr_core.models.llm import Usage as CallUsage
from pgr_core.observability.trace import BudgetReason
from pgr_core.types import Budget

__all__ = ["BudgetStop", "Meter"]


class BudgetStop(Exception):
    """Thrown into the flow when a cap refuses an LLM call; the phase that asked catches it."""

    def __init__(self, reason: BudgetReason, phase: str, detail: str) -> None:
        super().__init__(detail)
        self.reason: BudgetReason = reason
        self.phase = phase


class Meter:
    """One call's budget and what is left of it. Spending is read from the call's own trace."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.started = time.perf_counter()
        self.reserved_calls = 0  # kept back for the answer while retrieving
        self.reserved_tokens = 0

    def time_left(self) -> float | None:
        if self.budget.deadline_s is None:
            return None
        return self.budget.deadline_s - (time.perf_counter() - self.started)

    def expired(self) -> bool:
        left = self.time_left()
        return left is not None and left <= 0

    def admit(self, effect: Ask) -> None:
        """Raise :class:`BudgetStop` unless the LLM call ``effect`` fits in what is left."""
        b, spent = self.budget, effect.trace.usage
        if self.expired():
            raise BudgetStop("deadline", effect.phase, f"the {b.deadline_s:g}s deadline passed")
        if b.max_llm_calls is not None and spent.llm_calls + 1 + self.reserved_calls > b.max_llm_calls:
            raise BudgetStop(
                "budget_llm_calls", effect.phase, f"{spent.llm_calls} of {b.max_llm_calls} LLM calls spent"
            )
        if b.max_tokens is not None:
            need = CallUsage.estimate(effect.messages, "").prompt_tokens + effect.max_tokens
            if spent.total_tokens + need + self.reserved_tokens > b.max_tokens:
                raise BudgetStop(
                    "budget_tokens",
                    effect.phase,
                    f"{spent.total_tokens} of {b.max_tokens} tokens spent; the next call may take {need}",
                )

    def explain(self, exc: BaseException, effect: Effect) -> BaseException:
        """An LLM failure once the deadline has passed is the deadline's doing."""
        if isinstance(exc, LLMError) and isinstance(effect, Ask) and self.expired():
            return BudgetStop("deadline", effect.phase, f"the {self.budget.deadline_s:g}s deadline passed ({exc})")
        return exc
