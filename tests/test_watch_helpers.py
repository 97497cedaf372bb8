"""Unit tests of the watch-bandwidth suite's pure helpers: framing, decoding, analysis, churn plan, projection."""
from __future__ import annotations

import json
import struct

import pytest

from clusterproof.cluster.node_plan import node_pod_cidrs
from clusterproof.config.profile import load_profile
from clusterproof.watch import analysis as wa
from clusterproof.watch import wire
from clusterproof.watch.measure import watch_metrics
from clusterproof.watch.pernode_service import churn_plan

# --- a protobuf writer for test frames (the wire format the apiserver uses) -------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _f(num: int, value) -> bytes:
    if isinstance(value, int) and not isinstance(value, bool):
        return _varint(num << 3) + _varint(value)
    if isinstance(value, bool):
        return _varint(num << 3) + _varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _slice_pb(name: str, rv: str, eps: list[tuple[str, bool, str]], annotations=()) -> bytes:
    meta = _f(1, name) + _f(3, "ns") + _f(6, rv) + b"".join(_f(12, _f(1, k) + _f(2, v)) for k, v in annotations)
    body = _f(1, meta) + b"".join(
        _f(2, _f(1, ip) + _f(2, _f(1, ready)) + _f(4, _f(1, "Pod") + _f(3, pod))) for ip, ready, pod in eps) + \
        _f(4, "IPv4")
    unknown = _f(1, _f(1, "discovery.k8s.io/v1") + _f(2, "EndpointSlice")) + _f(2, body)
    event = _f(1, "MODIFIED") + _f(2, _f(1, wire.PROTOBUF_MAGIC + unknown))
    return struct.pack(">I", len(event)) + event


def _endpoints_pb(name: str, ready: list[tuple[str, str]], not_ready: list[tuple[str, str]]) -> bytes:
    addr = lambda ip, pod: _f(1, ip) + _f(2, _f(1, "Pod") + _f(3, pod))  # noqa: E731
    subset = b"".join(_f(1, addr(*a)) for a in ready) + b"".join(_f(2, addr(*a)) for a in not_ready)
    body = _f(1, _f(1, name) + _f(3, "ns") + _f(6, "7")) + _f(2, subset)
    unknown = _f(1, _f(1, "v1") + _f(2, "Endpoints")) + _f(2, body)
    event = _f(1, "MODIFIED") + _f(2, _f(1, wire.PROTOBUF_MAGIC + unknown))
    return struct.pack(">I", len(event)) + event


def _slice_json(name: str, rv: str, eps: list[tuple[str, bool, str]], etype="MODIFIED") -> bytes:
    obj = {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
           "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "addressType": "IPv4",
           "endpoints": [{"addresses": [ip], "conditions": {"ready": r}, "targetRef": {"kind": "Pod", "name": p}}
                         for ip, r, p in eps]}
    return json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"


EPS = [("10.128.0.1", True, "ep-0"), ("10.128.1.1", False, "ep-1")]


# --- framing ---------------------------------------------------------------------------------------

@pytest.mark.unit
def test_json_frames_are_lines_and_a_partial_line_waits():
    a, b = _slice_json("s", "1", EPS), _slice_json("s", "2", EPS)
    buf = bytearray(a + b[:10])
    assert wire.take_frames(buf, wire.JSON) == [a]
    buf += b[10:]
    assert wire.take_frames(buf, wire.JSON) == [b] and not buf


@pytest.mark.unit
def test_protobuf_frames_are_length_prefixed_and_a_partial_frame_waits():
    a, b = _slice_pb("s", "1", EPS), _slice_pb("s", "2", EPS)
    buf = bytearray(a + b[:3])
    assert wire.take_frames(buf, wire.PROTOBUF) == [a]
    buf += b[3:-1]
    assert wire.take_frames(buf, wire.PROTOBUF) == []
    buf += b[-1:]
    assert wire.take_frames(buf, wire.PROTOBUF) == [b] and not buf
    assert wire.metric_size(len(a), wire.PROTOBUF) == len(a) - 4
    assert wire.metric_size(100, wire.JSON) == 100


# --- decoding --------------------------------------------------------------------------------------

@pytest.mark.unit
def test_protobuf_and_json_slice_events_decode_to_the_same_summary():
    pb = wire.decode(_slice_pb("s", "9", EPS, [("a", "b")]), wire.PROTOBUF)
    js = wire.decode(_slice_json("s", "9", EPS), wire.JSON)
    for ev in (pb, js):
        assert (ev.type, ev.kind, ev.key, ev.resource_version) == ("MODIFIED", "EndpointSlice", "ns/s", "9")
        assert ev.endpoints == tuple(sorted(EPS))
    assert pb.annotation("a") == "b"
    assert 0 < pb.endpoint_bytes < pb.size and 0 < js.endpoint_bytes < js.size


@pytest.mark.unit
def test_json_endpoint_bytes_are_the_bytes_the_endpoints_take():
    frame = _slice_json("s", "9", EPS)
    without = _slice_json("s", "9", [])
    # Two endpoints and their separating commas (the last element's "comma" is the array's own space).
    assert wire.decode(frame, wire.JSON).endpoint_bytes == len(frame) - len(without) + 1


@pytest.mark.unit
def test_protobuf_endpoints_object_lists_ready_and_not_ready_addresses():
    ev = wire.decode(_endpoints_pb("svc", [("10.0.0.1", "a")], [("10.0.0.2", "b")]), wire.PROTOBUF)
    assert ev.kind == "Endpoints" and ev.endpoints == (("10.0.0.1", True, "a"), ("10.0.0.2", False, "b"))


@pytest.mark.unit
def test_scaled_size_keeps_the_overhead_and_scales_the_endpoints():
    ev = wire.decode(_slice_pb("s", "9", EPS), wire.PROTOBUF)
    assert wire.scaled_size(ev, 2) == ev.size
    assert wire.scaled_size(ev, 100) == pytest.approx(ev.size - ev.endpoint_bytes + 50 * ev.endpoint_bytes)


# --- analysis --------------------------------------------------------------------------------------

def _events(*frames) -> list:
    return [wire.decode(f, wire.JSON) for f in frames]


@pytest.mark.unit
def test_analysis_counts_changes_and_flags_unchanged_and_foreign_events():
    initial = {"ns/s": tuple(sorted(EPS))}
    e1 = _slice_json("s", "2", [EPS[0], ("10.128.1.1", True, "ep-1")])      # ep-1 ready: one change
    e2 = _slice_json("s", "3", [EPS[0], ("10.128.1.1", True, "ep-1")])      # nothing changed
    e3 = _slice_json("s", "4", [("10.128.1.1", True, "ep-1")])              # ep-0 removed, never churned
    evs = _events(e1, e2, e3)
    g = wa.analyze("endpointslices", "json", [evs, list(evs)], initial, touched={"ep-1"}, max_endpoints=100)
    assert g.changes == 2 and g.events == 3 and not g.diverged
    assert len(g.unchanged) == 1 and "rv 3" in g.unchanged[0]
    assert len(g.foreign) == 1 and "ep-0" in g.foreign[0]
    assert g.bytes_per_change == pytest.approx(sum(len(f) for f in (e1, e2, e3)) / 2)
    assert g.max_endpoints == 2 and g.full_slice_bytes > g.largest_event


@pytest.mark.unit
def test_a_watcher_that_missed_an_event_has_diverged():
    evs = _events(_slice_json("s", "2", EPS), _slice_json("s", "3", EPS[:1]))
    g = wa.analyze("endpointslices", "json", [evs, evs[:1]], {}, None, 100)
    assert g.diverged == ["watcher 1: 1 events, the first watcher 2"]


@pytest.mark.unit
def test_budget_is_one_full_slice_per_change():
    evs = _events(_slice_json("s", "2", EPS[:1]))
    g = wa.analyze("endpointslices", "json", [evs], {}, None, 100)
    assert wa.within_budget(g, 1.0)
    g.changes = 0
    assert not wa.within_budget(g, 1.0)


@pytest.mark.unit
def test_agreement_adds_other_watchers_as_protobuf_watchers():
    pb = wa.GroupFigures("endpointslices", "protobuf", 2, metric_bytes=200, metric_events=2,
                         metric_bytes_one_watcher=100)
    js = wa.GroupFigures("endpointslices", "json", 2, metric_bytes=300, metric_events=2)
    a = wa.agreement("endpointslices", [js, pb], (6, 800, 7))   # 7 WATCH requests: 4 ours, 3 others
    assert (a.other_watchers, a.other_bytes, a.expected, a.relative_difference) == (3, 300, 800, 0)


@pytest.mark.unit
def test_watch_metrics_reads_sizes_and_watch_requests_per_api():
    text = "\n".join([
        'apiserver_watch_events_sizes_sum{group="discovery.k8s.io",resource="endpointslices",version="v1"} 1.5e+06',
        'apiserver_watch_events_sizes_count{group="discovery.k8s.io",resource="endpointslices",version="v1"} 12',
        'apiserver_watch_events_sizes_sum{group="",resource="endpoints",version="v1"} 10',
        'apiserver_watch_events_sizes_count{group="",resource="endpoints",version="v1"} 1',
        'apiserver_longrunning_requests{component="apiserver",group="",resource="endpoints",scope="cluster",'
        'subresource="",verb="WATCH",version="v1"} 2',
        'apiserver_longrunning_requests{component="apiserver",group="",resource="endpoints",scope="resource",'
        'subresource="",verb="WATCH",version="v1"} 3',
        'apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",'
        'subresource="",verb="WATCH",version="v1"} 9', ""])
    m = watch_metrics(text)
    assert m["endpointslices"] == (12, 1.5e6, 0) and m["endpoints"] == (1, 10, 5)


# --- churn plan and projection -----------------------------------------------------------------------

@pytest.mark.unit
def test_churn_plan_takes_kinds_in_turn_and_leaves_the_service_whole():
    plan = churn_plan(5, ["replace", "ready", "drain"], size=30, nodes=10)
    assert [s.kind for s in plan] == ["replace", "unready", "drain", "replace", "ready", "undrain"]
    unready = next(s.slot for s in plan if s.kind == "unready")
    drained = next(s.node for s in plan if s.kind == "drain")
    for s in plan:
        if s.kind == "replace":
            assert s.slot != unready and s.slot % 10 != drained


@pytest.mark.unit
def test_churn_plan_is_deterministic_and_spreads_targets():
    a = churn_plan(12, ["replace"], size=1100, nodes=100)
    assert a == churn_plan(12, ["replace"], size=1100, nodes=100)
    assert len({s.slot for s in a}) == 12 and max(s.slot for s in a) > 500


@pytest.mark.unit
def test_egress_is_watchers_times_rate_times_bytes():
    assert wa.change_rate(3600, 1.0) == 1.0
    assert wa.egress(3600, 1.0, 1000) == 3600 * 1000


@pytest.mark.unit
def test_extrapolation_stops_at_the_cap():
    pts = [(100, 10.0), (1000, 100.0)]
    assert wa.extrapolate(pts, 100, None) == 10.0
    assert wa.extrapolate(pts, 7500, 1000) == 100.0             # truncated: no growth past 1,000
    assert wa.extrapolate(pts, 7500, None) == pytest.approx(750.0)   # untruncated: linear in addresses
    assert wa.extrapolate([(1100, 8.0)], 7500, 100) == 8.0      # slices: already full


# --- profile -----------------------------------------------------------------------------------------

@pytest.mark.unit
def test_node_pod_cidrs_give_each_node_its_own_slash_24():
    assert node_pod_cidrs("10.128.0.0/9", 3) == ["10.128.0.0/24", "10.128.1.0/24", "10.128.2.0/24"]
    assert node_pod_cidrs("10.128.0.0/9", 7500)[-1] == "10.157.75.0/24"
    with pytest.raises(ValueError, match="holding one /24 per node"):
        node_pod_cidrs("10.0.0.0/20", 100)


@pytest.mark.unit
def test_watch_sizes_from_the_command_line_are_numbers():
    assert load_profile("smoke", ["watch_sizes=100,200"]).watch_sizes == [100, 200]


@pytest.mark.unit
def test_socket_bytes_are_what_the_kernel_received():
    import socket

    from clusterproof.core.waiting import wait_for
    from clusterproof.watch.watchers import tcp_bytes_received
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()) as c:
            a, _ = srv.accept()
            with a:
                before = tcp_bytes_received(c)
                a.sendall(b"x" * 12345)
                wait_for(lambda: tcp_bytes_received(c) - before, until=lambda n: n >= 12345, timeout=5, interval=0.01,
                         what="12,345 bytes received on the loopback socket")
                assert tcp_bytes_received(c) - before == 12345


@pytest.mark.unit
def test_resource_versions_compare_as_etcd_revisions():
    from clusterproof.watch.watchers import older
    assert older("99", "100") and not older("100", "100") and not older("101", "100")
    assert older("abc", "abd") and not older("abc", "abc")   # not integers: only "same or not"


@pytest.mark.cluster
def test_pods_the_node_lifecycle_controller_marked_not_ready_are_named_as_such():
    """A settle wait that runs out on endpoints shown not ready says which pods the node lifecycle controller
    marked (NodeNotReady) and, on the harness's own cluster, that kwok never makes them Ready again."""
    import time

    from clusterproof.watch.pernode_service import PerNodeService
    own = PerNodeService(None, "ns", "run", ["n0"], by_name=True)
    own._marked, own._marked_at = {"ep-00001", "elsewhere"}, time.monotonic()   # as listed just now
    said = own.why_not_ready(["ep-00001", "ep-00002"])
    assert "1 of the 2 not-ready pods" in said and "ep-00001" in said and "simulation fault" in said
    guest = PerNodeService(None, "ns", "run", ["n0"])
    guest._marked, guest._marked_at = {"ep-00001"}, time.monotonic()
    assert "went NotReady" in guest.why_not_ready(["ep-00001"]) and "kwok" not in guest.why_not_ready(["ep-00001"])
    assert own.why_not_ready([]) == ""
    own._marked = set()
    assert own.why_not_ready(["ep-00002"]) == ""           # nothing the cluster said: the plain difference only
