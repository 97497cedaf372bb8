"""One endpoint change costs each watcher about one EndpointSlice, not the whole Service.

Every node's kube-proxy watches the endpoints of every Service; a Service
with one endpoint per node (node-exporter, a DaemonSet) changes whenever a
node's pod does. With the old ``Endpoints`` API each change resent the whole
object to every watcher -- N watchers x N addresses, the seed cluster's ~1 GB/s
out of its API servers. Measured here on the wire, today:

- a per-node Service (``watch_sizes`` endpoints, one small pod per node; on
  ``nightly`` 7,500) is watched by ``watch_watchers`` kube-proxy-like
  watchers (EndpointSlices, cluster-wide, kube-proxy's label selector, from
  the LIST's resourceVersion) and as many on its ``Endpoints``, in JSON and
  in protobuf, all in one asyncio loop; bytes are counted per event as
  framed on the stream and on the TCP socket;
- ``watch_churn`` endpoint changes at ``watch_churn_rate``/s (a pod
  replaced, a readiness flip, a node drained) at each size.

What must hold: each slice event carries one slice of at most
``watch_max_endpoints_per_slice`` endpoints and only slices that changed are
sent; bytes per endpoint change per watcher <= ``watch_budget_slices`` full
slices; every watcher receives every change; the harness's byte count
agrees with the apiserver's ``apiserver_watch_events_sizes`` within
``watch_agreement_tolerance``; the ``Endpoints`` object is truncated at
1,000 addresses with ``endpoints.kubernetes.io/over-capacity: truncated``
and answered with a deprecation warning, so its cost per change stops
growing there (the Endpoints/EndpointSlice ratio and the projection to
``watch_projection_nodes`` nodes are on that check's page).

Negative controls (tests/test_watch_bandwidth_controls.py):
kube-controller-manager with ``--max-endpoints-per-slice=1000`` (the slice
and budget checks fail, naming the slice size and bytes per change); the
kube-proxy-like watchers fed the ``Endpoints`` object
(``watch_slice_resource=endpoints``: the budget check fails); the byte count
compared with the other API's apiserver metric
(``watch_metric_resource=other``: the agreement check fails).
"""
from __future__ import annotations

import json

import allure
import pytest

from clusterproof.fixtures import PROFILE
from clusterproof.watch.analysis import size_with, within_budget
from clusterproof.watch.figures import bytes_text, per_change, projection, projection_plot, summary
from clusterproof.watch.measure import ENDPOINTS, SLICES
from clusterproof.watch.pernode_service import ENDPOINTS_MAX_CAPACITY, OVER_CAPACITY
from clusterproof.watch.wire import ENCODINGS, PROTOBUF

SHOW = 3
DEPRECATION = "v1 Endpoints is deprecated"


def pytest_generate_tests(metafunc):
    """Read-only on a named existing Service; otherwise the run's own per-node Service (destructive)."""
    if "watch_target" in metafunc.fixturenames:
        p = metafunc.config.stash[PROFILE]
        param = (pytest.param("existing-service", id="existing-service") if p.watch_service else
                 pytest.param("per-node-service", id="per-node-service", marks=pytest.mark.destructive))
        metafunc.parametrize("watch_target", [param], scope="module")


def _endpoints(s) -> int:
    return s.size or sum(s.slice_sizes)


def _fail(problems: list[str]) -> None:
    assert not problems, "; ".join(problems)


def _skip_if_quiet(run) -> None:
    """Read-only mode: an existing Service nobody changed during the window gives nothing to measure."""
    if not run.target.created and not any(s.group(SLICES, enc).events for s in run.sizes for enc in ENCODINGS):
        pytest.skip(f"no endpoint of {run.target.namespace}/{run.target.name} changed during the "
                    f"{run.sizes[0].window_s:.0f} s window: nothing to measure (raise watch_window_s)")


def test_each_slice_event_carries_one_slice_within_the_endpoint_limit(watch_bandwidth, profile, figures):
    """No EndpointSlice event a watcher receives carries more endpoints than ``watch_max_endpoints_per_slice``, at
    every Service size and in both encodings. Red: larger slices, so each change resends more endpoints to every
    watcher."""
    _skip_if_quiet(watch_bandwidth)
    limit, problems = profile.watch_max_endpoints_per_slice, []
    for s in watch_bandwidth.sizes:
        # kube-controller-manager's --max-endpoints-per-slice, as its slices show it (also read-only).
        figures.add(f"largest slice of the Service, {_endpoints(s)} endpoints", max(s.slice_sizes, default=0),
                 "endpoints", limit)
        for enc in ENCODINGS:
            g = s.group(SLICES, enc)
            figures.add(f"most endpoints in one slice event, {enc}, {_endpoints(s)} endpoints", g.max_endpoints,
                     "endpoints", limit)
            if not g.events:
                problems.append(f"no slice event reached the {enc} watchers at {_endpoints(s)} endpoints")
            elif g.max_endpoints > limit:
                problems.append(
                    f"at {_endpoints(s)} endpoints a {enc} slice event carried {g.max_endpoints} endpoints, more "
                    f"than the {limit} of max-endpoints-per-slice ({g.max_endpoints_event}); the Service's slices "
                    f"hold {s.slice_sizes[:5]} endpoints: kube-controller-manager runs with a larger "
                    "--max-endpoints-per-slice, or the watchers get something other than slices")
    _fail(problems)


def test_only_the_slices_that_changed_are_sent(watch_bandwidth, figures):
    """An endpoint change sends only the slices it touched: no slice event without a changed endpoint, none changing
    endpoints the churn never touched. Red: unchanged slices are resent to every watcher."""
    problems = []
    for s in watch_bandwidth.sizes:
        for enc in ENCODINGS:
            g = s.group(SLICES, enc)
            figures.add(f"slice events that changed no endpoint, {enc}, {_endpoints(s)} endpoints", len(g.unchanged),
                     "events", 0)
            if g.unchanged:
                problems.append(f"at {_endpoints(s)} endpoints {len(g.unchanged)} of {g.events} {enc} slice events "
                                f"changed no endpoint (resent unchanged slices), e.g. {g.unchanged[:SHOW]}")
            if g.foreign:
                problems.append(f"at {_endpoints(s)} endpoints {len(g.foreign)} {enc} slice events changed endpoints "
                                f"the churn never touched, e.g. {g.foreign[:SHOW]}")
    _fail(problems)


def test_every_watcher_receives_every_change(watch_bandwidth, profile, figures):
    """Every watcher caught up with the final LIST (waited for), none was closed early, all got the same events.
    Red: watchers lost their stream or diverged (counted and named)."""
    problems = []
    for s in watch_bandwidth.sizes:
        for g in s.groups.values():
            figures.add(f"{g.name} watchers closed early, {_endpoints(s)} endpoints", len(g.dropped), "watchers", 0)
            if g.dropped:
                problems.append(f"{len(g.dropped)} of {g.watchers} {g.name} watchers lost their stream at "
                                f"{_endpoints(s)} endpoints, e.g. {g.dropped[:SHOW]}")
            if g.diverged:
                problems.append(f"{len(g.diverged)} {g.name} watchers received other events than the first "
                                f"at {_endpoints(s)} endpoints, e.g. {g.diverged[:SHOW]}")
    _fail(problems)


def test_slice_bytes_per_change_stay_within_the_budget(watch_bandwidth, profile, figures):
    """Each watcher receives at most ``watch_budget_slices`` full slices' worth of bytes per endpoint change, at every
    Service size and in both encodings. Red: one endpoint change costs each watcher more than the budget."""
    _skip_if_quiet(watch_bandwidth)
    factor, problems = profile.watch_budget_slices, []
    for s in watch_bandwidth.sizes:
        for enc in ENCODINGS:
            g = s.group(SLICES, enc)
            budget = factor * g.full_slice_bytes if g.full_slice_bytes else None
            figures.add(f"bytes per endpoint change per watcher, {enc}, {_endpoints(s)} endpoints",
                     g.bytes_per_change, "B", round(budget) if budget else None)
            if not within_budget(g, factor):
                problems.append(
                    f"at {_endpoints(s)} endpoints each {enc} slice watcher received {bytes_text(g.bytes_per_change)} "
                    f"per endpoint change ({g.bytes_per_watcher} B for {g.changes} changes in {g.events} events); "
                    f"budget {factor:g} x one full slice of {profile.watch_max_endpoints_per_slice} endpoints = "
                    f"{bytes_text(budget)}; the largest event carried {g.max_endpoints} endpoints "
                    f"({bytes_text(g.largest_event)}), the Service's slices hold {s.slice_sizes[:5]}")
    _fail(problems)


def test_harness_byte_count_agrees_with_the_apiserver_metrics(watch_bandwidth, profile, cluster, figures):
    """The bytes the harness counted on its watchers agree with the apiserver's own ``apiserver_watch_events_sizes``
    within ``watch_agreement_tolerance``. Red: the two instruments disagree, so the bandwidth figures cannot be
    trusted."""
    if not watch_bandwidth.target.created:
        pytest.skip("read-only mode: other watchers and other objects' changes are in the apiserver's counters too")
    if not cluster.simulated:
        pytest.skip("real hardware: every other client's watch of these resources is in the apiserver's counters")
    tol, problems = profile.watch_agreement_tolerance, []
    for s in watch_bandwidth.sizes:
        for api, a in s.agreements.items():
            figures.add(f"{api} watch bytes, harness vs apiserver, {_endpoints(s)} endpoints", a.relative_difference,
                     "relative difference", tol)
            if s.replica_changed:
                problems.append(f"at {_endpoints(s)} endpoints the two scrapes came from different apiservers")
            elif a.relative_difference > tol:
                problems.append(
                    f"at {_endpoints(s)} endpoints the harness counted {a.harness_bytes} B in {a.harness_events} "
                    f"events on {a.harness_watchers} {api} watchers, + {round(a.other_bytes)} B estimated for "
                    f"{a.other_watchers} other watchers = {round(a.expected)} B, but the apiserver's "
                    f"apiserver_watch_events_sizes for {a.resource} says {a.server_bytes:.0f} B in "
                    f"{a.server_events:.0f} events: {a.relative_difference:.1%} apart (tolerance {tol:.0%})")
    _fail(problems)


def test_endpoints_are_truncated_at_1000_addresses_with_the_over_capacity_annotation(watch_bandwidth, figures):
    """The v1 Endpoints object lists at most 1,000 addresses, and carries the over-capacity annotation 'truncated'
    exactly when the Service has more. Red: the truncation or its annotation is wrong."""
    problems = []
    for s in watch_bandwidth.sizes:
        n, note = _endpoints(s), s.endpoints_annotations.get(OVER_CAPACITY)
        want = min(n, ENDPOINTS_MAX_CAPACITY)
        figures.add(f"addresses in the Endpoints object, {n} endpoints", s.endpoints_addresses, "addresses", want, "==")
        if s.endpoints_addresses != want:
            problems.append(f"at {n} endpoints the Endpoints object lists {s.endpoints_addresses} addresses, "
                            f"expected {want} (truncation at {ENDPOINTS_MAX_CAPACITY})")
        if n > ENDPOINTS_MAX_CAPACITY and note != "truncated":
            problems.append(f"at {n} endpoints the Endpoints object carries {OVER_CAPACITY}={note!r}, expected "
                            "'truncated'")
        if n <= ENDPOINTS_MAX_CAPACITY and note is not None:
            problems.append(f"at {n} endpoints the Endpoints object carries {OVER_CAPACITY}={note!r} "
                            "(not over capacity)")
    _fail(problems)


def test_endpoints_api_answers_with_a_deprecation_warning(watch_bandwidth, figures):
    """Every v1 Endpoints watch is answered with the deprecation Warning header, and no EndpointSlice watch is. Red:
    clients of the old API are not told to move."""
    problems = []
    for s in watch_bandwidth.sizes:
        for enc in ENCODINGS:
            g, sl = s.group(ENDPOINTS, enc), s.group(SLICES, enc)
            figures.add(f"Endpoints watchers warned, {enc}, {_endpoints(s)} endpoints", g.warned, "watchers",
                     g.watchers, "==")
            if g.warned != g.watchers:
                problems.append(f"{g.watchers - g.warned} of {g.watchers} {enc} Endpoints watches were answered "
                                f"without a '{DEPRECATION}' Warning header (headers seen: {g.warnings[:2]})")
            if sl.warnings:
                problems.append(f"the {enc} EndpointSlice watches carried Warning headers: {sl.warnings[:2]}")
    _fail(problems)


def test_endpoints_cost_per_change_stops_growing_at_the_truncation(watch_bandwidth, profile, figures):
    """What holds today instead of the 2021 N^2: no Endpoints event carries more than 1,000 addresses,
    so its size is capped; the Endpoints/EndpointSlice ratio and the projection are reported here. Red: an
    Endpoints event grew past the truncation (the cost is N^2 across N watchers again)."""
    run, problems = watch_bandwidth, []
    allure.attach(json.dumps(summary(run, profile), indent=2), "watch bandwidth: every figure",
                  allure.attachment_type.JSON)
    projection_plot(run, profile).attach()
    for s in run.sizes:
        for enc in ENCODINGS:
            g, sl = s.group(ENDPOINTS, enc), s.group(SLICES, enc)
            ratio = g.bytes_per_watcher / sl.bytes_per_watcher if sl.bytes_per_watcher else None
            figures.add(f"Endpoints / EndpointSlice bytes for the same churn, {enc}, {_endpoints(s)} endpoints",
                     ratio, "x")
            cap = size_with(g, ENDPOINTS_MAX_CAPACITY)
            if g.max_endpoints > ENDPOINTS_MAX_CAPACITY:
                problems.append(f"at {_endpoints(s)} endpoints a {enc} Endpoints event carried {g.max_endpoints} "
                                f"addresses ({bytes_text(g.largest_event)}): more than the {ENDPOINTS_MAX_CAPACITY} "
                                "of the truncation, so its cost grows with the Service (N^2 across N watchers)")
            elif cap is not None and g.largest_event > cap * 1.02:
                problems.append(f"at {_endpoints(s)} endpoints a {enc} Endpoints event took "
                                f"{bytes_text(g.largest_event)}, more than {ENDPOINTS_MAX_CAPACITY} addresses take "
                                f"({bytes_text(cap)})")
    target = profile.watch_projection_nodes
    for label, pts in projection(run, profile).items():
        at = dict(pts).get(target)
        figures.add(f"projected egress at {target:,} nodes: {label}", at, "B/s")
    last = run.sizes[-1]
    figures.add("bytes per churn change, EndpointSlice protobuf, largest size",
             per_change(last, last.group(SLICES, PROTOBUF)), "B", headline=True)
    _fail(problems)
