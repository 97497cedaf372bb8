"""Watches and requests survive a control plane that drops connections (no cluster needed).

The informer (``clusterproof.kube.informer``) reconnects with bounded, jittered
exponential backoff on any failure of its list or watch, resumes from the
last resourceVersion, relists on 410, gives up after its bound with one
line, and never lets a consumer read a cut-off store as current.
``raw_request`` (``clusterproof.kube.client``) retries connection errors within a
bound, and re-sends a write only when that is safe. Scripted fakes stand in
for the API server; the same behaviour against the real one is in
tests/test_watches_and_events.py and tests/test_apiserver_restart.py.
"""
from __future__ import annotations

import json
import time

import pytest
import urllib3
from kubernetes import client

from clusterproof.kube import client as kube
from clusterproof.kube.informer import Gone, Informer, InformerError


def _reset():
    return urllib3.exceptions.ProtocolError("Connection aborted.",
                                            ConnectionResetError(104, "Connection reset by peer"))


def _refused():
    return urllib3.exceptions.MaxRetryError(None, "/api/v1/namespaces/ns/pods", urllib3.exceptions.NewConnectionError(
        None, "Failed to establish a new connection: [Errno 111] Connection refused"))


def _pod(name, rv):
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}


def _listing(rv, *pods):
    return {"metadata": {"resourceVersion": rv}, "items": list(pods)}


class _Script:
    """The API server as a script: each list or watch call takes the next step, which is a result
    (a listing; a watch's events) or an exception to raise; an exception among a watch's events
    cuts the stream there. The last step repeats (a server that stays down)."""

    def __init__(self, lists, watches):
        self.lists, self.watches = list(lists), list(watches)
        self.watch_rvs: list[str] = []
        self.calls = 0

    @staticmethod
    def _next(steps):
        return steps.pop(0) if len(steps) > 1 else steps[0]

    def list(self, _path, _query):
        self.calls += 1
        step = self._next(self.lists)
        if isinstance(step, BaseException):
            raise step
        return step

    def watch(self, _path, rv, _query, _timeout):
        self.calls += 1
        self.watch_rvs.append(rv)
        step = self._next(self.watches)
        if isinstance(step, BaseException):
            raise step
        for event in step:
            if isinstance(event, BaseException):
                raise event
            if event == "410":
                raise Gone("too old resource version")
            yield event, 100


def _informer(script, seen=None, **kw):
    kw = {"backoff_first_s": 0.001, "backoff_max_s": 0.004, **kw}
    on = (lambda k, o: seen.append((k, o["metadata"]["name"]))) if seen is not None else None
    return Informer(None, "/api/v1/namespaces/ns/pods", on_event=on, list_fn=script.list, watch_fn=script.watch, **kw)


# --- the informer -------------------------------------------------------------------------------

@pytest.mark.unit
def test_the_informer_reconnects_after_a_connection_reset():
    script = _Script([_listing("10", _pod("a", "1"))],
                     [[{"type": "MODIFIED", "object": _pod("a", "11")}, _reset()],
                      [{"type": "ADDED", "object": _pod("b", "12")}]])
    seen = []
    inf = _informer(script, seen)
    assert inf.run(until=lambda: inf.get("b", "ns") is not None, deadline=time.monotonic() + 10)
    # Resumed from the last resourceVersion it saw: nothing missed, nothing relisted.
    assert script.watch_rvs == ["10", "11"]
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b")]
    assert inf.relists == 0 and inf.reconnects == 1 and inf.connected
    [cut] = inf.outages
    assert cut.ended is not None and "ProtocolError" in cut.error and "reset" in cut.error, cut


@pytest.mark.unit
def test_the_informer_rides_out_refusals_5xx_error_events_and_malformed_lines():
    def ok(i):   # one delivered event between failures: each failure is an outage of its own
        return {"type": "MODIFIED", "object": _pod("a", str(10 + i))}
    script = _Script([_refused(), _refused(), _listing("10", _pod("a", "1"))],
                     [client.ApiException(status=503, reason="Service Unavailable"),
                      [ok(1), ValueError("malformed watch line: b'{\"type\": \"MODIF'")],
                      [ok(2), {"type": "ERROR", "object": {"code": 500, "message": "internal error"}}],
                      [ok(3), "not an event"],
                      [ok(4), urllib3.exceptions.ReadTimeoutError(None, "/api", "Read timed out.")],
                      [{"type": "ADDED", "object": _pod("b", "20")}]])
    inf = _informer(script)
    assert inf.run(until=lambda: inf.get("b", "ns") is not None, deadline=time.monotonic() + 10)
    assert inf.reconnects == 7 and inf.connected and inf.stale_s == 0
    assert script.watch_rvs == ["10", "10", "11", "12", "13", "14"]   # always resumed, never relisted
    errors = [o.last_error for o in inf.outages]
    assert len(errors) == 6 and all(o.ended is not None for o in inf.outages), inf.outages
    assert inf.outages[0].attempts == 2
    for what, got in zip(("NewConnectionError: Connection refused", "HTTP 503", "malformed",
                          "ERROR event: internal error", "malformed watch event", "Read timed out"), errors):
        assert what in got, (what, got)


@pytest.mark.unit
def test_the_informer_relists_when_its_version_is_gone_after_a_reconnect():
    script = _Script([_listing("10", _pod("a", "1"), _pod("b", "2")), _refused(), _listing("30", _pod("c", "25"))],
                     [_reset(), ["410"], [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "31"}}}]])
    seen = []
    inf = _informer(script, seen)
    assert inf.run(until=lambda: inf.rv == "31", deadline=time.monotonic() + 10)
    # The relist itself was refused once, then succeeded: DELETED for what vanished meanwhile.
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a"), ("DELETED", "b"), ("ADDED", "c")]
    assert inf.relists == 1 and inf.reconnects == 2


@pytest.mark.unit
def test_the_reconnect_backoff_doubles_with_jitter_up_to_its_bound():
    script = _Script([_listing("10")], [_reset()])
    inf = _informer(script, backoff_first_s=0.002, backoff_max_s=0.016, give_up_s=0.3)
    with pytest.raises(InformerError):
        inf.run()
    assert len(inf.backoffs) >= 8, inf.backoffs
    for n, delay in enumerate(inf.backoffs[:12], start=1):
        nominal = min(0.016, 0.002 * 2 ** (n - 1))
        assert nominal / 2 <= delay <= nominal, (n, delay)
    assert max(inf.backoffs) <= 0.016
    # Jitter: informers cut at once do not all come back in step.
    assert len({round(d, 6) for d in inf.backoffs[4:]}) > 1


@pytest.mark.unit
def test_the_backoff_starts_over_once_a_stream_delivers():
    events = [[{"type": "MODIFIED", "object": _pod("a", str(i))}, _reset()] for i in range(11, 16)]
    script = _Script([_listing("10", _pod("a", "1"))], [_reset(), _reset(), _reset(), *events, [_reset()]])
    inf = _informer(script, backoff_first_s=0.002, backoff_max_s=0.5)
    inf.run(until=lambda: inf.rv == "15", deadline=time.monotonic() + 10)
    # Three failures in a row grew the delay to 4x; after each delivered event it is back to the first.
    assert inf.backoffs[2] >= 0.004
    assert all(d <= 0.002 for d in inf.backoffs[3:]), inf.backoffs


@pytest.mark.unit
def test_the_informer_gives_up_after_its_bound_with_one_line():
    script = _Script([_listing("10")], [_refused()])
    inf = _informer(script, give_up_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(InformerError) as e:
        inf.run()
    assert 0.2 <= time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "\n" not in msg and "gave up after 0.2 s" in msg and "Connection refused" in msg, msg
    assert "/api/v1/namespaces/ns/pods" in msg


@pytest.mark.cluster
def test_a_cut_off_store_is_seen_as_stale_and_check_raises():
    script = _Script([_listing("10", _pod("a", "1"))], [[{"type": "ADDED", "object": _pod("b", "11")}, _refused()],
                                                        _refused()])
    inf = _informer(script, give_up_s=1.0, backoff_max_s=0.01).start(timeout=10)
    try:
        inf.check(max_stale_s=30)
        # Cut off after b: the store still holds a and b, but says it is stale.
        from clusterproof.core.waiting import wait_for
        wait_for(lambda: inf.stale_s, until=lambda s: s > 0.3, timeout=10, interval=0.02, what="the store stale")
        assert not inf.connected and inf.get("b", "ns") is not None
        with pytest.raises(InformerError, match=r"cut off for \d+ s .*staler than the 0.1 s this wait accepts"):
            inf.check(max_stale_s=0.1)
        inf.check(max_stale_s=60)          # a consumer that accepts more is not failed
        wait_for(lambda: inf.error, timeout=10, interval=0.02, what="the informer gives up")
        with pytest.raises(InformerError, match="gave up after 1 s"):
            inf.check()
    finally:
        inf.stop()


@pytest.mark.unit
def test_a_window_that_ends_while_the_watch_is_cut_off_raises_instead_of_answering():
    """``watch_for(seconds, until)`` answers "did it happen?"; cut off at the end, it cannot say no."""
    script = _Script([_listing("10")], [[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}},
                                         _reset()], _refused()])
    inf = _informer(script)
    with pytest.raises(InformerError, match="cut off when its window ended"):
        inf.watch_for(0.3, lambda: False)


@pytest.mark.unit
def test_an_answer_no_retry_can_change_ends_the_informer_at_once():
    script = _Script([_listing("10")], [client.ApiException(status=403, reason="Forbidden")])
    inf = _informer(script)
    with pytest.raises(InformerError, match="HTTP 403 Forbidden"):
        inf.run()
    assert inf.reconnects == 0 and script.calls == 2


@pytest.mark.unit
def test_a_consumer_whose_handler_raises_is_not_retried():
    def boom(kind, obj):
        raise KeyError("spec")
    script = _Script([_listing("10", _pod("a", "1"))], [[]])
    inf = Informer(None, "/p", on_event=boom, list_fn=script.list, watch_fn=script.watch)
    with pytest.raises(InformerError, match="KeyError"):
        inf.run()
    assert inf.reconnects == 0


@pytest.mark.unit
def test_outages_tell_a_measurement_whether_its_window_had_a_hole():
    script = _Script([_listing("10")], [[_reset()], [{"type": "ADDED", "object": _pod("b", "11")}]])
    inf = _informer(script)
    t0 = time.monotonic()
    inf.run(until=lambda: inf.get("b", "ns") is not None, deadline=time.monotonic() + 10)
    assert [str(o).split(" UTC ")[1].startswith("for ") for o in inf.outages_since(t0)] == [True]
    assert inf.outages_since(time.monotonic() + 1) == []


# --- raw_request: which failures are sent again -------------------------------------------------

class _Resp:
    def __init__(self, data=b"{}", broken=False):
        self._data, self._broken, self.status = data, broken, 200

    @property
    def data(self):
        if self._broken:   # the connection broke while the body arrived
            raise urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(10 bytes read, 90 more expected)")
        return self._data


class _Server:
    """``kube._send`` as a script: each attempt takes the next step (a response or an exception)."""

    def __init__(self, monkeypatch, *steps, objects=None):
        self.steps, self.sent, self.objects = list(steps), [], objects or {}
        monkeypatch.setattr(kube, "_send", self.send)
        monkeypatch.setattr(kube, "RETRY_FIRST_S", 0.001)
        monkeypatch.setattr(kube, "RETRY_MAX_S", 0.004)

    def send(self, api, method, path, query, headers, body, timeout):
        self.sent.append((method, path))
        if method == "GET" and path in self.objects:
            return _Resp(json.dumps(self.objects[path]).encode())
        named = (query or {}).get("fieldSelector", "").removeprefix("metadata.name=")
        if method == "GET" and named and f"{path}/{named}" in self.objects:   # a LIST by name
            return _Resp(json.dumps({"items": [self.objects[f"{path}/{named}"]]}).encode())
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if isinstance(step, BaseException):
            raise step
        return step


def _api_error(status):
    return client.ApiException(status=status, reason={404: "Not Found", 409: "Conflict", 503: "Service Unavailable"}
                               .get(status, ""))


@pytest.mark.unit
def test_a_read_is_retried_after_a_connection_reset_or_refusal(monkeypatch):
    server = _Server(monkeypatch, _reset(), _refused(), _Resp(b'{"items": []}'))
    assert kube.list_raw(None, "/api/v1/pods") == {"items": []}
    assert len(server.sent) == 3


@pytest.mark.unit
def test_a_body_cut_off_mid_read_is_fetched_again_for_a_read(monkeypatch):
    server = _Server(monkeypatch, _Resp(broken=True), _Resp(b'{"items": [1]}'))
    assert kube.list_raw(None, "/api/v1/pods") == {"items": [1]}
    assert len(server.sent) == 2


@pytest.mark.unit
def test_a_write_is_sent_again_only_if_it_never_left(monkeypatch):
    server = _Server(monkeypatch, _refused(), _Resp(b"{}"))
    kube.raw_request(None, "POST", "/api/v1/namespaces/ns/configmaps", body={"metadata": {"name": "x"}})
    assert len(server.sent) == 2, "a refused connection sent nothing: the POST is sent again"
    for method in ("POST", "PATCH", "PUT", "DELETE"):
        server = _Server(monkeypatch, _reset(), _Resp(b"{}"))
        with pytest.raises(urllib3.exceptions.ProtocolError) as e:
            kube.raw_request(None, method, "/api/v1/namespaces/ns/configmaps/x", body={})
        assert len(server.sent) == 1, f"a {method} that may have been applied was sent again"
        assert f"a {method} that may have reached the server is not safe to repeat" in " ".join(e.value.__notes__)


@pytest.mark.cluster
def test_retries_of_connection_errors_are_bounded(monkeypatch):
    server = _Server(monkeypatch, _refused())
    t0 = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
        kube.raw_request(None, "GET", "/api/v1/pods", retry_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 2
    assert len(server.sent) > 3
    [note] = e.value.__notes__
    assert note.startswith("clusterproof: GET /api/v1/pods: connection failed (") and "gave up after 0.3 s" in note


@pytest.mark.unit
def test_watches_read_timeouts_and_http_answers_are_not_retried_here(monkeypatch):
    for step, query in ((_reset(), {"watch": "true"}),
                        (urllib3.exceptions.ReadTimeoutError(None, "/api", "Read timed out."), None),
                        (_api_error(503), None)):
        server = _Server(monkeypatch, step, _Resp())
        with pytest.raises(type(step)):
            kube.raw_request(None, "GET", "/api/v1/pods", query)
        assert len(server.sent) == 1, step


MARKS = {"labels": {"clusterproof.io/run": "r1"}, "annotations": {"clusterproof.io/created": "2026-11-30T10:00:00Z"}}


@pytest.mark.unit
def test_create_if_absent_knows_its_own_first_attempt_after_a_resend(monkeypatch):
    body = {"metadata": {"name": "sa", **MARKS}}
    path = "/api/v1/namespaces/ns/serviceaccounts"
    # The POST reached the server, the answer was lost; sent again: 409, and the object bears our marks.
    _Server(monkeypatch, _reset(), _api_error(409), objects={f"{path}/sa": {"metadata": {"name": "sa", **MARKS}}})
    assert kube.create_if_absent(None, path, body) is True
    # Same, but the object is someone else's (another run's label): not ours, left alone.
    other = {"labels": {"clusterproof.io/run": "r2"}, "annotations": MARKS["annotations"]}
    _Server(monkeypatch, _reset(), _api_error(409), objects={f"{path}/sa": {"metadata": {"name": "sa", **other}}})
    assert kube.create_if_absent(None, path, body) is False
    # No resend: a 409 is an object that existed before (not even looked at).
    server = _Server(monkeypatch, _api_error(409), objects={f"{path}/sa": {"metadata": {"name": "sa", **MARKS}}})
    assert kube.create_if_absent(None, path, body) is False
    assert server.sent == [("POST", path)]


@pytest.mark.unit
def test_delete_if_present_counts_a_404_after_a_resend_as_its_own(monkeypatch):
    _Server(monkeypatch, _reset(), _api_error(404))
    assert kube.delete_if_present(None, "/api/v1/namespaces/ns/pods/p") is True
    _Server(monkeypatch, _api_error(404))
    assert kube.delete_if_present(None, "/api/v1/namespaces/ns/pods/p") is False
    _Server(monkeypatch, _refused(), _Resp())
    assert kube.delete_if_present(None, "/api/v1/namespaces/ns/pods/p") is True


@pytest.mark.unit
def test_a_pod_create_sent_again_returns_our_own_first_attempt(monkeypatch):
    path = "/api/v1/namespaces/ns/pods"
    body = {"metadata": {"name": "p", **MARKS}}
    admitted = {"metadata": {"name": "p", "uid": "u1", **MARKS}}
    _Server(monkeypatch, _reset(), _api_error(409), objects={f"{path}/p": admitted})
    assert kube.create_object(None, path, body) == admitted
    # Someone else's pod of that name: the 409 stands.
    _Server(monkeypatch, _reset(), _api_error(409), objects={f"{path}/p": {"metadata": {"name": "p"}}})
    with pytest.raises(client.ApiException) as e:
        kube.create_object(None, path, body)
    assert e.value.status == 409


@pytest.mark.unit
def test_a_504_is_sent_again_once_where_a_resend_is_safe(monkeypatch):
    """kube-apiserver's own deadline passed (it waited 60 s on the busy CI machine): a read, and a create
    that tells its own 409, are sent once more even though the wait used up the retry budget; any other
    write is not, and says why."""
    path = "/api/v1/namespaces/ns/pods"
    admitted = {"metadata": {"name": "p", "uid": "u1", **MARKS}}
    server = _Server(monkeypatch, _api_error(504), _api_error(409), objects={f"{path}/p": admitted})
    assert kube.create_object(None, path, {"metadata": {"name": "p", **MARKS}}) == admitted
    assert server.sent[:2] == [("POST", path), ("POST", path)]
    server = _Server(monkeypatch, _api_error(504), _Resp(b'{"items": []}'))
    assert kube.list_raw(None, path, retry_s=0.0001) == {"items": []} and len(server.sent) == 2
    server = _Server(monkeypatch, _api_error(504))
    with pytest.raises(client.ApiException) as e:
        kube.list_raw(None, path, retry_s=0.0001)
    assert len(server.sent) == 2, "sent again once, not until the budget"
    server = _Server(monkeypatch, _api_error(504), _Resp())
    with pytest.raises(client.ApiException) as e:
        kube.raw_request(None, "POST", path, body={})
    assert len(server.sent) == 1 and "not safe to repeat" in " ".join(e.value.__notes__)
    server = _Server(monkeypatch, _api_error(504), _Resp())
    with pytest.raises(client.ApiException):
        kube.raw_request(None, "GET", path, {"watch": "true"})
    assert len(server.sent) == 1, "a watch is resumed by its informer, never here"


# --- how the report sorts a result ---------------------------------------------------------------

@pytest.mark.parametrize("status,message,category", [
    pytest.param("failed", "Failed: clusterproof: the API server restarted during the steady phase\n",
                 "Harness or environment error", id="harness-error-from-pytest-fail"),
    pytest.param("broken", "clusterproof.kube.informer.InformerError: the watch of /api/v1/pods gave up after 120 s\n",
                 "Harness or environment error", id="harness-exception"),
    pytest.param("failed", "Failed: this module broke the control plane: kube-apiserver exited at 10:01:02 UTC\n",
                 "Control plane broken (a module broke it, or it was broken before)", id="control-plane"),
    pytest.param("failed", "AssertionError: pod startup SLO (p99 <= 5 s) broken at 10 pods/s\n", "SLO broken",
                 id="slo"),
    pytest.param("failed", "Failed: clusterproof: the SLO figures are void: the API server restarted\n",
                 "Harness or environment error", id="harness-error-naming-an-slo"),
    pytest.param("failed", "AssertionError: 2 check(s) now failing: a, b\n",
                 "Regression against the baseline (--cp-baseline: a figure or a check got worse)", id="regression"),
    pytest.param("failed", "AssertionError: job burst-0: 3 of 18 pods bound\nassert False\n", "Cluster defect",
                 id="cluster-defect"),
])
@pytest.mark.unit
def test_every_result_lands_in_exactly_one_report_category(status, message, category):
    """Allure puts a result in every category that matches; a harness error must not also count as a
    cluster defect (nor a control-plane breakage as a harness error)."""
    from clusterproof.report.allure import categories
    assert categories(status, message) == [category]


# --- the watch-bandwidth streams ------------------------------------------------------------------

@pytest.mark.unit
def test_a_cut_watch_stream_is_not_waited_for_until_the_settle_timeout():
    """A watcher whose stream ended can never catch up: the wait ends as soon as every live one has,
    and the cut one is left to the drop check (or to the restart's one line)."""
    from types import SimpleNamespace

    from clusterproof.watch.measure import wait_caught_up

    class WatchPool:
        def caught_up(self, state, rv, watchers):
            return [f"#{w.index}" for w in watchers if w.view != state]
    final = ("20", {"ns/s1": "20"})
    live = SimpleNamespace(index=0, ended=None, view={"ns/s1": "20"})
    cut = SimpleNamespace(index=1, ended="ClientPayloadError: Response payload is not completed", view={})
    t0 = time.monotonic()
    wait_caught_up(WatchPool(), [live, cut], final, timeout=30, what="caught up")
    assert time.monotonic() - t0 < 1
    behind = SimpleNamespace(index=2, ended=None, view={})
    from clusterproof.core.waiting import WaitTimeout
    with pytest.raises(WaitTimeout, match="#2"):
        wait_caught_up(WatchPool(), [live, cut, behind], final, timeout=0.3, what="caught up")


# --- the preflight contract watch ----------------------------------------------------------------

@pytest.mark.unit
def test_a_bind_the_contract_watch_saw_only_in_a_relist_is_not_judged_but_named():
    """After 410 Gone the informer relists: a pod first seen bound there (or bound while the node watch
    was in such a gap) was bound at a moment nobody saw. Neither a violation nor a pass: one line."""
    from clusterproof.preflight.watch import ContractWatch
    from tests.test_preflight_helpers import M, node, pod
    w = ContractWatch(None, M, ("scope", "yes"))
    w.pod_list_rv = 5
    w._node("ADDED", node("n1", 10, labels={M.label_key: "pending", "scope": "yes"}, taints=[M.taint]))
    w._pod("MODIFIED", pod("seen", "n1", rv=11))             # seen at its moment: a violation
    w.pods.relisting = True
    w._pod("ADDED", pod("in-relist", "n1", rv=30))           # first seen in a relist
    w.pods.relisting = False
    w.nodes.gaps.append(("12", "40"))
    w._pod("MODIFIED", pod("in-node-gap", "n1", rv=35))      # the node's history around rv 35 is unknown
    assert w.violations() == ["pod ns/seen was bound to node n1 while it had not passed preflight "
                              "(label example.com/preflight=pending, taint example.com/preflight)"]
    with pytest.raises(InformerError, match=r"missed the moment of 2 bind\(s\).*nodes 12->40.*"
                                            r"pod ns/in-relist on node n1; pod ns/in-node-gap on node n1"):
        w.check()
