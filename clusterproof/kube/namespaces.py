"""Where a run's objects live: namespaces it creates, or namespaces it claims from a pool.

Why two kinds, behind one ``take``/``give_back``:

- on its own embedded cluster the harness creates a namespace per use
  (``cp-<run>-<purpose>-<hex>``, labelled with the run id) and deletes it
  afterwards -- the cluster is the run's;
- on a cluster it does not own it may not create or delete namespaces at all.
  The SRE provisions a pool once (``clusterproof/kube/rbac.yaml``: ``clusterproof-0``
  .. ``-7``, each bound to the ``clusterproof-pool`` role), and a run claims
  one per use (``clusterproof.kube.claims``: a Lease ``clusterproof-claim-<namespace>``
  in the home namespace, holder = run id), works in it, empties it of the
  run's objects and drops the claim. Two runs at once never share a
  namespace; a claim whose run is dead (its run Lease expired or gone) is
  taken over after the dead run's objects are removed from it.

Checks never ask which kind they got: a fresh, empty namespace either way.
Labels (the taint suite's team label) exist only on created namespaces; a
pool namespace cannot be relabelled by a guest, so team checks on a cluster
the harness does not own use the profile's ``team_namespaces``.
"""
from __future__ import annotations

import json
import os
import re
import threading
from typing import Callable

from kubernetes import client

from clusterproof.core import kubeversions
from clusterproof.core.errors import HarnessError
from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.claims import NAMESPACE_CLAIM, Claims
from clusterproof.kube.client import delete_each, list_all, raw_request
from clusterproof.kube.pod_spec import POD_SECURITY_LABELS
from clusterproof.kube.pods import delete_namespace, list_pods

# What a run may create in a pool namespace (the clusterproof-pool role), removed when it gives the
# namespace back: every object carrying its run label, one request each. A kind the cluster does not
# serve (the PodGroup CRD, native Workloads) is skipped.
POOL_KINDS = (
    "/api/v1/namespaces/{ns}/pods",
    "/api/v1/namespaces/{ns}/services",
    "/api/v1/namespaces/{ns}/podtemplates",
    "/api/v1/namespaces/{ns}/configmaps",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "/api/v1/namespaces/{ns}/serviceaccounts",
    "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
    # native gangs in every version a server may serve (the PodGroups first: made from their Workload)
    *(f"/apis/{gv}/namespaces/{{ns}}/podgroups" for gv in kubeversions.NATIVE_GANG_APIS[:-1]),
    *(f"/apis/{gv}/namespaces/{{ns}}/workloads" for gv in kubeversions.NATIVE_GANG_APIS),
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def create_namespace(api: client.ApiClient, name: str, run_id: str | None = None, labels: dict | None = None) -> dict:
    """The one place a namespace is created; returns it as the API server wrote it (its uid for an owner record).

    With ``run_id`` it is the run's: labelled with the run and annotated with its owner (``core.run.metadata``),
    so the run's clean-up and a later run's sweeper find it, and it enforces Pod Security ``restricted`` as
    the pool namespaces of clusterproof/kube/rbac.yaml do (every run proves its pods comply). Without, it is
    someone else's (a team's, a bystander's in a self-test): only ``labels``. Deleted with
    ``kube.pods.delete_namespace`` (its pods and Events first)."""
    meta = (metadata(name, run_id, {**POD_SECURITY_LABELS, **(labels or {})}) if run_id is not None
            else {"name": name, "labels": dict(labels or {})})
    return json.loads(raw_request(api, "POST", "/api/v1/namespaces", body={"metadata": meta}).data)


class Created:
    """A simulated cluster (the embedded one, or one of kwok nodes named by --cp-kubeconfig): a namespace per
    use, created and deleted by the run."""
    kind = "created"

    def __init__(self, api: client.ApiClient, run_id: str):
        self.api, self.run_id = api, run_id
        self.held: set[str] = set()

    def take(self, purpose: str, labels: dict | None = None) -> str:
        name = f"cp-{self.run_id[-4:]}-{_slug(purpose)}"[:55].rstrip("-") + "-" + os.urandom(2).hex()
        create_namespace(self.api, name, self.run_id, labels)
        self.held.add(name)
        return name

    def give_back(self, name: str, timeout: float = 300) -> None:
        delete_namespace(self.api, name, self.run_id, timeout)
        self.held.discard(name)

    def release_all(self) -> None:
        for ns in sorted(self.held):
            self.give_back(ns)


def empty(api: client.ApiClient, ns: str, whose: Callable[[str], bool], timeout: float = 300) -> int:
    """Delete the objects in ``ns`` of every run ``whose(run id)`` picks (pods with grace 0, then the rest,
    one request each) and every Event there; wait until those pods are gone. Returns how many went.

    Only for pool namespaces: the SRE provisioned them for the harness alone, so what a run left there
    is the harness's to remove (the claim says which run holds it now)."""
    deleted, pods_of = 0, set()
    for kind in POOL_KINDS:
        path = kind.format(ns=ns)
        try:
            objs = [o for o in list_all(api, path, {"labelSelector": RUN_LABEL})
                    if whose(o["metadata"]["labels"][RUN_LABEL]) and not o["metadata"].get("deletionTimestamp")]
        except client.ApiException as e:
            if e.status == 404:        # a kind this cluster does not serve
                continue
            raise
        if path.endswith("/pods"):
            pods_of = {o["metadata"]["labels"][RUN_LABEL] for o in objs}
        query = {"gracePeriodSeconds": "0"} if path.endswith("/pods") else None
        deleted += delete_each(api, [f"{path}/{o['metadata']['name']}" for o in objs], query)
    wait_for(lambda: [n for n, p in list_pods(api, ns, RUN_LABEL).items()
                      if p["metadata"]["labels"][RUN_LABEL] in pods_of],
             until=lambda left: not left, timeout=timeout, interval=1,
             what=f"pods of run(s) {', '.join(sorted(pods_of))} in namespace {ns} gone")
    events = f"/api/v1/namespaces/{ns}/events"
    delete_each(api, [f"{events}/{e['metadata']['name']}" for e in list_all(api, events)])
    return deleted


class NamespacePool:
    """A cluster the harness does not own: namespaces claimed from the provisioned pool."""
    kind = "pool"

    def __init__(self, api: client.ApiClient, run_id: str, home: str, pool: list[str], wait_s: float = 300,
                 say: Callable[[str], None] = lambda _m: None):
        self.api, self.run_id, self.pool, self.wait_s, self.say = api, run_id, list(pool), wait_s, say
        self.claims = Claims(api, home, run_id, NAMESPACE_CLAIM)
        self.held: set[str] = set()
        self._lock = threading.Lock()

    def take(self, purpose: str, labels: dict | None = None) -> str:
        if labels:
            raise HarnessError(f"{purpose} needs a namespace labelled {labels}, but on a cluster the harness does "
                               "not own it works in the provisioned pool and cannot label namespaces: name "
                               "existing, labelled namespaces in the profile (team_namespaces)")
        holders: dict[str, str] = {}

        def emptied(ns: str):
            def dead(holder: str) -> None:
                empty(self.api, ns, lambda run: run == holder)
                self.say(f"namespace pool: took over {ns} from run {holder}, whose Lease is gone or expired")
            return dead

        def attempt() -> str | None:
            alive = self.claims.alive()
            for ns in self.pool:
                with self._lock:
                    if ns in self.held:
                        holders[ns] = self.run_id
                        continue
                    holder = self.claims.try_take(ns, alive, emptied(ns))
                    if holder is None:
                        self.held.add(ns)
                        # What runs that are over left here without a claim (a clean-up that failed
                        # half-way) goes before this run starts: a check gets an empty namespace.
                        empty(self.api, ns, lambda run: run != self.run_id and not alive.get(run, False))
                        return ns
                holders[ns] = holder
            return None
        try:
            return wait_for(attempt, timeout=self.wait_s, interval=2, what="a free namespace in the pool")
        except WaitTimeout:
            raise HarnessError(f"every namespace of the pool is in use for {self.wait_s:g} s "
                               f"({', '.join(f'{n}: run {r}' for n, r in sorted(holders.items()))}): wait for those "
                               "runs, or add namespaces to the pool (clusterproof/kube/rbac.yaml)") from None

    def give_back(self, name: str, timeout: float = 300) -> None:
        """Empty ``name`` of this run's objects, then drop the claim. If emptying fails the claim stays:
        the run's end (``release_all``) tries again, and after the run the sweeper does (dead holder).

        A run that no longer holds the claim (it lost its Lease and a sweeper gave the namespace to another
        run) empties nothing: emptying removes every Event there, by then the other run's too. What it made
        is the sweeper's to remove, by its owner record."""
        why = self.claims.lost(name)
        if why:
            self.say(f"namespace {name} left as it is: {why}")
            with self._lock:
                self.held.discard(name)
            return
        empty(self.api, name, lambda run: run == self.run_id, timeout)
        self.claims.release(name)
        with self._lock:
            self.held.discard(name)

    def release_all(self) -> None:
        """At the run's end: every namespace still held is emptied and given back."""
        for ns in sorted(self.held):
            self.give_back(ns)
