"""Checks with progress lines, a phase, a heartbeat and a library's warnings (tests/test_progress.py runs
them): each check's log in the report must carry its own lines, with their time, and only its own; the
phase must be an Allure step with its duration; a library's warnings stay out of the terminal."""
import pytest

from clusterproof.core import progress
from clusterproof.core.waiting import wait_for

progress.HEARTBEAT_S = 0.3   # a wait of a second must show heartbeats


@pytest.mark.unit
def test_first_check_with_a_phase_and_a_wait():
    progress.say("first check: its own line")
    with progress.phase("create 3 widgets"):
        polls = []
        wait_for(lambda: polls.append(1) or len(polls), until=lambda n: n >= 25, timeout=30, interval=0.05,
                 what="25 widgets", describe=lambda n: f"{n} widgets")


@pytest.mark.unit
def test_second_check():
    progress.say("second check: its own line")


@pytest.mark.unit
def test_third_check_where_a_library_warns():
    import logging
    pool = logging.getLogger("urllib3.connectionpool")
    for _ in range(3):
        pool.warning("Connection pool is full, discarding connection (self-test)")
    pool.error("a library's error (self-test)")
    progress.say("third check: its own line")
