"""What a domain hands the report beside its figures: a named body (text, JSON, CSV, YAML) or a file, as data.

Why: only ``clusterproof.report`` talks to Allure (tests/test_architecture.py holds it), so the report's
shape is decided in one room and a domain runs the same under pytest and in a bench. A domain that has
something for a check's page -- the flood's FlowSchema, a placement table, the preflight agent's log --
makes an ``Attachment`` and hands it over:

- a function that only renders returns them (the caller attaches them);
- a set-up, measurement, guard or tear-down that makes one along the way gives it, at that moment, to the
  ``attach`` callable its caller passed -- so one made before a later step fails still reaches the page,
  and a file is read before it is removed.

The pytest face passes ``clusterproof.report.allure.attach``; a bench, which has no page, passes ``drop``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# What the body is: the report shows (and names the file) by it.
TEXT, JSON, CSV, YAML = "text", "json", "csv", "yaml"
KINDS = (TEXT, JSON, CSV, YAML)


@dataclass(frozen=True)
class Attachment:
    """One attachment of a check's page: its name as the page shows it, its body and its kind. ``source``:
    a file attached as it is when handed over (its body is then empty)."""
    name: str
    body: str = ""
    kind: str = TEXT
    source: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"attachment {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @classmethod
    def file(cls, path: Path | str, name: str, kind: str = TEXT) -> Attachment:
        return cls(name, "", kind, Path(path))


Attach = Callable[[Attachment], None]


def drop(attachment: Attachment) -> None:
    """An ``attach`` for a caller without a report page (a bench): the attachment goes nowhere."""
