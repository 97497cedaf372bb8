"""API latency from the kube-apiserver's own metrics.

Why the server's histogram: the Kubernetes API-call latency SLO is defined on
``apiserver_request_duration_seconds`` (per resource and verb, p99), so a
snapshot before and after a phase gives the SLO for exactly that phase --
independent of how fast our Python client is.

Several API servers: each replica has its own counters, and two scrapes of
``/metrics`` through a load balancer may reach different replicas, whose
difference means nothing. Every scrape therefore carries the replica's
identity (its ``process_start_time_seconds``); a window whose two ends come
from different replicas is retried on fresh connections and otherwise
refused, and the report says that the figure is one replica's whenever the
cluster has more than one (``apiserver_replicas``). A source that covers all
replicas is a Prometheus over the same window.

The single-object mutating SLO counts verbs POST/PUT/PATCH/DELETE/APPLY with
scope ``resource`` only: a collection delete is its own verb
(``DELETECOLLECTION``) and scope, and is not a single-object call.
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from clusterproof.core.stats import histogram_quantile
from clusterproof.kube.client import get_if_present, raw_request

DURATION = "apiserver_request_duration_seconds"
START_TIME = "process_start_time_seconds"
MUTATING_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
# apiserver's metrics.CleanScope: "resource" for a named object or a create.
SINGLE_OBJECT = ("resource",)
# Key of one latency series: the SLO is "for every (resource, verb) pair".
Key = tuple  # (verb, group, resource, subresource, scope)


def scrape(api: client.ApiClient, prefixes: tuple[str, ...] = (DURATION,), fresh: bool = False) -> str:
    """The apiserver's /metrics text, reduced to ``prefixes`` (plus the replica's start time).

    ``fresh``: on a new connection (``Connection: close``), so that behind a
    load balancer the next scrape may reach another replica.
    """
    headers = {"Accept": "text/plain", **({"Connection": "close"} if fresh else {})}
    return only(raw_request(api, "GET", "/metrics", headers=headers).data.decode(), prefixes)


def only(text: str, prefixes: tuple[str, ...]) -> str:
    """A scrape's text reduced to the families named by ``prefixes`` (plus the replica's start time): the
    parser's cost grows with every line, and a family read beside others need not be parsed with them."""
    keep = (*prefixes, START_TIME)
    lines = [ln for ln in text.splitlines()
             if ln.startswith(keep) or (ln.startswith("#") and any(p in ln for p in keep))]
    return "\n".join(lines) + "\n"


def replica(text: str) -> str:
    """Which kube-apiserver answered a scrape (its process start time; '' if unknown)."""
    for ln in text.splitlines():
        if ln.startswith(START_TIME + " "):
            return ln.split()[1]
    return ""


def scrape_same_replica(api: client.ApiClient, before: str, attempts: int = 10,
                        prefixes: tuple[str, ...] = (DURATION,)) -> str | None:
    """A scrape from the replica that answered ``before`` (None if ``attempts`` fresh scrapes miss it)."""
    for i in range(attempts):
        after = scrape(api, prefixes, fresh=i > 0)
        if replica(after) == replica(before):
            return after
    return None


def restart_note(api: client.ApiClient, before: str) -> str:
    """One line for a window whose end could not be scraped from the replica that answered ``before``:
    with one API server that is a restart (a new process start time); behind a load balancer, that
    replica stopped answering."""
    def clock(text: str) -> str:
        try:
            return dt.datetime.fromtimestamp(float(replica(text)), dt.timezone.utc).strftime("%H:%M:%S UTC")
        except ValueError:
            return "an unknown time"
    try:
        now = f"; the one answering now started at {clock(scrape(api, fresh=True))}"
    except Exception:
        now = "; none answers now"
    return (f"the API server restarted (the one that answered before, started at {clock(before)}, no longer "
            f"answers{now})")


def apiserver_replicas(api: client.ApiClient) -> int:
    """kube-apiserver endpoints behind the default/kubernetes Service (0 if they cannot be read)."""
    slices = get_if_present(api, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                            {"labelSelector": "kubernetes.io/service-name=kubernetes"}) or {}
    return sum(len(s.get("endpoints") or []) for s in slices.get("items", []))


def histograms(text: str, name: str = DURATION) -> dict[Key, dict[float, float]]:
    """Cumulative bucket counts per series: {key: {upper_bound: count}}."""
    out: dict[Key, dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if not s.name.endswith("_bucket"):
                continue
            lb = s.labels
            key = (lb.get("verb", ""), lb.get("group", ""), lb.get("resource", ""),
                   lb.get("subresource", ""), lb.get("scope", ""))
            le = float(lb["le"])
            # Several series (e.g. per component/dry_run) share a key: add them up.
            out.setdefault(key, {})
            out[key][le] = out[key].get(le, 0.0) + s.value
    return out


def delta(after: dict, before: dict) -> dict:
    out = {}
    for key, buckets in after.items():
        prev = before.get(key, {})
        d = {le: c - prev.get(le, 0.0) for le, c in buckets.items()}
        if d.get(math.inf, 0) > 0:
            out[key] = d
    return out


def counters(text: str, name: str, by: tuple[str, ...]) -> dict[tuple, float]:
    """A counter (or gauge) of a scrape summed by the labels ``by``: {(label values...): value}."""
    out: dict[tuple, float] = {}
    base = name.removesuffix("_total")
    for fam in text_string_to_metric_families(text):
        if fam.name not in (name, base):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            key = tuple(s.labels.get(k, "") for k in by)
            out[key] = out.get(key, 0.0) + s.value
    return out


def counter_delta(after: dict, before: dict) -> dict:
    """What grew between two ``counters`` readings (only keys that grew)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


@dataclass(frozen=True)
class Latency:
    verb: str
    resource: str
    scope: str
    count: int
    p99_s: float

    def __str__(self) -> str:
        return f"{self.verb} {self.resource} ({self.scope}): p99 {self.p99_s:.3f} s over {self.count} calls"


def latencies(hist: dict[Key, dict[float, float]], verbs: tuple[str, ...],
              scopes: tuple[str, ...] | None = None) -> list[Latency]:
    out = []
    for (verb, group, resource, sub, scope), buckets in sorted(hist.items()):
        if verb not in verbs or (scopes is not None and scope not in scopes):
            continue
        res = "/".join(x for x in (f"{resource}.{group}" if group else resource, sub) if x)
        out.append(Latency(verb, res, scope, int(buckets[math.inf]), histogram_quantile(0.99, buckets)))
    return out


FEATURE = "kubernetes_feature_enabled"


def features(api: client.ApiClient) -> dict[str, bool]:
    """The API server's feature gates as it reports them on /metrics (``kubernetes_feature_enabled{name}``, 1 on);
    {} from a server that reports none. The server's own: another component may run with other gates."""
    return {s.labels["name"]: s.value == 1 for fam in text_string_to_metric_families(scrape(api, (FEATURE,)))
            for s in fam.samples if s.name == FEATURE}
