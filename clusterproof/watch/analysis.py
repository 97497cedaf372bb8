"""What the watchers' events say: slices per event, changes per event, bytes per change, agreement, projection.

Pure (no cluster): the watch-bandwidth measurement (``clusterproof.watch.measure``)
hands over what each watcher received; the suite's checks and the benchmark
read the figures computed here.

Definitions (docs/suites/watch_bandwidth.md):

- an **endpoint change** is one endpoint added, removed, or whose conditions
  changed, as the events themselves record it (each event compared with the
  previous version of its object; a pod deletion is two changes on the
  slices: terminating, then gone);
- **bytes per change** (a watcher, an API, an encoding) = the bytes of its
  events (as framed on the stream, bookmarks excluded) / the endpoint
  changes those events carry; a healthy slice watcher pays at most one slice
  per change;
- a **full slice** is the size an event would have with
  ``max_endpoints_per_slice`` endpoints like its own (``watchwire.scaled_size``),
  in the watcher's encoding;
- **churn changes** are the changes the harness made (pod replaced: 2, a
  readiness flip: 1, a drained node: one per pod); the projection prices
  them: egress = watchers (one per node) x changes/s x bytes per churn change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from clusterproof.watch.wire import Event, scaled_size

SHOW = 3


@dataclass
class GroupFigures:
    """One group of watchers (an API, an encoding) over one measurement window."""
    api: str
    encoding: str
    watchers: int
    events: int = 0                    # non-bookmark events each watcher received (the reference watcher)
    bookmarks: int = 0                 # most bookmarks any watcher received
    bytes_per_watcher: int = 0         # non-bookmark bytes as framed on the stream (the most any watcher got)
    wire_bytes_per_watcher: int | None = None   # bytes on the TCP socket (the most any watcher got)
    metric_bytes: int = 0              # what apiserver_watch_events_sizes records for all of them (+ bookmarks)
    metric_events: int = 0
    metric_bytes_one_watcher: int = 0  # the reference watcher's non-bookmark events, as the metric counts them
    changes: int = 0                   # endpoint changes the events carry
    max_endpoints: int = 0
    max_endpoints_event: str = ""
    largest_event: int = 0
    full_slice_bytes: float | None = None
    per_endpoint_bytes: float | None = None   # mean bytes per endpoint in the fullest event
    overhead_bytes: int | None = None         # the fullest event without its endpoints
    warned: int = 0                           # watchers whose response carried a deprecation warning
    spread_p99_s: float | None = None         # p99 over events of (last watcher's receipt - first watcher's)
    unchanged: list[str] = field(default_factory=list)   # events that changed no endpoint
    foreign: list[str] = field(default_factory=list)     # events changing endpoints the churn never touched
    dropped: list[str] = field(default_factory=list)     # watchers whose stream ended early
    diverged: list[str] = field(default_factory=list)    # watchers whose events differ from the reference's
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.api}/{self.encoding}"

    @property
    def bytes_per_change(self) -> float | None:
        return self.bytes_per_watcher / self.changes if self.changes else None


def _identity(ep: tuple) -> str:
    return ep[2] or ep[0]            # the pod, else the address


def changed(before: tuple, after: tuple) -> set[str]:
    """Endpoints (by pod, else address) added, removed or with other conditions between two versions."""
    return {_identity(e) for e in set(before) ^ set(after)}


def describe(ev: Event) -> str:
    return f"{ev.type} {ev.kind} {ev.key} rv {ev.resource_version} ({len(ev.endpoints)} endpoints, {ev.size} bytes)"


def analyze(api: str, encoding: str, per_watcher: list[list[Event]], initial: dict[str, tuple],
            touched: set[str] | None, max_endpoints: int) -> GroupFigures:
    """Figures of one group from each watcher's events (in order, bookmarks included).

    ``initial``: each object's endpoints in the LIST the watches started from;
    ``touched``: pods the churn changed (None: read-only, anything may change).
    """
    g = GroupFigures(api, encoding, len(per_watcher))
    if not per_watcher:
        return g
    content = [[e for e in evs if e.type != "BOOKMARK"] for evs in per_watcher]
    ref = content[0]
    for i, evs in enumerate(content[1:], 1):
        if [id(e) for e in evs] != [id(e) for e in ref]:
            g.diverged.append(f"watcher {i}: {len(evs)} events, the first watcher {len(ref)}")
    g.events = len(ref)
    g.bookmarks = max(len(evs) - len(c) for evs, c in zip(per_watcher, content))
    g.bytes_per_watcher = max(sum(e.size for e in evs) for evs in content)
    state = dict(initial)
    fullest: Event | None = None
    for ev in ref:
        before = state.get(ev.key, ())
        after = () if ev.type == "DELETED" else ev.endpoints
        state[ev.key] = after
        diff = changed(before, after)
        g.changes += len(diff)
        if not diff:
            g.unchanged.append(describe(ev))
        elif touched is not None and diff - touched:
            g.foreign.append(f"{describe(ev)} changed {sorted(diff - touched)[:SHOW]}")
        if len(ev.endpoints) > g.max_endpoints:
            g.max_endpoints, g.max_endpoints_event = len(ev.endpoints), describe(ev)
        g.largest_event = max(g.largest_event, ev.size)
        if ev.endpoints and (fullest is None or scaled_size(ev, max_endpoints) > scaled_size(fullest, max_endpoints)):
            fullest = ev
    if fullest is not None:
        # The largest any event would be with max_endpoints endpoints: every event of a healthy slice
        # watcher is at most this, so one that carries at least one change costs at most one full slice.
        g.full_slice_bytes = scaled_size(fullest, max_endpoints)
        g.per_endpoint_bytes = fullest.endpoint_bytes / len(fullest.endpoints)
        g.overhead_bytes = fullest.size - fullest.endpoint_bytes
    return g


def size_with(g: GroupFigures, endpoints: int) -> float | None:
    """An event of this group with ``endpoints`` endpoints (from its fullest event)."""
    if g.per_endpoint_bytes is None:
        return None
    return g.overhead_bytes + endpoints * g.per_endpoint_bytes


def delivery_spread(per_watcher: list[list[tuple[float, Event]]]) -> list[float]:
    """Per event (bookmarks aside): how much later the last watcher received it than the first.

    One event loop serves every watcher: if it cannot keep up, the spread
    grows (the apiserver writes every stream at once).
    """
    seen: dict[int, list[float]] = {}
    for evs in per_watcher:
        for t, e in evs:
            if e.type != "BOOKMARK":
                seen.setdefault(id(e), []).append(t)
    return [max(ts) - min(ts) for ts in seen.values() if len(ts) == len(per_watcher)]


def within_budget(g: GroupFigures, budget_slices: float) -> bool:
    return g.bytes_per_change is not None and g.full_slice_bytes is not None and \
        g.bytes_per_change <= budget_slices * g.full_slice_bytes


@dataclass
class Agreement:
    """The harness's count of one API's watch bytes against the apiserver's own, over the same window."""
    resource: str                  # the metric's resource the count was compared with
    harness_bytes: int
    harness_events: int
    harness_watchers: int
    other_watchers: int            # the server's WATCH requests on the resource that are not the harness's
    other_bytes: float             # estimated: each receives what one harness protobuf watcher received
    server_bytes: float
    server_events: float

    @property
    def expected(self) -> float:
        return self.harness_bytes + self.other_bytes

    @property
    def relative_difference(self) -> float:
        return abs(self.server_bytes - self.expected) / self.server_bytes if self.server_bytes else math.inf


def agreement(resource: str, groups: list[GroupFigures], server: tuple[float, float, float]) -> Agreement:
    """``server``: (events, bytes, WATCH requests) of ``resource`` from the apiserver over the window.

    The apiserver counts every watcher of the resource; the others (on the
    embedded cluster kube-controller-manager's informers: protobuf, every
    change) are modelled as receiving what one harness protobuf watcher did.
    """
    events, nbytes, watch_requests = server
    ours = sum(g.watchers for g in groups)
    proto = [g for g in groups if g.encoding == "protobuf"]
    per_other = proto[0].metric_bytes_one_watcher if proto else 0
    others = max(0, int(round(watch_requests)) - ours)
    return Agreement(resource, sum(g.metric_bytes for g in groups), sum(g.metric_events for g in groups), ours,
                     others, others * per_other, nbytes, events)


# --- projection ----------------------------------------------------------------------------

def change_rate(nodes: int, per_node_hour: float) -> float:
    """Endpoint changes per second of a per-node Service on ``nodes`` nodes."""
    return nodes * per_node_hour / 3600.0


def egress(nodes: int, per_node_hour: float, bytes_per_change: float) -> float:
    """Cluster-wide watch egress (bytes/s): one watcher per node x changes/s x bytes per change."""
    return nodes * change_rate(nodes, per_node_hour) * bytes_per_change


def extrapolate(points: list[tuple[int, float]], nodes: int, cap: int | None) -> float:
    """Bytes per change at ``nodes`` from measured (size, bytes) points.

    ``cap``: the object stops growing at this many endpoints (slices: their
    maximum size, reached long before; Endpoints: 1,000 addresses, the
    truncation). Beyond the largest measured size the cost grows linearly
    in the endpoints (per-endpoint cost of the largest point) up to the cap,
    then stays: for a truncated Endpoints object an upper bound (a change to
    an endpoint it does not list sends nothing).
    """
    points = sorted(points)
    size, cost = points[-1]
    if nodes <= size:
        below = [p for p in points if p[0] >= nodes]
        return below[0][1]
    grown = min(nodes, cap) if cap else nodes
    return cost * max(1.0, grown / min(size, cap or size))
