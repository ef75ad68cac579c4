"""The guideline S: the natural-language text that tells extraction what to remember and how.

MemCoE writes memory evolution as M(t+1) = T(M(t), h(t); S). S is a versioned text artifact: it holds
placeholders (``{types}``) that are filled at extraction time, and guideline induction edits it. An
edit that drops a placeholder is refused, so every version stays usable.

>>> DEFAULT_GUIDELINE.render().startswith("Keep a memory")
True
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pgr_core.errors import InvalidArgumentError

__all__ = ["DEFAULT_GUIDELINE", "FACT_TYPES", "Guideline", "GuidelineError", "type_lines"]

# The six types of the reference memory, each with what it is for.
FACT_TYPES: Mapping[str, str] = {
    "Identity": "who the user is: name, age, job, family, where they live, health conditions",
    "Preference": "what the user likes, dislikes, avoids or insists on",
    "Goal": "what the user wants to achieve or plans to do",
    "Interest": "topics and hobbies the user cares about",
    "Activity": "what the user does regularly or is doing now",
    "Event": "something that happened to or around the user, at a date",
}

PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


class GuidelineError(InvalidArgumentError):
    """A guideline text that cannot be used: empty, too long, or missing a required placeholder."""


def type_lines(types: Mapping[str, str] = FACT_TYPES) -> str:
    """The value of ``{types}``: one line per type, ``- Name: what it holds``."""
    return "\n".join(f"- {name}: {what}" for name, what in types.items())


@dataclass(frozen=True)
class Guideline:
    """A guideline text S with its version number and the placeholders it must keep.

    ``render()`` fills only the named placeholders (any other brace is left alone, so an edited S may
    quote JSON). ``edited(text)`` makes the next version and refuses a text that dropped a placeholder.
    """

    text: str
    version: int = 0
    placeholders: tuple[str, ...] = ("types",)
    note: str = ""  # why this version exists (e.g. the critique it answers)
    parent: int | None = None
    max_chars: int = 6000
    values: Mapping[str, str] = field(default_factory=lambda: {"types": type_lines()})

    def __post_init__(self) -> None:
        self.validate(self.text)

    def validate(self, text: str) -> None:
        """Raise :class:`GuidelineError` unless ``text`` is a usable version of this guideline."""
        if not isinstance(text, str) or not text.strip():
            raise GuidelineError("a guideline must be non-empty text")
        if len(text) > self.max_chars:
            raise GuidelineError(f"a guideline must be at most {self.max_chars} characters, got {len(text)}")
        missing = [p for p in self.placeholders if "{" + p + "}" not in text]
        if missing:
            names = ", ".join("{" + p + "}" for p in missing)
            raise GuidelineError(f"the guideline lost its placeholder(s) {names}; keep them verbatim in the text")

    @property
    def id(self) -> str:
        """A short content hash, to tell versions apart in logs and fact metadata."""
        return hashlib.sha1(self.text.encode("utf-8")).hexdigest()[:10]

    @property
    def type_names(self) -> list[str]:
        return list(FACT_TYPES)

    def render(self, **values: str) -> str:
        """S with its placeholders filled (defaults: ``{types}`` lists the six fact types)."""
        filled = {**self.values, **values}

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            return filled[name] if name in self.placeholders and name in filled else match.group(0)

        return PLACEHOLDER.sub(fill, self.text).strip()

    def edited(self, text: str, *, note: str = "") -> Guideline:
        """The next version, with ``text`` (validated: placeholders intact)."""
        self.validate(text)
        return replace(self, text=text.strip() + "\n", version=self.version + 1, parent=self.version, note=note)

    def save(self, folder: str | Path) -> Path:
        """Write ``S_v{version:03d}.md`` into ``folder`` and return its path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"S_v{self.version:03d}.md"
        path.write_text(self.text, encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, *, version: int | None = None) -> Guideline:
        """Read a guideline file; its version comes from an ``S_vNNN`` name unless given."""
        path = Path(path)
        if not path.is_file():
            raise GuidelineError(f"no guideline file at {path}")
        if version is None:
            m = re.search(r"S_v(\d+)", path.stem)
            version = int(m.group(1)) if m else 0
        return cls(path.read_text(encoding="utf-8"), version=version)


DEFAULT_GUIDELINE = Guideline(
    """Keep a memory of the user that will help an assistant serve them well in later conversations.

Write each fact as one short statement about the user (at most 25 words), in the third person
("The user ..."), with names instead of pronouns and absolute dates instead of "yesterday" or "next
week". One idea per fact: split "likes hiking and hates the cold" into two facts.

Give every fact exactly one type:
{types}

Keep what will still matter later: stable traits, likes and dislikes with their reasons, plans,
habits, health limits, and dated events. Say how strongly the user holds a preference ("refuses",
"prefers", "is trying"). Skip small talk, the assistant's own suggestions, and anything the user only
asked about without saying it applies to them.

When the conversation repeats or changes something already remembered, update that fact instead of
adding a copy: write the fact as it now stands.
"""
)
