"""Two checks with progress lines, a phase and a heartbeat (tests/test_progress.py runs them): each
check's log in the report must carry its own lines, with their time, and only its own; the phase
must be an Allure step with its duration."""
from clusterproof.core import progress
from clusterproof.core.waiting import wait_for

progress.HEARTBEAT_S = 0.3   # a wait of a second must show heartbeats


def test_first_check_with_a_phase_and_a_wait():
    progress.say("first check: its own line")
    with progress.phase("create 3 widgets"):
        polls = []
        wait_for(lambda: polls.append(1) or len(polls), until=lambda n: n >= 25, timeout=30, interval=0.05,
                 what="25 widgets", describe=lambda n: f"{n} widgets")


def test_second_check():
    progress.say("second check: its own line")
