"""Pod timelines observed by the client: created, bound and Running times per pod.

Why client-side: object timestamps (creationTimestamp, condition times) have
1 s granularity, too coarse for a 5 s p99 on bursts that last a few seconds.
One raw list+watch, started *before* the load, stamps every transition with
this machine's monotonic clock as the watch delivers it; because creation
and Running are seen through the same stream, its delivery delay mostly
cancels out of the difference.

Measurement only: what load to apply lives in ``load/``. ``PodTimeline``
starts before the load (``start``) and is read after it (``wait_running``,
``summary``).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from kubernetes import client

from clusterproof.core.timeparse import epoch
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.informer import Informer

JOB_LABEL = "clusterproof.io/job"


@dataclass
class PodTimes:
    """One pod's way to Running, twice: as this client's watch saw it (monotonic clock, sub-ms),
    and as the cluster wrote it into the object (epoch seconds, 1 s resolution)."""
    name: str
    job: str
    added: float                 # monotonic time the watch first saw the pod
    bound: float | None = None   # ... first saw spec.nodeName
    running: float | None = None  # ... first saw status.phase Running
    node: str | None = None
    added_wall: float = 0.0      # wall-clock time of ``added`` (to compare with the object's timestamps)
    running_wall: float | None = None
    created_ts: float | None = None    # metadata.creationTimestamp (the apiserver's clock)
    scheduled_ts: float | None = None  # PodScheduled=True lastTransitionTime (the bind)
    ready_ts: float | None = None      # Ready=True lastTransitionTime (the kubelet -- kwok -- started it)

    @property
    def startup_s(self) -> float | None:
        """Created -> Running as the watch saw both."""
        return None if self.running is None else self.running - self.added

    @property
    def startup_server_s(self) -> float | None:
        """Created -> Ready by the object's own timestamps: the cluster's latency, without the watch."""
        if self.ready_ts is None or self.created_ts is None:
            return None
        return self.ready_ts - self.created_ts

    @property
    def watch_lag_created_s(self) -> float | None:
        """How late the watch showed the new pod (creationTimestamp is truncated to the second:
        this overstates the lag by 0.5 s on average)."""
        return None if self.created_ts is None else self.added_wall - self.created_ts

    @property
    def watch_lag_running_s(self) -> float | None:
        """How late the watch showed the pod Running after the kubelet marked it Ready (same caveat)."""
        if self.running_wall is None or self.ready_ts is None:
            return None
        return self.running_wall - self.ready_ts


def _condition_time(status: dict, kind: str) -> float | None:
    for c in status.get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return epoch(c.get("lastTransitionTime"))
    return None


def startup_server_s(pod: dict) -> float | None:
    """Created -> Ready of one pod object, by its own timestamps (``PodTimes.startup_server_s`` for a pod a
    timeline did not follow; 1 s resolution)."""
    created = epoch((pod.get("metadata") or {}).get("creationTimestamp"))
    ready = _condition_time(pod.get("status") or {}, "Ready")
    return None if created is None or ready is None else ready - created


class PodTimeline:
    """A background informer on the pods matching ``label_selector`` in ``namespace``."""

    def __init__(self, api: client.ApiClient, namespace: str, label_selector: str):
        self.pods: dict[str, PodTimes] = {}
        self.started_at = 0.0
        self._lock = threading.Lock()
        # Short watch chunks, so that stop() is honoured within seconds.
        self.informer = Informer(api, f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": label_selector},
                                 self._apply, chunk_s=5)

    @property
    def error(self) -> str | None:
        return self.informer.error

    def start(self, timeout: float = 30) -> "PodTimeline":
        self.informer.start(timeout)
        self.started_at = time.monotonic()
        return self

    def stop(self) -> None:
        self.informer.stop()

    def interruptions(self) -> list[str]:
        """Why this timeline's times may be late: its watch was cut off, or had to relist (410 Gone,
        e.g. after an apiserver restart). A transition that happened meanwhile is stamped when the
        watch saw it again, not when it happened."""
        out = [f"the pod watch was {o} (last: {o.last_error})" for o in self.informer.outages]
        if self.informer.relists:
            out.append(f"the pod watch had to relist {self.informer.relists} time(s) (410 Gone: the API server no "
                       "longer had the events since its last resourceVersion)")
        return out

    def _apply(self, kind: str, obj: dict) -> None:
        now = time.monotonic()
        meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status", {})
        with self._lock:
            p = self.pods.get(meta["name"])
            if p is None:
                if kind == "DELETED":
                    return
                p = self.pods[meta["name"]] = PodTimes(meta["name"], (meta.get("labels") or {}).get(JOB_LABEL, ""),
                                                       now, added_wall=time.time(),
                                                       created_ts=epoch(meta.get("creationTimestamp")))
            if spec.get("nodeName") and p.bound is None:
                p.bound, p.node = now, spec["nodeName"]
            if status.get("phase") == "Running" and p.running is None:
                p.running, p.running_wall = now, time.time()
            p.scheduled_ts = p.scheduled_ts or _condition_time(status, "PodScheduled")
            p.ready_ts = p.ready_ts or _condition_time(status, "Ready")

    def snapshot(self) -> list[PodTimes]:
        with self._lock:
            return [PodTimes(**vars(p)) for p in self.pods.values()]

    def counts(self) -> dict[str, int]:
        pods = self.snapshot()
        return {"seen": len(pods), "bound": sum(p.bound is not None for p in pods),
                "running": sum(p.running is not None for p in pods)}

    def wait_running(self, expected: int, timeout: float, stall_timeout: float) -> dict[str, int]:
        """Wait until ``expected`` pods are Running; fail early when nothing progresses.

        Two bounds: ``timeout`` overall, and ``stall_timeout`` without any pod
        newly seen, bound or Running (a stopped scheduler binds nothing; the
        run must say so in seconds, not after the overall bound).
        """
        last = {"state": None, "at": time.monotonic()}

        def probe():
            self.informer.check()
            state = self.counts()
            # While the watch is cut off, progress cannot be seen: the stall clock waits with it
            # (the informer itself gives up, in one line, if the cut lasts).
            if state != last["state"] or not self.informer.connected:
                last["state"], last["at"] = state, time.monotonic()
            state = dict(state, stalled_s=round(time.monotonic() - last["at"], 1))
            return state

        def until(state):
            if state["stalled_s"] > stall_timeout:
                raise WaitTimeout(f"no progress for {stall_timeout:g} s: {state['seen']} pods seen, "
                                  f"{state['bound']} bound, {state['running']} Running of {expected}")
            return state["running"] >= expected

        return wait_for(probe, until=until, timeout=timeout, interval=0.2,
                        what=f"all {expected} pods Running")


@dataclass
class JobTimes:
    job: str
    pods: int
    bound: int
    running: int
    first_create_to_all_bound_s: float | None


def job_times(pods: list[PodTimes]) -> list[JobTimes]:
    out = []
    for job in sorted({p.job for p in pods}):
        mine = [p for p in pods if p.job == job]
        bound = [p.bound for p in mine if p.bound is not None]
        complete = len(bound) == len(mine)
        out.append(JobTimes(job, len(mine), len(bound), sum(p.running is not None for p in mine),
                            (max(bound) - min(p.added for p in mine)) if complete and bound else None))
    return out


def scheduling_throughput(pods: list[PodTimes]) -> float:
    """Pods bound per second, from the first pod seen to the last pod bound."""
    bound = [p.bound for p in pods if p.bound is not None]
    if len(bound) < 2:
        return 0.0
    span = max(bound) - min(p.added for p in pods)
    return len(bound) / span if span > 0 else float("inf")


def dump(pods: list[PodTimes]) -> str:
    """Per-pod times relative to the first pod seen, as JSON lines (an attachment)."""
    t0 = min((p.added for p in pods), default=0.0)
    rel = lambda t: None if t is None else round(t - t0, 4)  # noqa: E731
    return "\n".join(json.dumps({"pod": p.name, "job": p.job, "node": p.node, "added": rel(p.added),
                                 "bound": rel(p.bound), "running": rel(p.running)})
                     for p in sorted(pods, key=lambda p: p.added))
