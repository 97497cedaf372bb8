"""Team taint isolation: what suites/test_taint_isolation.py runs against, set up and undone here (its
fixtures, ``clusterproof.fixtures.taints``, only call these).

Why a module: the suite checks behaviour (where pods land, what admission
did to them, what the scheduler said), and must not know how the admission
step came to exist. Here live, each undone at the end (also after Ctrl-C):

- the admission step (``clusterproof.taints.admission``): the harness's policies, the
  deliberately broken one of the negative control, or the cluster's own;
- the low-priority PriorityClass of borrowing pods;
- team namespaces, created and labelled by the run or named by the profile
  (and then only checked);
- the per-team placement table of every check (``Isolation.record_placement``), handed over as
  attachments (``clusterproof.core.attachment``).

What the cluster lacks for some checks (team namespaces on a cluster the
harness does not own, an admission step acting on team pods with
``team_admission: auto``, the low-priority class the cluster's borrowing pods
use) is kept as one line per mechanism (``Isolation.missing``): the checks
that need it are skipped with that line, the others still judge.
"""
from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import yaml
from kubernetes import client

from clusterproof.cluster.node_plan import node_plan
from clusterproof.core.attachment import CSV, YAML, Attach, Attachment
from clusterproof.core.errors import HarnessError
from clusterproof.core.keygroup import parse_team_namespaces
from clusterproof.core.run import metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube import placement
from clusterproof.kube.client import get_if_present, raw_request, server_url
from clusterproof.kube.ownership import delete_owned
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import delete_run_pods, list_pods
from clusterproof.taints import admission as adm
from clusterproof.taints.admission import CHECK_LABEL  # noqa: E402  (the label admission's probe pods carry too)

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
# Mechanisms a check may need that a cluster may lack (``Isolation.missing``).
TEAM_NAMESPACES, ADMISSION, LOW_PRIORITY = "team namespaces", "team admission", "low-priority class"


def check_pod(name: str, run_id: str, check: str, **spec) -> dict:
    """A pod of one check (``CHECK_LABEL=<check>``); ``spec`` as ``pod_spec.pod_body`` takes it."""
    return pod_body(name, run_id, labels={CHECK_LABEL: check}, **spec)


def check_pods(api: client.ApiClient, ns: str, check: str | None = None) -> dict[str, dict]:
    """The suite's pods in ``ns`` (of one check, or all), by name."""
    return list_pods(api, ns, f"{CHECK_LABEL}={check}" if check else CHECK_LABEL)


@dataclass
class Isolation:
    """What the checks run against: rules, admission step, team pools, low-priority class."""
    rules: adm.TeamRules
    admission: adm.Admission | None = None
    named: dict[str, str] = field(default_factory=dict)        # team -> existing namespace (profile)
    pool_of: dict[str, str] = field(default_factory=dict)      # node -> pool
    pools: list[str] = field(default_factory=list)             # column order of the placement table
    low_value: int | None = None
    error: str | None = None
    placement: dict[str, Counter] = field(default_factory=dict)  # every check's pods, for the summary
    created_priority_class: str = ""      # the uid of the low-priority class, if the run made it (else "")
    # What the cluster lacks, by mechanism (TEAM_NAMESPACES, ADMISSION, LOW_PRIORITY): one line each, saying
    # what is missing and which profile key or component enables it. The checks that need it are skipped.
    missing: dict[str, str] = field(default_factory=dict)

    def lacking(self, *needs: str) -> str | None:
        """The line of the first of ``needs`` the cluster lacks (None: it has them all)."""
        return next((self.missing[n] for n in needs if n in self.missing), None)

    def record_placement(self, api: client.ApiClient, pool_label: str, namespaces: list[str],
                         team_of: dict[str, str], title: str) -> list[Attachment]:
        """The per-team placement table of these namespaces' pods, for the check's page (counted into the module
        summary too)."""
        pod_list = [p for ns in namespaces for p in check_pods(api, ns).values()]
        if {p["spec"].get("nodeName") for p in pod_list} - set(self.pool_of) - {None}:
            self.pool_of.update({n: i.pool for n, i in placement.read_nodes(api, pool_label).items()})
        counts = placement.placement_counts(pod_list, self.pool_of, team_of, self.rules.low_priority_class)
        for row, c in counts.items():
            self.placement.setdefault(row, Counter()).update(c)
        teams = list(self.rules.teams)
        return [Attachment(f"placement: {title} (pods per team per node pool)",
                           placement.render_placement(counts, self.pools, teams)),
                Attachment(f"placement: {title} (csv)", placement.placement_csv(counts, self.pools, teams), CSV)]


def ensure_priority_class(api: client.ApiClient, name: str, value: int, run_id: str,
                          create: bool) -> tuple[int, str]:
    """(value, uid if the run created it else ""): the low-priority class, created by the run if ``create`` and
    absent. A fixed name two runs may share: it is removed only by the uid its creator saw (``undo``)."""
    pc = get_if_present(api, f"{PRIORITY_CLASSES}/{name}")
    if pc is not None:
        return int(pc["value"]), ""
    if not create:
        raise HarnessError(f"PriorityClass {name!r} (low_priority_class) does not exist on "
                           f"{server_url(api)}: name the class your cluster's borrowing pods use")
    made = json.loads(raw_request(api, "POST", PRIORITY_CLASSES, body={
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": metadata(name, run_id),
        "value": value, "globalDefault": False,
        # A borrower never takes capacity from anyone: it only fills idle nodes.
        "preemptionPolicy": "Never",
        "description": "clusterproof: low-priority pods that borrow idle team nodes"}).data)
    return value, made["metadata"]["uid"]


def check_named_namespace(api: client.ApiClient, rules: adm.TeamRules, team: str, ns: str) -> None:
    """A namespace the profile names for ``team`` must exist and carry the team label."""
    obj = get_if_present(api, f"/api/v1/namespaces/{ns}")
    if obj is None:
        raise HarnessError(f"namespace {ns} (team {team} in team_namespaces) does not exist")
    got = (obj["metadata"].get("labels") or {}).get(rules.namespace_label)
    if got != team:
        have = f"label {rules.namespace_label}={got}" if got is not None else f"no label {rules.namespace_label}"
        raise HarnessError(f"namespace {ns} (team {team} in team_namespaces) has {have}: admission decides a "
                           f"pod's team by that label; label it {rules.namespace_label}={team} or fix "
                           "team_namespaces")


def set_up(cluster, profile, run_id: str, say, attach: Attach) -> Isolation:
    """The admission step, the low-priority PriorityClass and the team pools; undone at the end.

    ``team_admission`` decides: the harness's policies (installed here,
    removed at the end, also after Ctrl-C), the deliberately broken
    wildcard policy (negative control only), or the cluster's own admission
    (nothing installed; the PriorityClass must then exist). ``auto`` installs
    the harness's policies only on a cluster the harness owns that serves
    MutatingAdmissionPolicy, and otherwise judges the cluster's own admission
    where one acts (``missing`` says so where none does). Mistakes (a team
    without nodes, a named namespace without the team label) are kept as one
    line (``error``) that every check fails with; interrupted, it undoes what
    it made. The policies it installs go to ``attach`` as installed.
    """
    api = cluster.api
    iso = Isolation(adm.TeamRules.from_profile(profile), named=parse_team_namespaces(profile.team_namespaces))
    kind = adm.resolve_admission(profile.team_admission, cluster.owned)
    auto = profile.team_admission == "auto"
    fallback = None
    try:
        if kind == "harness" and auto and adm.served_map_version(api) is None:
            fallback, kind = adm.not_served(api), "cluster"
        nodes = placement.read_nodes(api, profile.pool_label)
        iso.pool_of = {n: info.pool for n, info in nodes.items()}
        iso.pools = [p.name for p in node_plan(profile)] + ["scratch"]
        have = Counter(iso.pool_of.values())
        empty = [team for team in profile.teams if not have.get(f"team-{team}")]
        if empty:
            raise HarnessError(f"team {', '.join(empty)} has no nodes: no node on {server_url(api)} is "
                               f"labelled {profile.pool_label}=team-<team>; fix teams in the profile or label "
                               "the team's nodes")
        for team, ns in iso.named.items():
            check_named_namespace(api, iso.rules, team, ns)
        unnamed = [t for t in profile.teams if t not in iso.named]
        if unnamed and cluster.namespaces.kind == "pool":
            iso.missing[TEAM_NAMESPACES] = (
                f"team namespaces not named for {', '.join(unnamed)}: on a cluster the harness did not start it "
                "creates and labels no namespace; name each team's namespace (team_namespaces: "
                "[<team>=<namespace>]) and bind clusterproof-team there (python -m clusterproof.kube.access "
                "team-bindings --cp-profile ...)")
        if kind == "cluster":
            iso.admission = adm.Admission("cluster", f"the cluster's own admission at {server_url(api)} "
                                                     "(the harness installs nothing)")
            if auto and TEAM_NAMESPACES not in iso.missing and profile.teams:
                why = _no_admission(api, iso, profile, cluster.namespaces, run_id)
                if why:
                    iso.missing[ADMISSION] = (
                        (f"{fallback}, and no admission step of the cluster's own acts either ({why}): turn "
                         "MutatingAdmissionPolicy on, or set team_admission: cluster to judge the cluster as it is")
                        if fallback else
                        f"no team admission acts on this cluster ({why}); team_admission: auto judges the "
                        "cluster's own admission only where one acts: set team_admission: cluster to judge it "
                        "anyway")
        else:
            iso.admission = adm.install_admission(api, iso.rules, run_id, kind, tuple(iso.named.values()))
            attach(Attachment("admission policies installed",
                              yaml.safe_dump_all(iso.admission.manifests, sort_keys=False), YAML))
        try:
            iso.low_value, iso.created_priority_class = ensure_priority_class(
                api, profile.low_priority_class, profile.low_priority_value, run_id, create=kind != "cluster")
        except HarnessError as e:    # the cluster's own class is missing: only the checks that use it cannot run
            iso.missing[LOW_PRIORITY] = str(e)
        say(f"taint isolation: {iso.admission.description}; low-priority class {profile.low_priority_class} "
            + (f"(value {iso.low_value})" if iso.low_value is not None else "missing")
            + "".join(f"; no {what}: the checks that need it are skipped" for what in iso.missing))
    except HarnessError as e:
        iso.error = str(e)
    except BaseException:
        undo(api, iso, profile, cluster.namespaces)
        raise
    return iso


def _no_admission(api, iso: Isolation, profile, namespaces, run_id: str) -> str | None:
    """Why no admission step acts on the first team's pods (None: one does), asked of a namespace of that team:
    the one the profile names, or one the run makes (given a moment to reach the admission caches)."""
    team = profile.teams[0]
    if team in iso.named:
        return adm.absent(api, iso.rules, iso.named[team], team, run_id)
    ns = namespaces.take("adm-probe", {iso.rules.namespace_label: team})
    try:
        try:
            wait_for(lambda: adm.absent(api, iso.rules, ns, team, run_id), until=lambda why: why is None,
                     timeout=10, interval=0.5, what=f"an admission step acting on namespace {ns}")
            return None
        except AssertionError:
            return adm.absent(api, iso.rules, ns, team, run_id)
    finally:
        namespaces.give_back(ns)


def tear_down(cluster, iso: Isolation, profile, run_id: str, attach: Attach) -> None:
    """The module's end: the placement of every check's pods to ``attach``, then everything ``set_up`` made
    undone."""
    if iso.placement:
        attach(Attachment("placement of every check's pods (pods per team per node pool)",
                          placement.render_placement(iso.placement, iso.pools, list(profile.teams))))
    undo(cluster.api, iso, profile, cluster.namespaces, run_id)


def undo(api, iso: Isolation, profile, namespaces, run_id: str | None = None) -> None:
    """Remove what ``set_up`` installed. With ``run_id`` (the module's normal end, not an interrupt):
    wait until the deleted policies no longer act -- admission caches drop them asynchronously, and
    the next suite's pods in this run's namespaces (a per-node Service's pods tolerate every taint)
    were refused 0.3 s after the delete in a measured run."""
    try:
        if iso.admission is not None and run_id and iso.admission.objects and iso.error is None and profile.teams:
            remove_and_settle(api, iso, run_id, profile, namespaces)
    finally:
        if iso.admission is not None:
            iso.admission.remove(api)
        if iso.created_priority_class:   # another run's class of the same name, made since, is not this run's
            delete_owned(api, f"{PRIORITY_CLASSES}/{profile.low_priority_class}", iso.created_priority_class)


def remove_and_settle(api, iso: Isolation, run_id: str, profile, namespaces) -> None:
    """Delete the policies and wait until a dry-run pod in a namespace they bound is admitted untouched
    (the namespace made first, and seen acting, so "untouched" cannot mean "not matched yet")."""
    team, other = profile.teams[0], (profile.teams[1] if len(profile.teams) > 1 else None)
    ns = namespaces.take("adm-off", {iso.rules.namespace_label: team})
    try:
        wait_for(lambda: adm.admission_probe(api, iso.rules, ns, team, other, iso.admission.kind, run_id),
                 until=lambda why: why is None, timeout=30, interval=0.5,
                 what=f"admission acting on namespace {ns} before its removal")
        iso.admission.remove(api)
        wait_for(lambda: adm.admission_gone(api, iso.rules, ns, run_id), until=lambda why: why is None,
                 timeout=30, interval=0.2, what="the deleted team admission policies to stop acting")
    finally:
        namespaces.give_back(ns)


@contextmanager
def team_namespaces(cluster, isolation: Isolation, run_id: str, profile):
    """{team: namespace} for this test: created and labelled (deleted afterwards), or the profile's.

    Waits until the admission step acts on each one (a dry-run pod gets the
    team's toleration): policies and new namespaces reach the apiserver's
    admission caches asynchronously.
    """
    api, rules = cluster.api, isolation.rules
    created, out = [], {}
    try:
        for team in profile.teams:
            if team in isolation.named:
                out[team] = isolation.named[team]
                continue
            ns = cluster.namespaces.take(team[:30], {rules.namespace_label: team})
            created.append(ns)
            out[team] = ns
        kind = isolation.admission.kind
        for i, team in enumerate(profile.teams):
            other = profile.teams[(i + 1) % len(profile.teams)] if len(profile.teams) > 1 else None
            if kind == "cluster" and (out[team] not in created or ADMISSION in isolation.missing):
                continue    # nothing was just installed or made: the cluster's admission is as it is
            try:
                wait_for(lambda team=team, other=other:
                         adm.admission_probe(api, rules, out[team], team, other, kind, run_id),
                         until=lambda why: why is None, timeout=30, interval=0.5,
                         what=f"admission acting on namespace {out[team]} (team {team})")
            except AssertionError as e:
                if kind != "cluster":
                    raise HarnessError(f"the harness's admission policies did not take effect: {e}") from None
        yield out
    finally:
        for ns in created:
            cluster.namespaces.give_back(ns)
        for _team, ns in out.items():
            if ns not in created:
                delete_run_pods(api, ns, run_id)
