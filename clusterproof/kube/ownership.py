"""Ownership a label cannot forge: the uids of what a run created, in a record only the harness writes.

Why: ``clusterproof.io/run=<id>`` is a label anyone can set. A sweeper that
deleted whatever carried it would delete a bystander's namespace that
someone labelled by copy-paste. So every object a run creates outside the
namespaces it holds (cluster-scoped objects, pods in a team's namespace) is
written, with its uid, into the run's owner record -- a ConfigMap
``clusterproof-run-<id>`` in the harness's home namespace, where nobody but the
harness's ServiceAccount (and cluster admins) may write. A later run's
sweeper deletes only what a dead run's record names, with a uid
precondition (a same-named object created since is not touched). An object
with the label but no record is reported, never deleted.

Objects inside a pool namespace the run claimed are covered by the claim
(``clusterproof.kube.namespaces``): the pool holds nothing but the harness's objects.

The record learns of creates from the request recorder
(``clusterproof.kube.apicalls``): no create site can forget it. Each create is written
*ahead*: before the request leaves, the record gets a pending entry -- the
collection and a random proof -- and the object carries that proof in its
annotation ``clusterproof.io/proof``; when the answer comes, the entry
becomes path and uid. A run killed between the server's create and its
answer (a SIGKILL mid-request, which no later write can cover) leaves a
pending entry, and the sweeper finds the object by its proof. A bystander
cannot copy a proof it cannot read (the record is in the home namespace).
"""
from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.kube.apicalls import Call, CallRecorder
from clusterproof.kube.client import create_if_absent, delete_if_present, list_all, merge_patch

RECORD_PREFIX = "clusterproof-run-"
# Creates that store nothing (the API answers and keeps no object): nothing to record or remove.
NOT_STORED = frozenset({"selfsubjectreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews",
                        "subjectaccessreviews", "localsubjectaccessreviews", "tokenreviews"})
PROOF = "clusterproof.io/proof"
PENDING = "pending."


def record_name(run_id: str) -> str:
    return f"{RECORD_PREFIX}{run_id}"


def object_path(call: Call, obj: dict) -> str:
    """The API path of the object a create made (from the create's collection URL and the answer's name)."""
    group = (f"/apis/{obj['apiVersion']}" if "/" in obj.get("apiVersion", "v1")
             else f"/api/{obj.get('apiVersion', 'v1')}")
    ns = f"/namespaces/{call.namespace}" if call.namespace else ""
    return f"{group}{ns}/{call.resource}/{obj['metadata']['name']}"


def _key(path: str) -> str:
    """A ConfigMap key for a path (keys allow [-._a-zA-Z0-9])."""
    return re.sub(r"[^-._a-zA-Z0-9]", ".", path.strip("/"))[:253]


class OwnerRecord:
    """The run's record: {object path: uid}, kept in its ConfigMap in the home namespace."""

    def __init__(self, api: client.ApiClient, namespace: str, run_id: str,
                 owned_namespaces: callable = lambda: set()):
        self.api, self.namespace, self.run_id = api, namespace, run_id
        self.owned_namespaces = owned_namespaces       # namespaces whose contents need no record
        self.path = f"/api/v1/namespaces/{namespace}/configmaps/{record_name(run_id)}"
        self._pending: dict[str, str] = {}
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.entries = 0

    def create(self) -> "OwnerRecord":
        create_if_absent(self.api, f"/api/v1/namespaces/{self.namespace}/configmaps",
                         {"metadata": metadata(record_name(self.run_id), self.run_id), "data": {}})
        return self

    def attach(self, recorder: CallRecorder) -> "OwnerRecord":
        recorder.before_create(self._before_create)
        recorder.on_create(self._on_create)
        return self

    def _recorded(self, call: Call) -> bool:
        """Is a create of ``call`` outside what the run holds (so the record must name it)?"""
        if call.subresource or call.resource in NOT_STORED:   # tokens, evictions, bindings, reviews: no object
            return False
        return not (call.namespace and (call.namespace == self.namespace
                                        or call.namespace in self.owned_namespaces()))

    def _before_create(self, call: Call, collection: str, body: dict) -> None:
        if not self._recorded(call):
            return
        proof = secrets.token_hex(16)
        meta = body.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), PROOF: proof}
        self._write({f"{PENDING}{proof}": json.dumps({"collection": collection, "proof": proof})})

    def _on_create(self, call: Call, obj: dict) -> None:
        if not self._recorded(call):
            return
        proof = (obj["metadata"].get("annotations") or {}).get(PROOF)
        path = object_path(call, obj)
        self._write({_key(path): json.dumps({"path": path, "uid": obj["metadata"]["uid"], "how": "created"}),
                     **({f"{PENDING}{proof}": None} if proof else {})})

    def add(self, path: str, uid: str, how: str = "created") -> None:
        """Record ``path`` -> ``uid`` (an object not created through the recorder, e.g. a node the run
        borrows); returns once it is written.

        ``how``: "created" (the sweeper deletes it) or "borrowed" (a node whose taints the run
        changed: the sweeper removes only the taints the run recorded on it)."""
        self._write({_key(path): json.dumps({"path": path, "uid": uid, "how": how})})

    def _write(self, entries: dict) -> None:
        """Merge ``entries`` (a value of None removes a key) into the record; returns once they are
        written. Concurrent writers share one PATCH: each waits for the write that carries its entries."""
        with self._pending_lock:
            self._pending.update(entries)
        with self._write_lock:
            with self._pending_lock:
                batch, self._pending = self._pending, {}
            if batch:
                merge_patch(self.api, self.path, {"data": batch})
                self.entries += len(batch)

    def delete(self) -> None:
        delete_if_present(self.api, self.path)


@dataclass
class Record:
    """One run's owner record: what it created (path -> (uid, how)), and creates it had sent when it
    stopped knowing more (proof -> collection)."""
    entries: dict[str, tuple[str, str]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)


def read_records(api: client.ApiClient, namespace: str) -> dict[str, Record]:
    """{run id: Record} of every owner record in ``namespace``."""
    out = {}
    for cm in list_all(api, f"/api/v1/namespaces/{namespace}/configmaps", {"labelSelector": RUN_LABEL}):
        name = cm["metadata"]["name"]
        if not name.startswith(RECORD_PREFIX):
            continue
        run = cm["metadata"]["labels"].get(RUN_LABEL, name[len(RECORD_PREFIX):])
        rec = out[run] = Record()
        for key, value in (cm.get("data") or {}).items():
            try:
                e = json.loads(value)
                if key.startswith(PENDING):
                    rec.pending[e["proof"]] = e["collection"]
                else:
                    rec.entries[e["path"]] = (e["uid"], e.get("how", "created"))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def owned_objects(api: client.ApiClient, run_id: str, rec: Record) -> dict[str, tuple[str, str]]:
    """Everything ``rec`` proves ``run_id`` made: its entries, and the objects of its pending creates
    found by their proof (listed by the run's label in each collection; a kind not served is skipped)."""
    out = dict(rec.entries)
    for collection in sorted(set(rec.pending.values())):
        try:
            items = list_all(api, collection, {"labelSelector": f"{RUN_LABEL}={run_id}"})
            for obj in items:
                proof = (obj["metadata"].get("annotations") or {}).get(PROOF)
                if proof in rec.pending:
                    out[f"{collection}/{obj['metadata']['name']}"] = (obj["metadata"]["uid"], "created")
        except client.ApiException as e:
            if e.status != 404:
                raise
    return out


REPLACED = "replaced"


def delete_owned(api: client.ApiClient, path: str, uid: str, resource_version: str = "") -> str:
    """Delete the object at ``path`` only if it is still the one with ``uid`` (and, given, still at
    ``resource_version``): 'deleted', 'gone' or ``REPLACED``.

    The resourceVersion is for objects that change hands in place, keeping their uid (a claim Lease
    taken over: ``clusterproof.kube.claims``). REPLACED is the apiserver's 409 on a failed
    precondition: not the object the caller saw any more, so it is not the caller's to remove."""
    pre = {"uid": uid, **({"resourceVersion": resource_version} if resource_version else {})}
    try:
        return "deleted" if delete_if_present(api, path, body={"preconditions": pre}) else "gone"
    except client.ApiException as e:
        if e.status == 409:
            return REPLACED
        raise


def is_recorded(api: client.ApiClient, namespace: str, run_id: str, path: str) -> bool:
    """Does ``run_id``'s owner record prove it made the object at ``path`` (by uid, or by a pending proof)?"""
    rec = read_records(api, namespace).get(run_id)
    return rec is not None and path in owned_objects(api, run_id, rec)
