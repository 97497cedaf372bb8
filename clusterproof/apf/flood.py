"""The flood, measured: a well-behaved client, node heartbeats and the apiserver's per-flow counters,
watched before, during and after a locust flood (``load/flood.py``).

Why here, apart from the load: ClusterLoader2's rule -- measurements start
before the phase and gather after it. Three observers run in threads of the
pytest process while locust floods from its own process:

- ``WellBehaved``: a second identity (its own ServiceAccount, so another
  flow: ``service-accounts`` -> ``workload-low`` on a stock cluster) sends a
  paced stream of small requests (ConfigMap create/get/delete) and, during
  the flood, creates pods the scheduler must bind. Every request's latency,
  status and APF headers are kept; 429s are counted, never retried (its
  client has ``retries=False``).
- ``FlowSampler``: the apiserver's ``/metrics`` every ``SAMPLE_S``: requests
  dispatched and rejected per flow schema, and queued/executing per level --
  the data of the "429s per flow schema over time" plot.
- ``HeartbeatWatch``: every node Lease in ``kube-node-lease``, listed every
  ``LEASE_SAMPLE_S``: the oldest renewal (on the apiserver's clock) and how
  many leases were renewed since the last look.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

from clusterproof.core import measurement
from clusterproof.core.measurement import measured
from clusterproof.core.run import metadata
from clusterproof.core.stats import percentile
from clusterproof.core.timeparse import http_date, parse_time
from clusterproof.kube import flowcontrol as apf
from clusterproof.kube.client import list_all, raw_request
from clusterproof.kube.pod_spec import pod_body

SAMPLE_S = 2.0
LEASE_SAMPLE_S = 5.0
PROBE_LABEL = "clusterproof.io/probe"


def token_client(api: client.ApiClient, token_file: Path) -> client.ApiClient:
    """A client for the same server as ``api`` that authenticates with a bearer token and never retries
    (the kubernetes client would silently retry a 429 on GET/DELETE, hiding it)."""
    src = api.configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = src.host, src.ssl_ca_cert, src.verify_ssl
    cfg.api_key = {"authorization": f"Bearer {token_file.read_text().strip()}"}
    cfg.retries = False
    return client.ApiClient(cfg)


@dataclass
class Sample:
    t: float                 # monotonic time the request started
    what: str                # "create configmap", "create pod", ...
    latency_s: float
    status: int              # HTTP status; 0: no response (timeout, connection error)
    fs_uid: str = ""
    pl_uid: str = ""
    error: str = ""

    @property
    def mutating(self) -> bool:
        return self.what.split()[0] in ("create", "delete", "update", "patch")


class WellBehaved(threading.Thread):
    """A paced client in its own flow; ``pod_budget`` pods are created while it is > 0 (the flood)."""

    def __init__(self, api: client.ApiClient, namespace: str, run_id: str, rate: float):
        super().__init__(daemon=True, name="well-behaved client")
        self.api, self.ns, self.run_id, self.period = api, namespace, run_id, 1.0 / rate
        self.samples: list[Sample] = []
        self.pods: list[str] = []
        self.pod_budget, self.pod_every = 0, 1
        self.inflight: float | None = None      # when the request now in flight started (None: idle)
        self.done = threading.Event()
        self._lock = threading.Lock()

    def _call(self, what: str, method: str, path: str, body: dict | None = None) -> None:
        t = self.inflight = time.monotonic()
        try:
            resp = raw_request(self.api, method, path, body=body, timeout=30, retry_s=0)  # each try a sample
            resp.data
            s = Sample(t, what, time.monotonic() - t, resp.status, resp.headers.get(apf.FS_UID_HEADER, ""),
                       resp.headers.get(apf.PL_UID_HEADER, ""))
        except client.ApiException as e:
            h = e.headers or {}
            s = Sample(t, what, time.monotonic() - t, e.status or 0, h.get(apf.FS_UID_HEADER, ""),
                       h.get(apf.PL_UID_HEADER, ""), str(e.reason))
        except Exception as e:   # a timeout or a broken connection: recorded, never raised
            s = Sample(t, what, time.monotonic() - t, 0, error=f"{type(e).__name__}: {str(e)[:120]}")
        with self._lock:
            self.samples.append(s)
        self.inflight = None

    def run(self) -> None:
        cms = f"/api/v1/namespaces/{self.ns}/configmaps"
        i, start = 0, time.monotonic()
        while not self.done.is_set():
            name = f"probe-{i // 3}"
            step = i % 3
            if step == 0:
                self._call("create configmap", "POST", cms,
                           {"metadata": metadata(name, self.run_id), "data": {"i": str(i)}})
            elif step == 1:
                self._call("get configmap", "GET", f"{cms}/{name}")
            else:
                self._call("delete configmap", "DELETE", f"{cms}/{name}")
            if self.pod_budget > 0 and i % self.pod_every == 0:
                pod = f"probe-pod-{len(self.pods):03d}"
                self.pod_budget -= 1
                self.pods.append(pod)
                self._call("create pod", "POST", f"/api/v1/namespaces/{self.ns}/pods",
                           pod_body(pod, self.run_id, labels={PROBE_LABEL: "true"}))
            i += 1
            # Paced on a fixed schedule: a slow answer does not shift the next request's slot.
            self.done.wait(max(0.0, start + i * self.period - time.monotonic()))

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)


def window(samples: list[Sample], t0: float, t1: float) -> list[Sample]:
    return [s for s in samples if t0 <= s.t < t1]


@dataclass
class Latency(measurement.Typed):
    """The well-behaved client's requests in a window: p50/p99 of all and of mutating ones (answered below 500),
    and how many were 429s, 5xx or got no answer."""
    requests: int = measured("requests")
    p50_s: float | None = measured("s")
    p99_s: float | None = measured("s")
    mutating_p99_s: float | None = measured("s")
    responses_429: int = measured("responses")
    responses_5xx: int = measured("responses")
    no_response: int = measured("requests")


def latency_figures(samples: list[Sample]) -> Latency:
    """The samples' ``Latency`` (pure)."""
    ok = [s.latency_s for s in samples if s.status and s.status < 500]
    mut = [s.latency_s for s in samples if s.mutating and s.status and s.status < 500]
    r = lambda v: None if v != v else round(v, 4)  # noqa: E731  (NaN -> None)
    return Latency(requests=len(samples), p50_s=r(percentile(ok, 50)), p99_s=r(percentile(ok, 99)),
                   mutating_p99_s=r(percentile(mut, 99)), responses_429=sum(s.status == 429 for s in samples),
                   responses_5xx=sum(s.status >= 500 for s in samples),
                   no_response=sum(s.status == 0 for s in samples))


@dataclass
class FlowSample:
    t: float
    dispatched: dict[tuple[str, str], float]
    rejected: dict[tuple[str, str], float]          # summed over reasons
    in_queue: dict[str, float]                      # by priority level
    executing: dict[str, float]


def parse_flow_sample(t: float, text: str) -> FlowSample:
    rej: dict[tuple[str, str], float] = {}
    for (fs, pl, _reason), v in apf.rejected(text).items():
        rej[(fs, pl)] = rej.get((fs, pl), 0.0) + v
    by_pl = lambda name: {k[0]: v for k, v in apf.counters(text, name, ("priority_level",)).items()}  # noqa: E731
    return FlowSample(t, apf.dispatched(text), rej, by_pl(apf.IN_QUEUE), by_pl(apf.EXECUTING))


class FlowSampler(threading.Thread):
    def __init__(self, api: client.ApiClient):
        super().__init__(daemon=True, name="APF metrics sampler")
        self.api, self.samples, self.errors = api, [], 0
        self.done = threading.Event()

    def sample(self) -> FlowSample | None:
        try:
            s = parse_flow_sample(time.monotonic(), apf.scrape(self.api))
        except Exception:
            self.errors += 1
            return None
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.sample()

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)


def rejections_per_second(samples: list[FlowSample], t0: float) -> dict[str, list[tuple[float, float]]]:
    """Per flow schema: (seconds since t0, 429s per second) between consecutive samples (pure)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for a, b in zip(samples, samples[1:]):
        span = b.t - a.t
        for (fs, _pl), v in b.rejected.items():
            d = v - a.rejected.get((fs, _pl), 0.0)
            out.setdefault(fs, [])
            out[fs].append((round(b.t - t0, 2), round(d / span, 2) if span > 0 else 0.0))
    return {fs: pts for fs, pts in out.items() if any(y > 0 for _, y in pts)}


@dataclass
class LeaseSample:
    t: float
    leases: int
    late_s: float            # the most overdue lease: its age minus its renew interval (duration / 4, +4 %)
    late: str                # ... its name
    age_s: float             # ... its age
    renewed: int             # leases whose renewTime changed since the previous sample


def renew_interval_s(duration_s: float) -> float:
    """A kubelet renews its lease every duration / 4, with up to 4 % jitter (kwok copies both)."""
    return duration_s / 4 * 1.04


class HeartbeatWatch(threading.Thread):
    """The node Leases' renewals, on the apiserver's clock (its Date header)."""

    def __init__(self, api: client.ApiClient):
        super().__init__(daemon=True, name="node heartbeat watch")
        self.api, self.samples, self.errors = api, [], 0
        self._last: dict[str, str] = {}
        self.done = threading.Event()

    def sample(self) -> LeaseSample | None:
        try:
            resp = raw_request(self.api, "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                               timeout=60, retry_s=0)   # a failed sample is counted; the next is due
            items = json.loads(resp.data)["items"]
            now = http_date(resp.headers["Date"])
            if now is None:
                raise ValueError("no Date header")
        except Exception:
            self.errors += 1
            return None
        late, name, age_of, renewed, seen = -float("inf"), "", 0.0, 0, {}
        for lease in items:
            spec = lease.get("spec") or {}
            n, rt = lease["metadata"]["name"], spec.get("renewTime")
            seen[n] = rt or ""
            renewed += self._last.get(n) not in (None, rt)
            t = parse_time(rt)
            # The Date header has 1 s resolution: an age under 1 s is 0.
            age = max(0.0, (now - t).total_seconds()) if t else float("inf")
            over = age - renew_interval_s(float(spec.get("leaseDurationSeconds") or 40))
            if over > late:
                late, name, age_of = over, n, age
        self._last = seen
        s = LeaseSample(time.monotonic(), len(items), round(max(late, 0.0), 1), name, round(age_of, 1), renewed)
        self.samples.append(s)
        return s

    def run(self) -> None:
        self.sample()
        while not self.done.wait(LEASE_SAMPLE_S):
            self.sample()

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=60)


def not_ready_since(api: client.ApiClient, since: dt.datetime) -> list[str]:
    """Nodes that are not Ready now, or whose Ready condition changed after ``since`` (they flapped)."""
    out = []
    for n in list_all(api, "/api/v1/nodes"):
        ready = next((c for c in (n.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is None or ready.get("status") != "True":
            out.append(f"{n['metadata']['name']} (Ready={ready.get('status') if ready else 'missing'})")
            continue
        changed = parse_time(ready.get("lastTransitionTime"))
        if changed and changed > since and parse_time(n["metadata"].get("creationTimestamp")) < since:
            out.append(f"{n['metadata']['name']} (Ready again since {ready['lastTransitionTime']})")
    return out


@dataclass
class Phases:
    """Monotonic marks of one measured flood."""
    baseline: float = 0.0
    flood: float = 0.0
    flood_end: float = 0.0
    recovered: float | None = None
    end: float = 0.0
    flood_wall: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
