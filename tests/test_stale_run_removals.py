"""Nothing a run removes belongs to another run (issue 35, item 3).

Real requests against this session's cluster, no flood: the objects are made
directly, as the runs would make them.

- a stale run (stopped past its Lease, swept, resumed) reaches its ``finally``
  after a live run took its turn on the flood's fixed names and made the flow
  again: its removal leaves the live run's FlowSchema and level, and its claim;
- a sweeper that listed a dead run's claim before a live run took it over
  leaves the claim (a takeover keeps the uid: the resourceVersion tells), and
  the live run's work in a pool namespace with it;
- only the run whose takeover won cleans up after the dead holder;
- a run Lease another process holds now is not deleted by the run that lost it.

Each has its negative control: the removal as it was before (by name, or with
a uid precondition only) does remove the other run's object.
"""
from __future__ import annotations

import os

import pytest

from clusterproof.apf.overload import FLOW_NAME, FloodFlow, install_flow, remove_dead_flow
from clusterproof.core.run import metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube import claims as claims_module
from clusterproof.kube import sweep as sweep_module
from clusterproof.kube.access import HOME
from clusterproof.kube.claims import NAMESPACE_CLAIM, TURN, Claims, holder_of
from clusterproof.kube.client import delete_if_present, get_if_present, merge_patch, raw_request
from clusterproof.kube.flowcontrol import FLOW_SCHEMAS, PRIORITY_LEVELS
from clusterproof.kube.liveness import RunLease, wait_expired
from clusterproof.kube.namespaces import create_namespace
from clusterproof.kube.ownership import OwnerRecord, delete_owned
from tests.harness import run_leftovers

pytestmark = pytest.mark.cluster

FLOW = (f"{PRIORITY_LEVELS}/{FLOW_NAME}", f"{FLOW_SCHEMAS}/{FLOW_NAME}")


def _tag() -> str:
    return os.urandom(2).hex()


def _uid(api, path: str) -> str | None:
    obj = get_if_present(api, path)
    return obj["metadata"]["uid"] if obj else None


def _dead_claim(api, prefix: str, key: str) -> str:
    """A claim whose run is over: its holder has no run Lease (a sweeper judges it dead at once)."""
    dead = f"gone-{_tag()}"
    assert Claims(api, HOME, dead, prefix).try_take(key, {dead: True}) is None
    return dead


@pytest.fixture
def lines():
    return []


# --- a stale run's finally ------------------------------------------------------------------------

def test_a_stale_runs_flow_removal_leaves_the_flow_a_live_run_made_since(cluster, profile, lines):
    """Run A holds the turn and made the flow, then is stopped past its Lease; run B takes the turn
    (A's flow removed uid for uid from A's owner record) and makes the flow again. A resumes and
    removes its flow in its ``finally``: B's FlowSchema, level and claim stay."""
    api = cluster.api
    stale, live = f"stale-{_tag()}", f"live-{_tag()}"
    a_lease = RunLease(api, stale, HOME, duration_s=5).acquire()
    a_turn = Claims(api, HOME, stale, TURN, say=lines.append)
    b_lease, b_flow, b_turn = None, None, Claims(api, HOME, live, TURN, say=lines.append)
    a_record = OwnerRecord(api, HOME, stale).create()
    try:
        assert a_turn.try_take(FLOW_NAME, {stale: True}) is None
        a_claim = get_if_present(api, a_turn.path(FLOW_NAME))
        a_flow = install_flow(api, profile, stale, None, "default")
        for path, uid in a_flow.created:
            a_record.add(path, uid)
        a_made = list(a_flow.created)
        assert a_turn.lost(FLOW_NAME) is None, "a run that holds its turn and Lease counts as holding it"
        a_lease.abandon()                       # stopped (SIGSTOP) past its Lease
        wait_expired(api, stale, timeout=60, namespace=HOME)
        why = a_turn.lost(FLOW_NAME)
        assert why and "expired, so a sweeper may give the claim" in why, why

        b_lease = RunLease(api, live, HOME, duration_s=60).acquire()
        assert b_turn.try_take(FLOW_NAME, b_turn.alive(), lambda dead: remove_dead_flow(api, dead)) is None
        b_flow = install_flow(api, profile, live, None, "default")
        b_uids = {path: uid for path, uid in b_flow.created}
        b_claim = get_if_present(api, b_turn.path(FLOW_NAME))
        assert b_claim["metadata"]["uid"] == a_claim["metadata"]["uid"], "a takeover keeps the claim's uid"

        # A resumes: its finally, as _flooded runs it, then its turn's release.
        a_flow.remove(api, lambda: a_turn.lost(FLOW_NAME), lines.append)
        assert {p: _uid(api, p) for p in FLOW} == b_uids, "the stale run removed the live run's flow"
        assert any("the flood's flow is left in place" in ln and f"is run {live}'s now" in ln for ln in lines), lines
        # The uid preconditions alone hold too (a stale run that saw nothing of the loss).
        FloodFlow(FLOW_NAME, FLOW_NAME, "Limited", "", created=list(a_made)).remove(api, say=lines.append)
        assert {p: _uid(api, p) for p in FLOW} == b_uids, "a uid-conditional delete removed the live run's flow"
        assert sum("is another object now" in ln for ln in lines) == 2, lines
        assert not a_turn.release(FLOW_NAME)
        assert holder_of(get_if_present(api, b_turn.path(FLOW_NAME))) == live
        assert any(f"is run {live}'s now, not this run's: left in place" in ln for ln in lines), lines

        # Negative control: the removal before this change (DELETE by name) takes the live run's flow.
        for path, _uid_made in reversed(a_made):
            assert delete_if_present(api, path)
        assert all(_uid(api, p) is None for p in FLOW), "DELETE by name should have removed the live run's flow"
    finally:
        if b_flow is not None:
            b_flow.remove(api, say=lines.append)
        b_turn.release(FLOW_NAME)
        a_turn.release(FLOW_NAME)
        a_record.delete()
        for lease in (a_lease, b_lease):
            if lease is not None:
                lease.release()
    for run in (stale, live):
        assert not run_leftovers(api, run), run_leftovers(api, run)


def test_the_runs_own_flow_is_removed_although_the_apiserver_wrote_its_status(cluster, profile, lines):
    """Why the flow's DELETE carries the uid alone: the apiserver writes the FlowSchema's status after
    the create (its Dangling condition), so the resourceVersion the run saw is stale while the flow is
    still the run's. The rightful owner's removal must still remove it."""
    api = cluster.api
    rid = f"own-{_tag()}"
    lease = RunLease(api, rid, HOME, duration_s=60).acquire()
    turn = Claims(api, HOME, rid, TURN, say=lines.append)
    try:
        assert turn.try_take(FLOW_NAME, {rid: True}) is None
        flow = install_flow(api, profile, rid, None, "default")
        fs = wait_for(lambda: get_if_present(api, FLOW[1]), until=lambda o: (o.get("status") or {}).get("conditions"),
                      timeout=30, interval=0.2, what="the apiserver's status on the run's FlowSchema")
        assert {c["type"] for c in fs["status"]["conditions"]} >= {"Dangling"}, fs["status"]
        flow.remove(api, lambda: turn.lost(FLOW_NAME), lines.append)
        assert all(_uid(api, p) is None for p in FLOW), lines
        assert not lines, lines
    finally:
        turn.release(FLOW_NAME)
        lease.release()
    assert not run_leftovers(api, rid), run_leftovers(api, rid)


# --- a sweeper that listed a claim before a takeover -----------------------------------------------

def _event(api, ns: str, run_id: str) -> str:
    name = f"live-work-{_tag()}"
    raw_request(api, "POST", f"/api/v1/namespaces/{ns}/events", body={
        "metadata": metadata(name, run_id), "involvedObject": {"kind": "ConfigMap", "namespace": ns, "name": "work"},
        "reason": "SelfTest", "message": "the live run's work", "type": "Normal"}).data
    return f"/api/v1/namespaces/{ns}/events/{name}"


@pytest.mark.parametrize("prefix", [pytest.param(NAMESPACE_CLAIM, id="pool-namespace"),
                                    pytest.param(TURN, id="turn")])
def test_a_sweepers_claim_removal_after_a_takeover_leaves_the_new_holders_claim(cluster, prefix, monkeypatch, lines):
    """The sweeper lists a dead run's claim; a live run takes it over (a patch: same uid); then the
    sweeper removes what it listed. The claim stays the live run's, and for a pool namespace the live
    run's work there (an Event) stays too; the sweep says so in one line."""
    api = cluster.api
    sweeper, live = f"sweeper-{_tag()}", f"live-{_tag()}"
    key = f"cp-claimed-{_tag()}" if prefix == NAMESPACE_CLAIM else f"selftest-{_tag()}"
    if prefix == NAMESPACE_CLAIM:
        create_namespace(api, key)          # stands for a pool namespace the SRE provisioned
    leases = [RunLease(api, run, HOME, duration_s=60).acquire() for run in (sweeper, live)]
    mine = Claims(api, HOME, live, prefix, say=lines.append)
    try:
        dead = _dead_claim(api, prefix, key)
        found, _ = sweep_module.find_leftovers(api, sweeper, HOME)
        listed = [x for x in found if x.run == dead]
        assert len(listed) == 1, [str(x) for x in found]
        listed_claim = get_if_present(api, mine.path(key))

        assert mine.try_take(key, mine.alive()) is None
        taken = get_if_present(api, mine.path(key))
        assert taken["metadata"]["uid"] == listed_claim["metadata"]["uid"], "a takeover keeps the claim's uid"
        work = _event(api, key, live) if prefix == NAMESPACE_CLAIM else None

        monkeypatch.setattr(sweep_module, "find_leftovers", lambda *_a: (listed, []))
        result = sweep_module.sweep(api, sweeper, HOME, True, lines.append)
        assert result.replaced == [listed[0].what] and not result.removed, result
        assert f"sweep: left in place (another run's now: taken over or made again since it was listed): " \
               f"{listed[0]}" in lines, lines
        now = get_if_present(api, mine.path(key))
        assert holder_of(now) == live and now["metadata"]["resourceVersion"] == taken["metadata"]["resourceVersion"]
        if work:
            assert get_if_present(api, work) is not None, "the sweeper emptied a namespace a live run holds"

        # Negative controls, the sweeper before this change: the pool namespace emptied (its Events with it)
        # while the live run holds it, and the claim deleted with the listed uid as the only precondition.
        if work:
            sweep_module.empty(api, key, lambda run: run == dead)
            assert get_if_present(api, work) is None, "emptying the namespace should have taken the live run's Event"
        assert delete_owned(api, mine.path(key), listed_claim["metadata"]["uid"]) == "deleted"
        assert get_if_present(api, mine.path(key)) is None
    finally:
        delete_if_present(api, mine.path(key))
        if prefix == NAMESPACE_CLAIM:
            delete_if_present(api, f"/api/v1/namespaces/{key}")
        for lease in leases:
            lease.release()
    for run in (sweeper, live):
        assert not run_leftovers(api, run), run_leftovers(api, run)


def test_only_the_run_whose_takeover_won_cleans_up_after_the_dead_holder(cluster, monkeypatch):
    """Runs B and C both find a claim's holder dead; B's takeover lands between C's read and C's write.
    C's write fails, and C never runs its clean-up (which, for a pool namespace, removes every Event
    there -- B's work by then)."""
    api = cluster.api
    b, c, key = f"b-{_tag()}", f"c-{_tag()}", f"selftest-{_tag()}"
    dead = _dead_claim(api, TURN, key)
    cleaned: list[str] = []
    patch = claims_module.merge_patch

    def b_first(*args, **kwargs):
        monkeypatch.setattr(claims_module, "merge_patch", patch)
        assert Claims(api, HOME, b, TURN).try_take(key, {}, lambda run: cleaned.append(f"{b} after {run}")) is None
        return patch(*args, **kwargs)
    monkeypatch.setattr(claims_module, "merge_patch", b_first)
    try:
        assert Claims(api, HOME, c, TURN).try_take(key, {}, lambda run: cleaned.append(f"{c} after {run}")) == \
            f"{dead} (taken over by another run just now)"
        assert cleaned == [f"{b} after {dead}"], cleaned
        assert holder_of(get_if_present(api, Claims(api, HOME, b, TURN).path(key))) == b
    finally:
        delete_if_present(api, Claims(api, HOME, b, TURN).path(key))


def test_a_run_that_drops_its_claim_as_another_takes_it_over_leaves_it(cluster, monkeypatch, lines):
    """Run A (its Lease gone) reads its claim, still its own; run B takes it over before A's DELETE
    lands. The DELETE's resourceVersion is stale: B's claim stays. With the uid alone (the release
    before this change) it goes."""
    api = cluster.api
    b, key = f"b-{_tag()}", f"selftest-{_tag()}"
    a = _dead_claim(api, TURN, key)
    mine = Claims(api, HOME, b, TURN)
    read = claims_module.get_if_present
    seen = {}

    def b_takes_over_after_the_read(*args, **kwargs):
        monkeypatch.setattr(claims_module, "get_if_present", read)
        seen["claim"] = read(*args, **kwargs)
        assert mine.try_take(key, {}) is None
        return seen["claim"]
    monkeypatch.setattr(claims_module, "get_if_present", b_takes_over_after_the_read)
    try:
        assert not Claims(api, HOME, a, TURN, say=lines.append).release(key)
        assert holder_of(get_if_present(api, mine.path(key))) == b, "the run that lost its claim dropped B's"
        assert lines == [f"claim {HOME}/{TURN}{key} was taken over by another run as this run dropped it: "
                         "left in place"], lines
        assert delete_owned(api, mine.path(key), seen["claim"]["metadata"]["uid"]) == "deleted", \
            "negative control: the uid alone (a takeover keeps it) should have removed B's claim"
    finally:
        delete_if_present(api, mine.path(key))


def test_a_run_that_lost_its_pool_namespace_gives_it_back_without_emptying_it(cluster, lines):
    """Run A held a pool namespace, lost its Lease, and run B took the namespace over and works in it. A's
    give_back (its ``finally``) then empties nothing -- emptying removes every Event there, B's too -- and says
    why in one line. Negative control: emptying it as A did before removes B's work."""
    from clusterproof.kube.namespaces import NamespacePool
    api = cluster.api
    b, ns = f"b-{_tag()}", f"cp-pool-{_tag()}"
    create_namespace(api, ns)              # stands for a pool namespace the SRE provisioned
    a = _dead_claim(api, NAMESPACE_CLAIM, ns)
    lease = RunLease(api, b, HOME, duration_s=60).acquire()
    try:
        mine = Claims(api, HOME, b, NAMESPACE_CLAIM)
        assert mine.try_take(ns, mine.alive()) is None
        work = _event(api, ns, b)
        stale = NamespacePool(api, a, HOME, [ns], say=lines.append)
        stale.held.add(ns)
        stale.give_back(ns)
        assert get_if_present(api, work) is not None, "the run that lost the namespace emptied it of B's work"
        assert holder_of(get_if_present(api, mine.path(ns))) == b
        assert lines == [f"namespace {ns} left as it is: the claim {HOME}/{NAMESPACE_CLAIM}{ns} is run {b}'s now"], \
            lines
        assert not stale.held
        sweep_module.empty(api, ns, lambda run: run == a)
        assert get_if_present(api, work) is None, "negative control: emptying should have taken B's Event"
    finally:
        delete_if_present(api, Claims(api, HOME, b, NAMESPACE_CLAIM).path(ns))
        delete_if_present(api, f"/api/v1/namespaces/{ns}")
        lease.release()


# --- the run Lease itself -----------------------------------------------------------------------------

def test_a_run_lease_another_process_holds_now_is_not_released(cluster, lines, monkeypatch):
    """The same run id started twice: the second process holds the Lease now (the first lost it). The
    first one's release leaves it; the release before this change (DELETE by name) removed it."""
    api = cluster.api
    rid = f"twice-{_tag()}"
    monkeypatch.setattr("clusterproof.kube.liveness.progress.say", lines.append)
    lease = RunLease(api, rid, HOME, duration_s=60).acquire()
    lease.abandon()
    merge_patch(api, lease.path, {"spec": {"holderIdentity": f"elsewhere/1/{rid}"}})
    try:
        lease.release()
        assert holder_of(get_if_present(api, lease.path)) == f"elsewhere/1/{rid}", "the other process's Lease went"
        assert any("left in place" in ln for ln in lines), lines
        assert delete_if_present(api, lease.path), "negative control: DELETE by name removes it"
    finally:
        delete_if_present(api, lease.path)
    assert not run_leftovers(api, rid), run_leftovers(api, rid)



def test_a_review_the_run_asks_for_is_not_recorded_as_an_object_it_made(cluster):
    """A SelfSubjectReview is a create that stores nothing: recorded as pending, the run's end would LIST
    selfsubjectreviews to find it and get 405 (seen: a child run kept its Lease and record after it)."""
    from clusterproof.kube.apicalls import CallRecorder
    from clusterproof.kube.client import load_client
    from clusterproof.kube.ownership import owned_objects, read_records
    rid = f"review-{os.urandom(2).hex()}"
    api = load_client(str(cluster.kubeconfig), None)
    record = OwnerRecord(api, HOME, rid).create().attach(CallRecorder().install(api))
    try:
        raw_request(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                    body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).data
        rec = read_records(api, HOME)[rid]
        assert not rec.pending and not rec.entries, rec
        assert owned_objects(api, rid, rec) == {}
    finally:
        record.delete()
