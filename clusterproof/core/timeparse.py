"""Times and durations as Kubernetes, Prometheus and Go write them: the one place they are parsed (pure).

Why one place: each reader had its own ``strptime`` or ``fromisoformat``, and
each knew a different subset of RFC 3339 -- one cut the fraction off, one did
not take an offset, one failed on a 9-digit fraction. A timestamp from the API
(``creationTimestamp``, a condition's ``lastTransitionTime``, a Lease's
``renewTime``, an audit event's ``stageTimestamp``) goes through
``parse_time``; a duration through ``duration_s`` (Prometheus' form, also a
profile key's) or ``go_duration_s`` (what Go's ``time.Duration`` prints in a
log line).
"""
from __future__ import annotations

import datetime as dt
import email.utils
import re

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"      # metav1.Time: RFC 3339 to the second, UTC
MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"         # metav1.MicroTime (a Lease's acquireTime, renewTime)


def parse_time(value: str | None) -> dt.datetime | None:
    """An RFC 3339 timestamp (``Z`` or an offset, any fraction) as an aware UTC datetime; None for an empty
    or unreadable value (an object the API has not stamped yet)."""
    if not value:
        return None
    try:
        t = dt.datetime.fromisoformat(str(value).strip())
    except ValueError:
        return None
    return (t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t).astimezone(dt.timezone.utc)


def epoch(value: str | None) -> float | None:
    """``parse_time`` as seconds since the epoch."""
    t = parse_time(value)
    return t.timestamp() if t is not None else None


def format_time(t: dt.datetime | None = None) -> str:
    """A time (default: now) as metav1.Time writes it: ``2024-05-01T12:00:00Z``."""
    return (t or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).strftime(TIME_FORMAT)


def http_date(value: str | None) -> dt.datetime | None:
    """An HTTP ``Date`` header (RFC 9110) as an aware UTC datetime; None without one."""
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).astimezone(dt.timezone.utc)
    except (TypeError, ValueError):
        return None


# --- durations --------------------------------------------------------------------------------------

_PROM = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_PROM_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_GO = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def duration_s(text: str) -> float:
    """Seconds of a Prometheus duration (``2s``, ``500ms``, ``10m``, ``1h30m``; a bare number is seconds);
    ValueError for anything else."""
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PROM.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a Prometheus duration (like 2s, 500ms, 10m, 1h30m)")
    return sum(int(n) * _PROM_S[u] for n, u in parts)


def go_duration_s(text: str) -> float:
    """Seconds of a Go ``time.Duration`` as it prints (``1m2.5s``, ``350.2ms``, ``12µs``, ``-1.5s``, ``0s``);
    ValueError for anything else."""
    text = str(text).strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    parts = _GO.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{text!r} is not a Go duration (like 1m2.5s, 350ms, 12µs)")
    return sign * sum(float(n) * _GO_S[u] for n, u in parts)
