"""One run at a time: Leases in the harness's home namespace that give a shared thing to one run.

Why: two runs against one cluster share what the manifest provisions -- the
pool namespaces, and the few cluster-wide objects of fixed name that a
destructive check installs (the API flood's FlowSchema ``clusterproof-flood``:
RBAC can name it only if the name is fixed). A claim is a Lease
``clusterproof-<kind>-<key>`` whose holder is a run id; creating it is the
claim (409: someone holds it). A claim whose run is dead (its run Lease
expired or gone, ``clusterproof.kube.liveness``) is taken over with a conditional
write, so two runs that both found it dead cannot both take it; only the run
whose write won then removes what the dead run left there (``on_dead_holder``).

A takeover patches the claim: its uid stays. So whoever drops a claim (its
holder, or a sweeper) proves it is still the claim it saw with the
resourceVersion as well, and a 409 means another run has it now: left in place.
"""
from __future__ import annotations

from typing import Callable

from kubernetes import client

from clusterproof.core import progress
from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import get_if_present, list_all, merge_patch, raw_request
from clusterproof.kube.liveness import LEASES, run_states
from clusterproof.kube.ownership import REPLACED, delete_owned

NAMESPACE_CLAIM = "clusterproof-claim-"    # a pool namespace
TURN = "clusterproof-turn-"                # a named cluster-wide object


def holder_of(claim: dict | None) -> str | None:
    return ((claim or {}).get("spec") or {}).get("holderIdentity") or None


class Claims:
    """The claims of one kind (``prefix``) in ``home``, taken for ``run_id``; ``say`` gets a line for
    each claim left in place because it is not this run's any more."""

    def __init__(self, api: client.ApiClient, home: str, run_id: str, prefix: str,
                 say: Callable[[str], None] = progress.say):
        self.api, self.home, self.run_id, self.prefix, self.say = api, home, run_id, prefix, say

    @property
    def collection(self) -> str:
        return f"{LEASES}/namespaces/{self.home}/leases"

    def path(self, key: str) -> str:
        return f"{self.collection}/{self.prefix}{key}"

    def where(self, key: str) -> str:
        return f"claim {self.home}/{self.prefix}{key}"

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
        holder = holder_of(current) or "?"
        if holder == self.run_id:
            return None
        if alive.get(holder, False):
            return holder
        if not self.take_over(key, current):
            return f"{holder} (taken over by another run just now)"
        # After the write, not before: only the run that won removes what the dead holder left. Two takers
        # that both cleaned first raced each other, and the loser's clean-up (every Event of a pool
        # namespace) landed in the winner's work.
        try:
            on_dead_holder(holder)
        except BaseException:
            self.release(key)
            raise
        return None

    def take_over(self, key: str, seen: dict) -> bool:
        """Make this run the holder of the claim ``seen`` (as read or listed), only if nobody wrote it since:
        a merge patch carrying ``seen``'s resourceVersion. False if it changed or went in between."""
        try:
            merge_patch(self.api, self.path(key), {
                "metadata": {"resourceVersion": seen["metadata"]["resourceVersion"],
                             "labels": {RUN_LABEL: self.run_id}},
                "spec": {"holderIdentity": self.run_id}})
        except client.ApiException as e:
            if e.status in (404, 409):
                return False
            raise
        return True

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

    def release(self, key: str) -> bool:
        """Drop this run's claim, only if it is still this run's; True if it was dropped.

        The holder is read, and the DELETE carries the read's uid and resourceVersion: a takeover
        keeps the uid, so only the resourceVersion tells a claim another run took between the read
        and the delete (409: left in place, with a line)."""
        current = get_if_present(self.api, self.path(key))
        if current is None:
            return False
        holder = holder_of(current)
        if holder != self.run_id:
            self.say(f"{self.where(key)} is run {holder}'s now, not this run's: left in place")
            return False
        meta = current["metadata"]
        if delete_owned(self.api, self.path(key), meta["uid"], meta["resourceVersion"]) == REPLACED:
            self.say(f"{self.where(key)} was taken over by another run as this run dropped it: left in place")
            return False
        return True

    def lost(self, key: str) -> str | None:
        """Why this run may no longer count ``key`` as its own; None while it still holds it.

        Why, before a run removes by name what the claim gives it: a run that lost its Lease (stopped
        past it, exit 7) may have been swept, and its turn taken by a live run that made the same
        names again. Read on the server, as a sweeper judges: the claim's holder, and the run's Lease."""
        holder = holder_of(get_if_present(self.api, self.path(key)))
        if holder != self.run_id:
            return f"the {self.where(key)} is " + (f"run {holder}'s now" if holder else "gone")
        state = run_states(self.api, self.home).get(self.run_id)
        if state is None or not state.alive:
            lease = f"Lease in {self.home} is gone" if state is None else f"{state.why}: expired"
            return f"this run's {lease}, so a sweeper may give the {self.where(key)} to another run"
        return None

    def held_by(self) -> dict[str, str]:
        """{key: holder run} of every claim of this kind."""
        return {lease["metadata"]["name"][len(self.prefix):]: holder_of(lease) or "?"
                for lease in list_all(self.api, self.collection, {"labelSelector": RUN_LABEL})
                if lease["metadata"]["name"].startswith(self.prefix)}
