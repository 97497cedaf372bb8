"""Unit tests (no cluster) of clusterproof.kube.preemption: which unbound preemptors are the known upstream
defect (kubernetes/kubernetes#141694: preemption finished, the pod parked until the scheduler's flush) and
which are not -- a victim still on its node, no Preempted event, an event naming another pod."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from clusterproof.kube import preemption

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 7, 15, 9, 41, tzinfo=timezone.utc)


def _event(uid: str, node: str, at: datetime, new_api: bool = False) -> dict:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if new_api else "%Y-%m-%dT%H:%M:%SZ")
    when = {"eventTime": stamp, "lastTimestamp": None} if new_api else {"lastTimestamp": stamp}
    return {"reason": "Preempted", "message": f"Preempted by pod {uid} on node {node}", **when,
            "metadata": {"creationTimestamp": "2026-12-07T00:00:00Z"}}


@pytest.mark.parametrize("events,busy,expected", [
    pytest.param([_event("u1", "n1", T0)], Counter(), {"p1"}, id="victim-gone-node-free: parked"),
    pytest.param([_event("u1", "n1", T0, new_api=True)], Counter(), {"p1"}, id="events.k8s.io-eventTime"),
    pytest.param([_event("u1", "n1", T0)], Counter({"n1": 1}), set(), id="victim-still-on-node: not parked"),
    pytest.param([], Counter(), set(), id="never-preempted: not parked"),
    pytest.param([_event("u9", "n1", T0)], Counter(), set(), id="event-of-another-preemptor: not parked"),
])
def test_a_preemptor_is_parked_only_when_its_preemption_finished(events, busy, expected):
    assert set(preemption.parked({"p1": "u1"}, events, busy)) == expected


def test_the_latest_preemption_of_a_pod_counts():
    got = preemption.parked({"p1": "u1"}, [_event("u1", "n1", T0 + timedelta(seconds=5)), _event("u1", "n2", T0)],
                            Counter({"n2": 1}))
    assert got == {"p1": preemption.Parked("p1", "n1", T0 + timedelta(seconds=5))}


def test_the_wait_ends_at_the_schedulers_own_flush_bound_after_the_last_preemption():
    pods = {"a": preemption.Parked("a", "n1", T0), "b": preemption.Parked("b", "n2", T0 + timedelta(seconds=10))}
    # 120 s of the check's own wait already spent after the later preemption
    assert preemption.flush_deadline_s(pods, now=T0 + timedelta(seconds=130)) == \
        preemption.FLUSH_S + preemption.SLACK_S - 120
    # the clocks differ, or the wait came late: never less than 30 s
    assert preemption.flush_deadline_s(pods, now=T0 + timedelta(hours=1)) == 30.0


def test_bound_at_reads_the_pods_scheduled_condition():
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                      "lastTransitionTime": "2026-12-07T15:15:11Z"}]}}
    assert (preemption.bound_at(pod) - T0).total_seconds() == 330
    assert preemption.bound_at({"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}}) is None
