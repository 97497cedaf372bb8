"""The sweeper: what dead runs left on this cluster, removed only where the harness can prove it made it.

Why: a run killed with SIGKILL, a lost CI machine or a closed laptop cannot
clean up. The next run against the same cluster finds, in the harness's home
namespace, every run's Lease (``clusterproof.kube.liveness``), owner record
(``clusterproof.kube.ownership``) and pool claim (``clusterproof.kube.namespaces``). A run is
dead when its Lease has expired or is gone; for a dead run it removes

- every object its owner record names, uid for uid (DELETE with a uid
  precondition: a same-named object made since is not touched); a borrowed
  node in the record gets back exactly the taints the run recorded on it;
- the run's objects in every pool namespace it still claims, then the claim;
- its record and its Lease.

A claim changes hands in place (a takeover patches it and keeps its uid), so
the sweeper acts only on the claim as it listed it: a pool namespace's claim is
first taken over with a write conditional on the listed resourceVersion (the
sweeper empties only a namespace it holds, never one a live run took in the
meantime), and a turn's claim is deleted with the listed uid *and*
resourceVersion as preconditions. Either failing means another run has it now:
left in place, said in one line.

A live run's objects are never touched, whichever host it runs on. An object
that carries a dead run's label but is in no record (an older harness, a
hand-made copy, a bystander's namespace labelled by copy-paste) is reported,
never deleted: a label anyone can set proves nothing.

Order matters: records and claims are listed before the Leases. A run makes
its Lease before anything else and deletes it last, so a record or claim
without a Lease in the later list belongs to a run that is over.

On real hardware the sweeper asks first: it lists what it would remove and
removes it only with ``--cp-sweep-leftovers`` (or ``sweep_real_clusters: true``).
Every sweep is printed and attached to the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kubernetes import client

from clusterproof.core.run import RUN_LABEL, SCRATCH_LABEL
from clusterproof.kube.claims import NAMESPACE_CLAIM, TURN, Claims
from clusterproof.kube.client import delete_if_present, list_all
from clusterproof.kube.liveness import LEASE_PREFIX, LEASES, run_states
from clusterproof.kube.namespaces import empty
from clusterproof.kube.node_taints import records as taint_records
from clusterproof.kube.node_taints import release_run_taints
from clusterproof.kube.ownership import REPLACED, delete_owned, owned_objects, read_records, record_name

# Labelled objects the reader role may list, looked at for what no record proves (reported only).
UNPROVEN_KINDS = (
    ("namespaces", "/api/v1/namespaces"),
    ("flowschemas", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"),
    ("prioritylevelconfigurations", "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations"),
)


@dataclass
class Leftover:
    what: str                      # "namespaces/cp-...", "pool namespace clusterproof-3", "taints on nodes/y"
    run: str
    why: str                       # "lease ... renewed 700 s ago (duration 60 s)" / "no run Lease"
    remove: Callable[[], object]   # returns REPLACED if it is not the dead run's any more (left in place)

    def __str__(self) -> str:
        return f"{self.what} (run {self.run}: {self.why})"


@dataclass
class Sweep:
    found: list[Leftover] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)   # the identity may not remove these
    replaced: list[str] = field(default_factory=list)    # taken over or made again since listed: left in place
    unproven: list[str] = field(default_factory=list)    # labelled by a dead run, in no record: kept
    asked: bool = False            # found on real hardware without permission to remove

    def lines(self) -> list[str]:
        out = [f"kept (a dead run's label, but in no owner record; remove it by hand if it is yours): {x}"
               for x in self.unproven]
        if not self.found:
            return ["no leftovers of earlier runs"] + out
        if self.asked:
            return [f"would remove (pass --cp-sweep-leftovers to remove): {x}" for x in self.found] + out
        return [(f"could not remove (forbidden): {x}" if x.what in self.forbidden else
                 f"left in place (another run's now: taken over or made again since it was listed): {x}"
                 if x.what in self.replaced else f"removed: {x}") for x in self.found] + out


def _kind(path: str) -> str:
    """'/apis/g/v/namespaces/ns/pods/p' -> 'pods/p in ns'; '/api/v1/namespaces/x' -> 'namespaces/x'."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if len(rest) >= 4 and rest[0] == "namespaces":
        return f"{rest[2]}/{rest[3]} in {rest[1]}"
    return "/".join(rest)


def find_leftovers(api: client.ApiClient, current_run: str, home: str) -> tuple[list[Leftover], list[str]]:
    records = read_records(api, home)
    leases = f"{LEASES}/namespaces/{home}/leases"
    claims = [c for c in list_all(api, leases, {"labelSelector": RUN_LABEL})
              if c["metadata"]["name"].startswith((NAMESPACE_CLAIM, TURN))]
    states = run_states(api, home)                       # after the records and claims (see module doc)

    def why_dead(run: str) -> str | None:
        if not run or run == current_run:
            return None
        state = states.get(run)
        if state is None:
            return "no run Lease"
        return None if state.alive else state.why

    out: list[Leftover] = []
    recorded: set[str] = set()
    for run, rec in sorted(records.items()):
        recorded.update(rec.entries)
        why = why_dead(run)
        if not why:
            continue
        entries = owned_objects(api, run, rec)
        recorded.update(entries)
        for path, (uid, how) in sorted(entries.items()):
            if how == "borrowed":
                node = path.rsplit("/", 1)[1]
                out.append(Leftover(f"taints on nodes/{node}", run, why,
                                    lambda n=node, r=run: release_run_taints(api, n, r)))
            else:
                out.append(Leftover(_kind(path), run, why, lambda p=path, u=uid: delete_owned(api, p, u)))
    for claim in claims:
        run = (claim.get("spec") or {}).get("holderIdentity") or ""
        why = why_dead(run)
        if not why:
            continue
        name, meta = claim["metadata"]["name"], claim["metadata"]
        if name.startswith(NAMESPACE_CLAIM):
            ns = name[len(NAMESPACE_CLAIM):]
            out.append(Leftover(f"run's objects in pool namespace {ns}", run, why,
                                lambda ns=ns, run=run, seen=claim: _empty_claimed(api, home, current_run, ns, run,
                                                                                   seen)))
        else:   # a turn on a named object: the object itself is in the run's record
            out.append(Leftover(f"leases/{name}", run, why,
                                lambda p=f"{leases}/{name}", u=meta["uid"], v=meta["resourceVersion"]:
                                delete_owned(api, p, u, v)))
    for run in sorted(set(records) | {r for r in states}):
        why = why_dead(run)
        if not why:
            continue
        if run in records:
            out.append(Leftover(f"owner record configmaps/{record_name(run)}", run, why,
                                lambda r=run: delete_if_present(api, f"/api/v1/namespaces/{home}/configmaps/"
                                                                     f"{record_name(r)}")))
        if run in states:
            out.append(Leftover(f"leases/{LEASE_PREFIX}{run}", run, why,
                                lambda r=run: delete_if_present(api, f"{leases}/{LEASE_PREFIX}{r}")))
    return out, _unproven(api, why_dead, recorded, {x.run for x in out})


def _empty_claimed(api: client.ApiClient, home: str, current_run: str, ns: str, dead: str, seen: dict) -> str:
    """Empty pool namespace ``ns`` of the dead run's objects while the sweeping run holds its claim: taken
    over from the claim as listed (``seen``), dropped afterwards. REPLACED if another run took it first.

    Why hold it: emptying also removes the namespace's Events, which a live run that took the namespace
    between the listing and the clean-up would lose; and a claim deleted first could be taken by a run
    whose work the clean-up then hits."""
    pool = Claims(api, home, current_run, NAMESPACE_CLAIM)
    if not pool.take_over(ns, seen):
        return REPLACED
    try:
        empty(api, ns, lambda r: r == dead)
    finally:
        pool.release(ns)
    return "deleted"


def _unproven(api: client.ApiClient, why_dead: Callable[[str], str | None], recorded: set[str],
              swept_runs: set[str]) -> list[str]:
    """Objects labelled by a dead (or unknown) run that no record names: listed, never deleted."""
    out = []
    for kind, path in UNPROVEN_KINDS:
        for obj in list_all(api, path, {"labelSelector": RUN_LABEL}):
            meta = obj["metadata"]
            run = meta["labels"][RUN_LABEL]
            if f"{path}/{meta['name']}" not in recorded and why_dead(run) and not meta.get("deletionTimestamp"):
                out.append(f"{kind}/{meta['name']} (label {RUN_LABEL}={run})")
    for node in list_all(api, "/api/v1/nodes", {"labelSelector": SCRATCH_LABEL}):
        run = (node["metadata"].get("labels") or {}).get(RUN_LABEL, "")
        if f"/api/v1/nodes/{node['metadata']['name']}" not in recorded and why_dead(run):
            out.append(f"nodes/{node['metadata']['name']} (label {SCRATCH_LABEL}, run {run or '?'})")
    for node in list_all(api, "/api/v1/nodes"):
        for run in taint_records(node):
            if run not in swept_runs and why_dead(run):
                out.append(f"taints recorded on nodes/{node['metadata']['name']} by run {run} (no owner record "
                           "names the node)")
    return out


def sweep(api: client.ApiClient, current_run: str, home: str, remove: bool,
          say: Callable[[str], None]) -> Sweep:
    """Find leftovers; remove them if ``remove``, else only list them. Every one is said."""
    found, unproven = find_leftovers(api, current_run, home)
    result = Sweep(found, unproven=unproven, asked=not remove)
    for x in result.found:
        if not remove:
            continue
        try:
            if x.remove() == REPLACED:
                result.replaced.append(x.what)
            else:
                result.removed.append(x.what)
        except client.ApiException as e:
            if e.status != 403:
                raise
            result.forbidden.append(x.what)
    for line in result.lines():
        say(f"sweep: {line}")
    return result

