"""One run at a time: Leases in the harness's home namespace that give a shared thing to one run.

Why: two runs against one cluster share what the manifest provisions -- the
pool namespaces, and the few cluster-wide objects of fixed name that a
destructive check installs (the API flood's FlowSchema ``clusterproof-flood``:
RBAC can name it only if the name is fixed). A claim is a Lease
``clusterproof-<kind>-<key>`` whose holder is a run id; creating it is the
claim (409: someone holds it). A claim whose run is dead (its run Lease
expired or gone, ``clusterproof.kube.liveness``) is taken over with a conditional
write, after ``on_dead_holder`` has removed what the dead run left there, so
two runs that both found it dead cannot both take it.
"""
from __future__ import annotations

from typing import Callable

from kubernetes import client

from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import delete_if_present, get_if_present, list_all, merge_patch, raw_request
from clusterproof.kube.liveness import LEASES, run_states

NAMESPACE_CLAIM = "clusterproof-claim-"    # a pool namespace
TURN = "clusterproof-turn-"                # a named cluster-wide object


class Claims:
    """The claims of one kind (``prefix``) in ``home``, taken for ``run_id``."""

    def __init__(self, api: client.ApiClient, home: str, run_id: str, prefix: str):
        self.api, self.home, self.run_id, self.prefix = api, home, run_id, prefix

    @property
    def collection(self) -> str:
        return f"{LEASES}/namespaces/{self.home}/leases"

    def path(self, key: str) -> str:
        return f"{self.collection}/{self.prefix}{key}"

    def _body(self, key: str) -> dict:
        meta = metadata(f"{self.prefix}{key}", self.run_id)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.run_id}}

    def alive(self) -> dict[str, bool]:
        return {run: s.alive for run, s in run_states(self.api, self.home).items()}

    def try_take(self, key: str, alive: dict[str, bool],
                 on_dead_holder: Callable[[str], None] = lambda _run: None) -> str | None:
        """Claim ``key``: None if this run holds it now, else the run that does."""
        try:
            raw_request(self.api, "POST", self.collection, body=self._body(key)).data
            return None
        except client.ApiException as e:
            if e.status != 409:
                raise
        current = get_if_present(self.api, self.path(key))
        if current is None:
            return "(released just now)"
        holder = (current.get("spec") or {}).get("holderIdentity") or "?"
        if holder == self.run_id:
            return None
        if alive.get(holder, False):
            return holder
        on_dead_holder(holder)
        try:   # a conditional merge patch: the claim changes hands only if nobody wrote it since the read
            merge_patch(self.api, self.path(key), {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"],
                             "labels": {RUN_LABEL: self.run_id}},
                "spec": {"holderIdentity": self.run_id}})
        except client.ApiException as e:
            if e.status in (404, 409):
                return f"{holder} (taken over by another run just now)"
            raise
        return None

    def wait_take(self, key: str, timeout: float,
                  on_dead_holder: Callable[[str], None] = lambda _run: None) -> str | None:
        """``try_take`` until it succeeds or ``timeout`` passes; None (taken) or the run still holding it."""
        seen = {}

        def attempt():
            seen["holder"] = self.try_take(key, self.alive(), on_dead_holder)
            return seen["holder"] is None
        try:
            wait_for(attempt, timeout=timeout, interval=2, what=f"{self.prefix}{key} free")
        except WaitTimeout:
            return seen.get("holder")
        return None

    def release(self, key: str) -> None:
        """Drop this run's claim (only if it is still this run's: uid precondition)."""
        current = get_if_present(self.api, self.path(key))
        if current is not None and (current.get("spec") or {}).get("holderIdentity") == self.run_id:
            delete_if_present(self.api, self.path(key), body={"preconditions": {"uid": current["metadata"]["uid"]}})

    def held_by(self) -> dict[str, str]:
        """{key: holder run} of every claim of this kind."""
        return {lease["metadata"]["name"][len(self.prefix):]: (lease.get("spec") or {}).get("holderIdentity") or "?"
                for lease in list_all(self.api, self.collection, {"labelSelector": RUN_LABEL})
                if lease["metadata"]["name"].startswith(self.prefix)}
