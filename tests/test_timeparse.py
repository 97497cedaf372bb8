"""The one parser of times and durations (clusterproof.core.timeparse): what each API and log writes."""
from __future__ import annotations

import datetime as dt

import pytest

from clusterproof.core.timeparse import MICRO, duration_s, epoch, format_time, go_duration_s, http_date, parse_time

pytestmark = pytest.mark.unit

UTC = dt.timezone.utc


@pytest.mark.parametrize("text,want", [
    ("2024-05-01T12:00:00Z", dt.datetime(2024, 5, 1, 12, tzinfo=UTC)),                     # metav1.Time
    ("2024-05-01T12:00:00.123456Z", dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),  # MicroTime
    ("2024-05-01T12:00:00.123456789Z", dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)),  # RFC3339Nano
    ("2024-05-01T14:00:00+02:00", dt.datetime(2024, 5, 1, 12, tzinfo=UTC)),                  # an offset
])
def test_rfc3339_times_are_utc(text, want):
    assert parse_time(text) == want
    assert parse_time(text).tzinfo == UTC


@pytest.mark.parametrize("text", [None, "", "yesterday", "2024-13-01T00:00:00Z"])
def test_no_time_is_none(text):
    assert parse_time(text) is None and epoch(text) is None


def test_written_and_read_back():
    t = dt.datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)
    assert parse_time(t.strftime(MICRO)) == t
    assert format_time(t) == "2024-05-01T12:00:00Z" and parse_time(format_time(t)) == t.replace(microsecond=0)
    assert epoch("1970-01-01T00:01:00Z") == 60.0


def test_http_dates():
    assert http_date("Wed, 01 May 2024 12:00:00 GMT") == dt.datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert http_date(None) is None and http_date("not a date") is None


@pytest.mark.parametrize("text,seconds", [("1m2.5s", 62.5), ("350.2ms", 0.3502), ("12µs", 12e-6), ("1h0m0s", 3600),
                                          ("0s", 0), ("0", 0), ("-1.5s", -1.5), ("2m", 120)])
def test_go_durations(text, seconds):
    assert go_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "1x", "m", "1.5"])
def test_bad_go_durations(text):
    with pytest.raises(ValueError):
        go_duration_s(text)


def test_prometheus_durations_take_no_fraction():
    assert duration_s("1h30m") == 5400
    with pytest.raises(ValueError):
        duration_s("1.5s")
