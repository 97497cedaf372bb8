"""The watch-bandwidth figures as data (report attachment, bench JSON) and the projection plot.

Projection: cluster-wide watch egress = watchers (one per node: kube-proxy)
x endpoint changes/s of the per-node Service (``watch_projection_changes_per_node_hour``
per node) x bytes per change, at every measured size and at
``watch_projection_nodes``. Bytes per change beyond the largest measured
size: a slice stops growing at ``max-endpoints-per-slice`` endpoints, the
Endpoints object at 1,000 addresses (truncation); the "untruncated" series
is the Endpoints object as it was before 1.22 -- every address in every
change, the seed's N^2.
"""
from __future__ import annotations

from clusterproof.report.plots import Plot, Series
from clusterproof.watch import analysis as wa
from clusterproof.watch.measure import ENDPOINTS, SLICES, SizeRun, WatchRun
from clusterproof.watch.pernode_service import ENDPOINTS_MAX_CAPACITY
from clusterproof.watch.wire import ENCODINGS, PROTOBUF

LABELS = {SLICES: "EndpointSlice", ENDPOINTS: "Endpoints"}


def per_change(s: SizeRun, g: wa.GroupFigures) -> float | None:
    """Bytes per watcher per churn change (read-only: per change the events carried)."""
    if s.mode == "churn":
        return g.bytes_per_watcher / s.churn_changes if s.churn_changes else None
    return g.bytes_per_change


def cost_points(run: WatchRun, api: str, encoding: str) -> list[tuple[int, float]]:
    out = []
    for s in run.sizes:
        c = per_change(s, s.group(api, encoding))
        if c is not None:
            out.append((s.size or sum(s.slice_sizes), c))
    return out


def projection(run: WatchRun, profile) -> dict[str, list[tuple[int, float]]]:
    """Series label -> [(nodes, bytes/s)] at the measured sizes and at ``watch_projection_nodes``."""
    rate = profile.watch_projection_changes_per_node_hour
    out: dict[str, list[tuple[int, float]]] = {}
    caps = {SLICES: profile.watch_max_endpoints_per_slice, ENDPOINTS: ENDPOINTS_MAX_CAPACITY}
    for api in (SLICES, ENDPOINTS):
        for enc in ENCODINGS:
            pts = cost_points(run, api, enc)
            if not pts:
                continue
            xs = sorted({p[0] for p in pts} | {profile.watch_projection_nodes})
            label = f"{LABELS[api]}, {enc}" + (" (kube-proxy)" if api == SLICES and enc == PROTOBUF else "")
            if api == ENDPOINTS:
                label += ", truncated at 1,000 (today)"
            out[label] = [(n, wa.egress(n, rate, wa.extrapolate(pts, n, caps[api]))) for n in xs]
    pts = cost_points(run, ENDPOINTS, PROTOBUF)
    # Before truncation every change carried every address: extrapolate linearly from the sizes
    # the object still held whole (above 1,000 a change to an unlisted endpoint sends nothing).
    carried = [p for p in pts if p[0] <= ENDPOINTS_MAX_CAPACITY]
    if carried:
        xs = sorted({p[0] for p in pts} | {profile.watch_projection_nodes})
        out["Endpoints, protobuf, untruncated (before 1.22: N^2)"] = [
            (n, wa.egress(n, rate, wa.extrapolate(carried, n, None))) for n in xs]
    return out


def projection_plot(run: WatchRun, profile) -> Plot:
    return Plot(
        title=(f"Watch egress of a per-node Service, projected to {profile.watch_projection_nodes:,} nodes "
               f"({profile.watch_projection_changes_per_node_hour:g} change per node per hour)"),
        xlabel=(f"nodes (= watchers = endpoints of the Service; {profile.watch_projection_nodes:,}: projected from "
                "the largest measured size)"), ylabel="apiserver watch egress (bytes/s)",
        series=[Series(label, pts, style="line") for label, pts in projection(run, profile).items()],
        xlog=True, ylog=True)


def group_dict(g: wa.GroupFigures, s: SizeRun) -> dict:
    return {
        "watchers": g.watchers, "events_per_watcher": g.events, "bookmarks_max": g.bookmarks,
        "endpoint_changes_in_events": g.changes,
        "bytes_per_watcher": g.bytes_per_watcher, "wire_bytes_per_watcher": g.wire_bytes_per_watcher,
        "bytes_per_change": round(g.bytes_per_change, 1) if g.bytes_per_change else None,
        "bytes_per_churn_change": round(per_change(s, g), 1) if per_change(s, g) else None,
        "full_slice_bytes": round(g.full_slice_bytes, 1) if g.full_slice_bytes else None,
        "largest_event_bytes": g.largest_event, "max_endpoints_per_event": g.max_endpoints,
        "unchanged_events": len(g.unchanged), "foreign_events": len(g.foreign),
        "delivery_spread_p99_s": g.spread_p99_s,
        "dropped_watchers": len(g.dropped), "diverged_watchers": len(g.diverged), "warnings": g.warnings,
    }


def summary(run: WatchRun, profile) -> dict:
    sizes = []
    for s in run.sizes:
        ratio = {}
        for enc in ENCODINGS:
            sl, ep = s.group(SLICES, enc), s.group(ENDPOINTS, enc)
            ratio[enc] = round(ep.bytes_per_watcher / sl.bytes_per_watcher, 2) if sl.bytes_per_watcher else None
        sizes.append({
            "endpoints": s.size or sum(s.slice_sizes), "mode": s.mode,
            "churn_steps": s.churn_steps, "churn_changes": s.churn_changes,
            "churn_seconds": round(s.churn_seconds, 1), "window_seconds": round(s.window_s, 1),
            "settle_seconds": round(s.settle_s, 1), "slice_sizes": s.slice_sizes[:12],
            "endpoints_object": {"addresses": s.endpoints_addresses, "annotations": {
                k: v for k, v in s.endpoints_annotations.items() if k.startswith("endpoints.kubernetes.io/over")}},
            "endpoints_to_endpointslice_bytes": ratio,
            "groups": {name: group_dict(g, s) for name, g in s.groups.items()},
            "apiserver_agreement": {api: {
                "compared_with_metric_of": a.resource, "harness_bytes": a.harness_bytes,
                "harness_events": a.harness_events, "harness_watchers": a.harness_watchers,
                "other_watchers": a.other_watchers, "other_bytes_estimate": round(a.other_bytes),
                "apiserver_bytes": a.server_bytes, "apiserver_events": a.server_events,
                "relative_difference": round(a.relative_difference, 4)} for api, a in s.agreements.items()},
        })
    return {
        "service": f"{run.target.namespace}/{run.target.name}", "created_by_the_run": run.target.created,
        "cluster_nodes": run.nodes, "pool_nodes": run.pool_nodes,
        "watchers_per_api_and_encoding": profile.watch_watchers,
        "churn_rate_target_per_s": profile.watch_churn_rate,
        "pods_created": run.pods_created,
        "pods_created_per_s": round(run.pods_created / run.create_s, 1) if run.create_s else None,
        "grow_seconds": round(run.grow_s, 1),
        "pods_deleted": run.deleted,
        "pods_deleted_per_s": round(run.deleted / run.delete_s, 1) if run.delete_s else None,
        "sizes": sizes,
        "projection_bytes_per_s": {k: [[n, round(v)] for n, v in pts] for k, pts in projection(run, profile).items()},
    }


def bytes_text(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"

