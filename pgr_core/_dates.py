"""Date parsing and comparison, with one rule: never mix naive and aware datetimes silently.

Two places dates come from, two policies:

- Dates pgr is *given* (``retrieve(date=...)``, facts written to the embedded store) are taken as they
  are; a naive one next to an aware one is refused (:func:`check_same_kind`), since only the caller
  knows what a naive time means.
- Dates pgr *reads* from a framework's store (a Qdrant payload, a mem0 record, LlamaIndex metadata)
  were written by others, and one store often holds both kinds (mem0's own ``add`` stamps aware UTC
  times next to the naive ones an application passed). Refusing them would refuse every query that
  meets one, so :func:`read_stored_date` reads a naive stored time as UTC: every date such a store
  returns is aware. Such a store says so (``naive_dates_are_utc = True``), and PGR then reads a naive
  query date as UTC too (:func:`as_utc`), so the comparison never mixes kinds whichever the caller
  passes. An aware date keeps its own offset.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time

from pgr_core.errors import InvalidArgumentError

DateLike = str | date | datetime


def parse_date(value: DateLike | None, *, what: str = "date") -> datetime | None:
    """Turn ``value`` into a datetime (midnight for a bare date); ``None`` stays ``None``.

    >>> parse_date("2025-05-01")
    datetime.datetime(2025, 5, 1, 0, 0)
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return datetime.combine(value, time())
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgumentError(
                f"{what} {value!r} is not an ISO date; pass e.g. '2025-05-01' or "
                "'2025-05-01T18:30:00+02:00', or a date/datetime object"
            ) from None
    raise InvalidArgumentError(f"{what} must be a str, date or datetime, not {type(value).__name__}")


def read_date(value: object) -> datetime | None:
    """A date stored by some framework, read leniently: ISO text, a date, a datetime or a Unix
    timestamp; anything unreadable is ``None``, since one bad date must not fail every search."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    try:
        return parse_date(value)  # type: ignore[arg-type]
    except InvalidArgumentError:
        return None


def read_stored_date(value: object) -> datetime | None:
    """:func:`read_date` for a date a framework's store holds: a naive result is read as UTC, so every
    date the adapters return is timezone-aware (see the module docstring).

    >>> read_stored_date("2025-03-01")
    datetime.datetime(2025, 3, 1, 0, 0, tzinfo=datetime.timezone.utc)
    """
    moment = read_date(value)
    return None if moment is None else as_utc(moment)


def as_utc(moment: datetime) -> datetime:
    """``moment`` itself when timezone-aware (its offset kept); a naive one read as UTC."""
    return moment if is_aware(moment) else moment.replace(tzinfo=UTC)


def is_aware(moment: datetime) -> bool:
    return moment.tzinfo is not None and moment.tzinfo.utcoffset(moment) is not None


def check_same_kind(a: datetime, b: datetime, *, a_name: str, b_name: str) -> None:
    """Raise when one datetime is timezone-aware and the other naive (Python would raise TypeError)."""
    if is_aware(a) != is_aware(b):
        aware, naive = (a_name, b_name) if is_aware(a) else (b_name, a_name)
        raise InvalidArgumentError(
            f"{aware} is timezone-aware but {naive} is naive; use the same kind for both "
            "(add a tzinfo to the naive one, or drop it from the aware one)"
        )


def relative_age(fact_date: datetime, query_date: datetime) -> str:
    """How long before (or after) the query date a fact is dated, in words a prompt can use."""
    check_same_kind(fact_date, query_date, a_name="a fact's date", b_name="the query date")
    days = (query_date - fact_date).days
    if days == 0:
        return "same day"
    span = abs(days)
    if span < 14:
        amount = f"{span} day{'s' if span != 1 else ''}"
    elif span < 60:
        amount = f"{span // 7} weeks"
    elif span < 730:
        amount = f"{span // 30} months"
    else:
        amount = f"{span // 365} years"
    return f"{amount} {'before' if days > 0 else 'after'}"
