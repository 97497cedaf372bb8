"""The building blocks every suite reads the cluster through, against the real apiserver.

- the informer resumes after ``410 Gone`` with a relist that emits DELETED
  for what vanished while it was not watching;
- the informer and ``raw_request`` ride out a network that resets every
  connection and refuses new ones for a while (a proxy in front of the real
  apiserver): the store says it is stale meanwhile, then catches up from
  its last resourceVersion;
- a pod's events are its own by uid: a pod created again under an old name
  does not inherit its predecessor's verdicts;
- "pods deleted" waits until they are gone, not merely terminating;
- a run namespace is emptied by the harness (pods, Events, one request each)
  before it is deleted, and the module guard waits until it is gone.
"""
from __future__ import annotations

import copy
import json
import socket
import threading
import time

import pytest
from kubernetes import client

from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube import apimetrics
from clusterproof.kube.client import delete_if_present, list_raw, raw_request
from clusterproof.kube.informer import Informer, InformerError
from clusterproof.kube.namespaces import create_namespace
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import (
    create_pods,
    delete_namespace,
    delete_pods,
    list_pods,
    pod_events,
    wait_namespaces_gone,
)


@pytest.mark.coscheduling
@pytest.mark.cluster
def test_informer_relists_after_410_gone_and_emits_deleted(cluster, namespace, run_id):
    """PodGroups (a CRD the embedded cluster has from its start): their watch cache begins at the
    CRD's creation, so a resourceVersion from before it is one the apiserver can no longer serve --
    as after an apiserver restart or a long partition -- and it answers 410 Gone."""
    api, path = cluster.api, f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups"

    def group(name):
        raw_request(api, "POST", path, body={"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                             "metadata": metadata(name, run_id), "spec": {"minMember": 1}}).data
    for name in ("a", "b"):
        group(name)
    seen = []
    inf = Informer(api, path, on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])), chunk_s=5)
    inf.list()
    assert sorted(seen) == [("ADDED", "a"), ("ADDED", "b")]
    # While the informer is away, a PodGroup goes and another comes.
    raw_request(api, "DELETE", f"{path}/a").data
    group("c")
    inf.rv = "1"
    inf.watch_for(30, lambda: inf.get("c", namespace) is not None and inf.get("a", namespace) is None)
    assert inf.relists >= 1, f"no 410 Gone was seen; events: {seen}"
    # (b may be MODIFIED meanwhile: the PodGroup controller writes its status.)
    assert [e for e in seen[2:] if e[0] != "MODIFIED"] == [("DELETED", "a"), ("ADDED", "c")], seen
    assert sorted(o["metadata"]["name"] for o in inf.snapshot()) == ["b", "c"]


@pytest.mark.cluster
def test_a_pod_created_again_under_its_old_name_has_only_its_own_events(cluster, namespace, run_id):
    api = cluster.api
    [old] = create_pods(api, namespace, [pod_body("again", run_id, node_selector={"example.com/none": "x"})]).values()
    wait_for(lambda: pod_events(api, namespace, "FailedScheduling", {"again": old}).get("again"), timeout=60,
             interval=0.5, what="the scheduler refused the first pod 'again'")
    delete_pods(api, namespace, ["again"])
    [new] = create_pods(api, namespace, [pod_body("again", run_id)]).values()
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert pod_events(api, namespace, "FailedScheduling", {"again": old}).get("again")
    assert not pod_events(api, namespace, "FailedScheduling", {"again": new}), \
        "the new pod 'again' inherited its predecessor's FailedScheduling event"


@pytest.mark.cluster
def test_deleted_pods_are_waited_for_until_gone_not_just_terminating(cluster, namespace, run_id):
    api, hold = cluster.api, "clusterproof.io/test-hold"
    # Unbound (no node matches): kwok, which acts on pods of its nodes, does not touch it.
    body = pod_body("held", run_id, node_selector={"example.com/none": "x"})
    body["metadata"]["finalizers"] = [hold]
    create_pods(api, namespace, [body])
    try:
        with pytest.raises(WaitTimeout, match="held"):
            delete_pods(api, namespace, ["held"], timeout=5)
        assert list_pods(api, namespace)["held"]["metadata"].get("deletionTimestamp"), "not even terminating"
    finally:
        raw_request(api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/held",
                    headers={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
                    body=[{"op": "remove", "path": "/metadata/finalizers"}]).data
    delete_pods(api, namespace, ["held"], timeout=30)
    assert "held" not in list_pods(api, namespace)


@pytest.mark.cluster
def test_a_run_namespace_is_emptied_by_the_harness_and_waited_for(cluster, run_id):
    """The Events of thousands of pods outlast the namespace controller's one collection DELETE
    (504 at 7,500 nodes): the harness deletes them itself; the guard waits for the namespace."""
    api, ns, hold = cluster.api, f"cp-{run_id[-4:]}-emptied", "clusterproof.io/test-hold"
    create_namespace(api, ns, run_id)
    try:
        create_pods(api, ns, [pod_body(f"p{i}", run_id, node_selector={"example.com/none": "x"}) for i in range(3)])
        for i in range(20):
            raw_request(api, "POST", f"/api/v1/namespaces/{ns}/events", body={
                "metadata": {"name": f"e{i}"}, "involvedObject": {"kind": "Pod", "namespace": ns, "name": "p0"},
                "reason": "Test", "message": "a verdict", "type": "Normal"}).data
        # A finalizer of our own keeps the namespace terminating: the harness's part is done, the wait is not.
        raw_request(api, "PATCH", f"/api/v1/namespaces/{ns}", body={"metadata": {"finalizers": [hold]}},
                    headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"}).data
        delete_namespace(api, ns, run_id)
        assert not list_pods(api, ns)
        assert not json.loads(raw_request(api, "GET", f"/api/v1/namespaces/{ns}/events").data)["items"]
        with pytest.raises(WaitTimeout, match=ns):
            wait_namespaces_gone(api, run_id, timeout=3)
    finally:
        raw_request(api, "PATCH", f"/api/v1/namespaces/{ns}", body={"metadata": {"finalizers": None}},
                    headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"}).data
        delete_if_present(api, f"/api/v1/namespaces/{ns}")
    wait_namespaces_gone(api, run_id, timeout=60)


@pytest.mark.unit
def test_a_latency_window_is_taken_on_one_apiserver_replica(monkeypatch):
    """Behind a load balancer, scrapes alternate between replicas A and B: the window's second end
    is retried (on fresh connections) until it is A again, and refused if it never is."""
    def scrapes(*answers):
        it = iter(answers)
        monkeypatch.setattr(apimetrics, "scrape", lambda api, prefixes=(), fresh=False: next(it))
    a = "process_start_time_seconds 1.7e+09\nx 1\n"
    b = "process_start_time_seconds 1.8e+09\nx 2\n"
    scrapes(b, b, a)
    assert apimetrics.scrape_same_replica(None, a) == a
    scrapes(*[b] * 10)
    assert apimetrics.scrape_same_replica(None, a) is None


class CuttableLink(threading.Thread):
    """A TCP proxy in front of the API server that can cut every connection (RST) and refuse new ones
    for a while: a network or load balancer dropping the harness, with the control plane untouched."""

    def __init__(self, upstream: tuple[str, int]):
        super().__init__(daemon=True, name="cuttable link")
        self.upstream, self.conns, self.lock = upstream, [], threading.Lock()
        self.port = self._listen(0)
        self.done = threading.Event()

    def _listen(self, port: int) -> int:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        return self.listener.getsockname()[1]

    def run(self) -> None:
        while not self.done.is_set():
            try:
                a, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:          # cut: no listener until the refusal ends
                self.done.wait(0.05)
                continue
            b = socket.create_connection(self.upstream)
            with self.lock:
                self.conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self, refuse_s: float) -> None:
        """Reset every open connection and refuse new ones for ``refuse_s``."""
        listener, self.listener = self.listener, socket.socket()   # accept() now fails: refused
        listener.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                # Linger 0: the close resets the connection; shutdown wakes the pump blocked on it first.
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        threading.Timer(refuse_s, lambda: self._listen(self.port)).start()

    def stop(self) -> None:
        self.done.set()
        self.listener.close()
        with self.lock:
            for c in self.conns:
                c.close()


@pytest.fixture
def link(cluster):
    """An API client whose every connection goes through a ``CuttableLink`` to the cluster's API server."""
    cfg = copy.deepcopy(cluster.api.configuration)
    host, port = cfg.host.split("://", 1)[1].rsplit(":", 1)
    proxy = CuttableLink((host, int(port)))
    proxy.start()
    cfg.host = f"https://127.0.0.1:{proxy.port}"
    api = client.ApiClient(cfg)
    try:
        yield proxy, api
    finally:
        proxy.stop()
        api.close()


@pytest.mark.cluster
def test_the_informer_reconnects_after_a_connection_reset(cluster, namespace, run_id, link):
    proxy, via = link
    path, mine = f"/api/v1/namespaces/{namespace}/configmaps", {"labelSelector": f"{RUN_LABEL}={run_id}"}

    def cm(name):
        raw_request(cluster.api, "POST", path, body={"metadata": metadata(name, run_id)}).data
    seen = []
    cm("a")
    inf = Informer(via, path, mine, on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
                   chunk_s=5).start()
    try:
        assert inf.connected and inf.get("a", namespace) is not None
        proxy.cut(refuse_s=4)
        # While the link is down: a goes, b comes. The store still shows a, and says it is stale.
        raw_request(cluster.api, "DELETE", f"{path}/a").data
        cm("b")
        wait_for(lambda: inf.stale_s, until=lambda s: s > 1, timeout=10, interval=0.1,
                 what="the informer noticing the cut")
        assert not inf.connected and inf.get("a", namespace) is not None
        with pytest.raises(InformerError, match="cut off for"):
            inf.check(max_stale_s=0.5)
        # A read sent while the link refuses connections is retried until it opens again.
        t0 = time.monotonic()
        assert [o["metadata"]["name"] for o in list_raw(via, path, mine)["items"]] == ["b"]
        assert time.monotonic() - t0 < 30
        wait_for(lambda: inf.get("b", namespace) is not None and inf.get("a", namespace) is None, timeout=30,
                 interval=0.1, what="the informer caught up after the link came back")
        inf.check(max_stale_s=0.5)
        assert inf.connected and inf.stale_s == 0
        # Resumed from its last resourceVersion (the apiserver still had the events): no relist.
        assert inf.relists == 0, f"{inf.relists} relists; outages: {inf.outages}"
        assert seen == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")], seen
        assert inf.outages and inf.outages[0].ended is not None, inf.outages
        assert any(w in inf.outages[0].error.lower() for w in ("reset", "refused", "ended", "broken")), \
            inf.outages[0]
    finally:
        inf.stop()
