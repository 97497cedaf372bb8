"""Figures: what a check or a benchmark measured, typed, and the one route they take to every report.

Why one type: a figure is read by four readers -- the check's Allure page,
the run's ``summary.json``, a benchmark's JSON and the comparison with a
baseline -- and each used to get its own dict. A ``Figure`` carries what
all of them need: the check it belongs to, its name, value and unit, the
threshold the check holds it to (and the comparison ``op``), the direction
in which it gets better, whether it is a headline figure, and its verdict
against its threshold.

Two ways to make figures:

- a check records them through the ``figures`` fixture (``FigureRecorder.add``,
  see ``clusterproof.fixtures.report``), the same arguments as a Figure's
  own;
- a domain's measurement (the idea of ClusterLoader2's ``Measurement`` and
  kube-burner's measurement factory) is an object with ``start()``,
  ``gather() -> list[Figure]`` and ``dispose()``; ``measuring(m)`` runs one,
  and a recorder's ``extend(m.gather())`` files its figures under the check.
  Most domain results are ``Typed``: a dataclass whose figure fields are
  declared with ``measured(unit)``. A check reads them as attributes
  (``run.figures.create_qps``), never by a string key, and states its own
  figure (name, threshold, headline) from them; ``gather()`` hands every
  one of them on, named by its field, to a bench or an attachment.

``Figures`` is the run's store of them (one per session, held by the
report's session object, never a module global). Pure: no pytest, no
cluster.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, runtime_checkable

LOWER, HIGHER, NONE = "lower", "higher", "none"
DIRECTIONS = (LOWER, HIGHER, NONE)
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
WITHIN, BEYOND = "within", "beyond"

# Units whose smaller value is better, and whose larger is. A ceiling (<=) makes a figure "lower is
# better" whatever its unit (latency, 5xx count); a floor (>=) only for a rate -- a count that must
# reach a number ("at least one 429", "every planned pod") is a verdict, not a figure to improve.
# Anything else is shown, never judged.
LOWER_UNITS = frozenset({"s", "ms", "MiB", "B", "B/s", "bytes"})
HIGHER_UNITS = frozenset({"pods/s", "nodes/s"})


def better_of(unit: str, threshold: float | None, op: str | None) -> str:
    """The direction in which a figure gets better, from its threshold or else its unit."""
    if threshold is not None and op in ("<=", "<"):
        return LOWER
    if unit in HIGHER_UNITS and op != "==":
        return HIGHER
    if threshold is None and unit in LOWER_UNITS:
        return LOWER
    return NONE


def number(value) -> float | None:
    """A figure's value as a finite float, or None (not measured, not a number, infinite)."""
    try:
        v = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return v if v is not None and math.isfinite(v) else None


@dataclass(frozen=True)
class Figure:
    """One measured figure. ``check`` is the pytest node id of the check (or a benchmark's name);
    ``op`` is set only with a threshold; ``direction``: lower, higher or none (never judged)."""
    check: str
    name: str
    value: float | None
    unit: str
    threshold: float | None = None
    op: str | None = None
    direction: str = NONE
    headline: bool = False

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"figure {self.name!r}: direction {self.direction!r} is not one of {DIRECTIONS}")
        if self.op is not None and self.op not in OPS:
            raise ValueError(f"figure {self.name!r}: op {self.op!r} is not one of {tuple(OPS)}")

    @classmethod
    def of(cls, check: str, name: str, value, unit: str, threshold: float | None = None, op: str = "<=",
           better: str | None = None, headline: bool = False) -> "Figure":
        """A figure as a check states it (the ``figures`` fixture's arguments): the value made a finite
        float or None, ``op`` kept only with a threshold, the direction from ``better`` or else
        from the threshold and the unit (``better_of``)."""
        return cls(check, name, number(value), unit, threshold, op if threshold is not None else None,
                   better or better_of(unit, threshold, op), headline)

    @property
    def key(self) -> str:
        """The figure's key in summary.json and in a comparison: ``<check> :: <name>``."""
        return f"{self.check} :: {self.name}"

    @property
    def verdict(self) -> str | None:
        """``within`` or ``beyond`` its threshold; None without a threshold or a value."""
        if self.threshold is None or self.value is None or self.op is None:
            return None
        return WITHIN if OPS[self.op](self.value, self.threshold) else BEYOND

    def shown(self) -> str:
        """The value for a reader: '1.23 s (threshold <= 5 s)', or 'n/a'."""
        out = "n/a" if self.value is None else f"{self.value:.3g} {self.unit}"
        if self.threshold is not None:
            out += f" (threshold {self.op} {self.threshold:g} {self.unit})"
        return out

    def in_check(self, check: str) -> "Figure":
        return dataclasses.replace(self, check=check)

    def to_json(self) -> dict:
        """summary.json's shape (``better`` is the direction; ``verdict`` is derived)."""
        return {"check": self.check, "name": self.name, "value": self.value, "unit": self.unit,
                "better": self.direction, "threshold": self.threshold, "op": self.op,
                "headline": self.headline, "verdict": self.verdict}

    @classmethod
    def from_json(cls, d: dict, key: str | None = None) -> "Figure":
        """A figure read back from summary.json (or a baseline: missing fields take their defaults;
        ``key`` names check and name when the entry lacks them)."""
        check, _, name = (key or "").rpartition(" :: ")
        better = d.get("better") or d.get("direction") or NONE
        threshold = number(d.get("threshold"))
        return cls(d.get("check") or check, d.get("name") or name or (key or ""), number(d.get("value")),
                   d.get("unit") or "", threshold, d.get("op") if threshold is not None else None,
                   better if better in DIRECTIONS else NONE, bool(d.get("headline")))


class Figures:
    """The run's figures, one per key (a figure recorded again under the same key replaces the first)."""

    def __init__(self, figures: Iterable[Figure] = ()) -> None:
        self._by_key: dict[str, Figure] = {}
        for f in figures:
            self.add(f)

    def add(self, figure: Figure) -> Figure:
        self._by_key[figure.key] = figure
        return figure

    def for_check(self, check: str) -> list[Figure]:
        return [f for f in self._by_key.values() if f.check == check]

    def all(self) -> list[Figure]:
        return list(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    def to_json(self) -> dict[str, dict]:
        """``{key: figure}``, summary.json's ``figures``."""
        return {f.key: f.to_json() for f in self._by_key.values()}

    @classmethod
    def from_json(cls, figures: dict[str, dict]) -> "Figures":
        return cls(Figure.from_json(d, k) for k, d in figures.items())


class FigureRecorder:
    """One check's figures: what the ``figures`` fixture hands a check. Each figure goes into the run's
    store (the check's Allure page reads its table from there when the check ends); ``shown``, if given, is
    told of each as it is recorded."""

    def __init__(self, check: str, store: Figures, shown: Callable[[Figure], None] | None = None) -> None:
        self.check, self.store, self._shown = check, store, shown

    def add(self, name: str, value: float | None, unit: str, threshold: float | None = None, op: str = "<=",
            better: str | None = None, headline: bool = False) -> Figure:
        return self.record(Figure.of(self.check, name, value, unit, threshold, op, better, headline))

    def record(self, figure: Figure) -> Figure:
        """A figure made elsewhere (a measurement's), filed under this check."""
        figure = self.store.add(figure.in_check(self.check))
        if self._shown is not None:
            self._shown(figure)
        return figure

    def extend(self, figures: Iterable[Figure]) -> list[Figure]:
        return [self.record(f) for f in figures]

    def all(self) -> list[Figure]:
        return self.store.for_check(self.check)


@runtime_checkable
class Measurement(Protocol):
    """What a domain measures around a piece of load: started before it, gathered after it (typed
    figures; their ``check`` is filled in by the recorder that files them), disposed of at the end
    whatever happened. ``Base`` gives no-op start and dispose."""

    def start(self) -> None: ...

    def gather(self) -> list[Figure]: ...

    def dispose(self) -> None: ...


class Base:
    """A measurement that needs no start or dispose of its own; subclasses write ``gather``."""

    def start(self) -> None:
        return None

    def gather(self) -> list[Figure]:
        raise NotImplementedError

    def dispose(self) -> None:
        return None


UNIT = "clusterproof.unit"     # a dataclass field's metadata key: the field is a figure in this unit


def measured(unit: str, **field_args: Any) -> Any:
    """A field of a ``Typed`` result that is a figure, in ``unit`` (``field_args``: ``dataclasses.field``'s)."""
    return dataclasses.field(metadata={UNIT: unit}, **field_args)


class Typed(Base):
    """A measurement whose result is a dataclass. Its figure fields (``measured(unit)``) are read as attributes,
    so a misspelt one fails at once instead of reading None; ``gather()`` gives each as a figure named by its
    field (a bench's key), other fields (lists, names, notes) are data beside them."""

    def gather(self) -> list[Figure]:
        return [figure(f.name, getattr(self, f.name), f.metadata[UNIT])
                for f in dataclasses.fields(self) if UNIT in f.metadata]

    def to_dict(self) -> dict:
        """Every field, figures and data, as JSON takes it (an attachment, a bench's record)."""
        return dataclasses.asdict(self)


@contextlib.contextmanager
def measuring(m: Measurement) -> Iterator[Measurement]:
    """``with measuring(m): <load>`` -- started, then disposed of whatever happened; gather() inside."""
    m.start()
    try:
        yield m
    finally:
        m.dispose()


def figure(name: str, value, unit: str, threshold: float | None = None, op: str = "<=",
           better: str | None = None, headline: bool = False, check: str = "") -> Figure:
    """A figure outside a check (a measurement's or a benchmark's); a recorder files it under its check."""
    return Figure.of(check, name, value, unit, threshold, op, better, headline)
