"""Node deletions the embedded cluster's kwok controller never saw: found in its log, their lease workers stopped.

Why: kwok v0.8.0 (the pinned simulator) learns of a deleted node from its
node watch. When kube-apiserver closes that watch because kwok reads it too
slowly (``apiserver_terminated_watchers_total{resource="nodes"}`` rises: a
1,000-node join storm at 7,500 nodes does it), client-go re-lists and hands
every node deleted in between to kwok as ``DeletedFinalStateUnknown``; kwok's
filter cannot read that wrapper (``meta.Accessor`` fails) and drops the event
(sigs.k8s.io/kwok pkg/utils/informer: ``DeleteFunc``), so the node's lease
worker is never released. From then on kwok keeps creating and renewing the
Lease of a node that no longer exists, every renew interval, for the rest of
the cluster's life: reproduced by hand at 7,500 nodes (1,000 nodes created
with kubectl and deleted: 872 kept, with 9 node watchers terminated
meanwhile; 300 deleted on a quiet cluster: none). After the main job's join
storms some 2,500 such workers write beside the 7,500 real nodes' renewals;
the nightly whose kwok failed 44,245 such syncs also saw 113 pods of the
watch suite lose Ready (their nodes lapsed NotReady, which kwok never undoes)
and a new node's pods wait 470 s for kwok -- this load is the suspect, not
proven the cause.

A kubelet's node is not kept alive by its own deletion, so this is the
simulator's defect, not the cluster's. Sending the deletions again does not
help (tried: re-creating and deleting 3,300 names at 7,500 nodes closed kwok's
node watch again, and kwok lost most of them a second time). What stops a lost
worker is another holder: kwok renews only a Lease it holds or that has
expired. So before each module the embedded cluster's guard reads kwok's log
for the names its lease worker keeps writing about that are no node (more
than the one "Creating lease" of a node's joining), and gives each such name a
Lease held by the harness, unexpired for a year, with the run's label,
removed when the session ends (``unpark``; a killed run's cluster goes
with its watchdog). These Leases stay out of the owner record: each would
cost its ConfigMap ~230 bytes of its 1 MiB, and after the join storms the
record already names ~2,500 nodes; they exist only on the harness's own
embedded cluster. Measured on the cluster of
that reproduction: 3,301 names parked in 22 s, and kwok wrote nothing about
any of them from two minutes later on (it re-reads its cache, no API call). A
node that exists is never touched. Existing clusters have no kwok of the
harness's and are never looked at.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

from clusterproof.core.run import metadata
from clusterproof.kube.client import create_if_absent, delete_if_present, get_if_present, list_raw
from clusterproof.kube.liveness import LEASES

# kwok's JSON log lines of its lease worker that name a node. A node kwok let go of when it was deleted has one
# "Creating lease" (when it joined); a lost worker writes one every renew interval, or fails to sync.
_LEASE_LINE = re.compile(rb'"msg": *"(Creating lease|Failed to sync lease)"')
NODE_LEASES = "kube-node-lease"


def lease_mentions(lines) -> Counter:
    """How often kwok's lease worker wrote about each node in ``lines`` (bytes lines of kwok's JSON log): a
    "Creating lease" counts 1, a "Failed to sync lease" 2 (only a worker for a node without its Lease fails
    like that). Other lines are ignored."""
    seen: Counter = Counter()
    for line in lines:
        m = _LEASE_LINE.search(line)
        if not m:
            continue
        try:
            name = json.loads(line).get("node")
        except ValueError:
            continue                      # a line cut by the log's rotation or a write in progress
        if name:
            seen[name] += 2 if m.group(1) == b"Failed to sync lease" else 1
    return seen


PARKED_BY = "clusterproof: this node was deleted"
PARK_S = 365 * 24 * 3600          # far beyond any run: kwok never sees it expire


def parked_lease(name: str, run_id: str, now: str) -> dict:
    """The Lease of a deleted node, held by the harness: kwok's lost worker finds another holder, unexpired, and
    stops writing (it only re-reads its cache each renew interval). No owner: the garbage collector keeps it."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {**metadata(name, run_id), "namespace": NODE_LEASES},
            "spec": {"holderIdentity": PARKED_BY, "leaseDurationSeconds": PARK_S, "renewTime": now}}


@dataclass
class LostDeletions:
    """Reads kwok's log from where it last stopped; ``repair`` parks a Lease for each deleted node kwok still works
    for (found since the last look); ``unpark`` removes them."""
    log: Path
    offset: int = 0
    parked: set[str] = field(default_factory=set)      # every name whose Lease the harness holds now
    seen: Counter = field(default_factory=Counter)      # lease-worker mentions per node name, every scan so far

    def scan(self) -> None:
        """Count the lease worker's mentions in the log's new bytes (since the last scan)."""
        try:
            with self.log.open("rb") as f:
                f.seek(0, 2)
                end = f.tell()
                if end < self.offset:          # a new log (the component restarted with a fresh file)
                    self.offset = 0
                f.seek(self.offset)
                data = f.read(end - self.offset)
        except OSError:
            return
        cut = data.rfind(b"\n") + 1            # a line still being written is read next time
        self.offset += cut
        self.seen.update(lease_mentions(data[:cut].splitlines()))

    def repair(self, api: client.ApiClient, run_id: str, workers: int = 8) -> list[str]:
        """Park the Lease of every name kwok still works for that is no node; return the names parked now."""
        api = client.ApiClient(api.configuration)   # not the run's recorded client: see the module's doc
        self.scan()
        names = {n for n, k in self.seen.items() if k >= 2} - self.parked
        if not names:
            return []
        # a consistent read (not the watch cache's): a node that exists must never get a Lease held by another
        existing = {n["metadata"]["name"] for n in list_raw(api, "/api/v1/nodes")["items"]}
        lost = sorted(names - existing)
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        def park(name: str) -> None:
            leases = f"{LEASES}/namespaces/{NODE_LEASES}/leases"
            if create_if_absent(api, leases, parked_lease(name, run_id, now)):
                return
            # kwok's own Lease of the deleted node (made again by the lost worker, owned by the node that is
            # gone): replaced by the harness's
            old = get_if_present(api, f"{leases}/{name}")
            if old is not None and old["spec"].get("holderIdentity") != PARKED_BY:
                try:
                    delete_if_present(api, f"{leases}/{name}", body={"preconditions": {"uid": old["metadata"]["uid"]}})
                except client.ApiException as e:
                    if e.status != 409:          # replaced meanwhile: the next module's look parks it
                        raise
                    return
                create_if_absent(api, leases, parked_lease(name, run_id, now))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(park, lost))
        self.parked |= set(lost)
        return lost

    def unpark(self, api: client.ApiClient, workers: int = 8) -> int:
        """Remove the Leases ``repair`` made (the harness's holder only); how many were still there."""
        api = client.ApiClient(api.configuration)
        leases = f"{LEASES}/namespaces/{NODE_LEASES}/leases"

        def one(name: str) -> bool:
            lease = get_if_present(api, f"{leases}/{name}")
            if lease is None or lease["spec"].get("holderIdentity") != PARKED_BY:
                return False
            try:
                return delete_if_present(api, f"{leases}/{name}",
                                         body={"preconditions": {"uid": lease["metadata"]["uid"]}})
            except client.ApiException as e:
                if e.status != 409:
                    raise
                return False
        with ThreadPoolExecutor(max_workers=workers) as pool:
            n = sum(pool.map(one, sorted(self.parked)))
        self.parked.clear()
        return n
