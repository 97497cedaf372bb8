"""A cluster the harness did not make is judged fairly (issue 36).

Built the way a site builds one, by hand: kwokctl with its own defaults (the
default kube-scheduler and no Coscheduling, no feature gates, every component
as kwokctl's admin), told only to listen on loopback on free ports (this
machine's rule for anything it runs); GPU nodes labelled and tainted as a
site does (``example.io/pool``, ``example.io/team=<team>:NoSchedule``, a
preflight taint ``example.io/preflight``); a profile written by hand to
describe it. Then exactly what docs/real-cluster.md says: ``kubectl apply -f
clusterproof/kube/rbac.yaml``, a token kubeconfig of the ServiceAccount, every
suite with ``--cp-kubeconfig`` and ``--cp-profile``. What must hold:

- the harness is a guest there (its first line says so; namespaces come from
  the pool), although every node is a kwok node;
- nothing errors, and the one red is true of kwokctl's defaults: its
  components authenticate as ``system:masters``, which API Priority and
  Fairness exempts, so the classification check names ``exempt``;
- every skip is one line naming what the cluster lacks and the profile key,
  option or component that would enable it; no check asked for a permission
  the shipped roles lack;
- nothing the run labelled is left on the cluster.

Negative control: the site broken on purpose (a team node without its team
taint) is red on that cluster too, naming the node: the suites still judge
there, they do not only skip.

50 nodes, not a site's 200: every pool kind (two team pools, preflight,
shared) with several nodes is the shape the checks judge, and the shared
pool (36) holds base.yaml's burst load, so the profile loads without load
keys of its own; more nodes only cost kwok heartbeats on a 2-core machine
that runs three other workers. The
cluster lives in a cache of its own (``tests.harness.private_cache``), not
the harness's: it is no embedded cluster of the harness's (``kwok.embedded_here``
does not know it), and its own watchdog deletes it if this self-test is
killed; it is deleted at the module's end, also after a failure.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from clusterproof.cluster import backends, watchdog
from clusterproof.cluster.kwok import BIND_ADDRESS, PORTS, KwokCluster, embedded_here
from clusterproof.config.profile import profile_model
from clusterproof.core.errors import HarnessError
from clusterproof.core.ports import free_ports
from clusterproof.core.processes import claim_directory
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.fixtures import ALIASED
from clusterproof.kube import access
from clusterproof.kube.client import KWOK_ANNOTATION, get_if_present, list_raw, load_client, merge_patch, raw_request
from clusterproof.kube.nodes import is_ready
from clusterproof.provision import toolchain
from tests import guest
from tests.harness import ROOT, private_cache, run_leftovers, run_pytest

# The site: its own label and taint keys, the pools the profile's node plan names.
SITE = "example.io"
POOL_KEY, TEAM_KEY, PREFLIGHT_KEY = f"{SITE}/pool", f"{SITE}/team", f"{SITE}/preflight"
POOLS = {"team-research": 5, "team-applied": 5, "preflight": 4, "shared": 36}
CAPACITY = {"cpu": "96", "memory": "1800Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "7000Gi"}
PROFILE = {"nodes": sum(POOLS.values()), "pool_label": POOL_KEY, "teams": ["research", "applied"],
           "team_fraction": 0.2, "team_taint_key": TEAM_KEY, "preflight_fraction": 0.08,
           "preflight_taint_key": PREFLIGHT_KEY, "real_nodes": 0}
# True of kwokctl's defaults (module doc): the one red of the guest's run.
EXEMPT_CHECK = "test_system_components_are_classified_into_their_own_flow_schemas"
FLOW_SCHEMAS = ("system-node-high", "kube-scheduler", "kube-controller-manager")   # base.yaml's apf_* names
# The suites' windows, short: this run proves what a guest's run judges and skips, not a cluster's timing.
WINDOWS = ("taint_observe_s=3",)
# A skip names what would let the check run: a profile key, an option, or the embedded cluster.
OPTIONS = ("--cp-allow-destructive", "--cp-kubeconfig", "--cp-prometheus-url", "--cp-local-gpus")
OLD_OPTION = re.compile(r"(?<![\w-])--(" + "|".join(sorted(ALIASED, key=len, reverse=True)) + r")\b")


def _site_nodes() -> list[dict]:
    """The site's nodes, named, labelled and tainted its own way, registered for kwok to run (capacity in their
    status, kwok's annotation as kwok's docs give it)."""
    nodes = []
    for pool, count in POOLS.items():
        for _ in range(count):
            name = f"gpu-{len(nodes):03d}"
            labels, taints = {POOL_KEY: pool, "kubernetes.io/hostname": name}, []
            if pool.startswith("team-"):
                labels[TEAM_KEY] = pool.removeprefix("team-")
                taints.append({"key": TEAM_KEY, "value": labels[TEAM_KEY], "effect": "NoSchedule"})
            elif pool == "preflight":
                taints.append({"key": PREFLIGHT_KEY, "value": "pending", "effect": "NoSchedule"})
            nodes.append({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
                          "spec": {"taints": taints}, "status": {"capacity": CAPACITY, "allocatable": CAPACITY}})
    return nodes


def _kwokctl(cache: Path, *args: str, timeout: float) -> None:
    """kwokctl as a user runs it (the harness's built binaries, nothing downloaded), in ``cache``'s work dir."""
    k8s = toolchain.kubernetes(toolchain.KUBERNETES_VERSION)
    env = {**os.environ, "KWOK_WORKDIR": str(cache / "kwok"), "KWOK_KUBE_VERSION": toolchain.KUBERNETES_VERSION,
           "KWOK_KUBECTL_BINARY": str(k8s.path("kubectl"))}
    proc = subprocess.run([str(toolchain.KWOK.path("kwokctl")), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    assert proc.returncode == 0, f"kwokctl {' '.join(args[:2])}: {(proc.stderr + proc.stdout)[-2000:]}"


@contextlib.contextmanager
def foreign_cluster(work: Path):
    """A kwokctl cluster made by hand, its site nodes Ready; deleted afterwards (module doc)."""
    cache = private_cache(work)
    name = f"cp-site-{os.urandom(3).hex()}"
    kc = KwokCluster(name, 1, 40, root=cache / "kwok")
    k8s = toolchain.kubernetes(toolchain.KUBERNETES_VERSION)
    config = work / "site-kwokctl.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration",
                                      "options": {"bindAddress": BIND_ADDRESS,
                                                  **dict(zip(PORTS, free_ports(len(PORTS))))}}))
    claim_directory(kc.directory)
    watchdog.start(kc.directory, cache)
    try:
        _kwokctl(cache, "create", "cluster", "--name", name, "--runtime", "binary",
                 "--kube-apiserver-binary", str(k8s.path("kube-apiserver")),
                 "--kube-controller-manager-binary", str(k8s.path("kube-controller-manager")),
                 "--kube-scheduler-binary", str(k8s.path("kube-scheduler")),
                 "--kwok-controller-binary", str(toolchain.KWOK.path("kwok")),
                 "--etcd-binary", str(toolchain.ETCD.path("etcd")),
                 "--kubeconfig", str(kc.user_kubeconfig), "--config", str(config), "--wait", "300s", timeout=360)
        api = load_client(kc.kubeconfig)
        wait_for(lambda: get_if_present(api, "/api/v1/namespaces/default/serviceaccounts/default"), timeout=120,
                 interval=0.5, what="kube-controller-manager created the default ServiceAccount")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: raw_request(api, "POST", "/api/v1/nodes", body=n).data, _site_nodes()))
        wait_for(lambda: sum(map(is_ready, list_raw(api, "/api/v1/nodes")["items"])),
                 until=lambda n: n == sum(POOLS.values()), timeout=120, interval=1, what="the site's nodes Ready")
        yield SimpleNamespace(name=name, api=api, admin=kc.kubeconfig)
    finally:
        kc.delete()


def _preflight(kubeconfig: Path) -> str | None:
    """The harness's own permission preflight as the ServiceAccount: None once it passes."""
    try:
        access.check(load_client(kubeconfig), destructive=False)
        return None
    except HarnessError as e:
        return str(e)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site's cluster, set up by its admin as docs/real-cluster.md says, and the ServiceAccount's kubeconfig."""
    work = tmp_path_factory.mktemp("site")
    with foreign_cluster(work) as fc:
        kubectl = toolchain.kubernetes(toolchain.KUBERNETES_VERSION).path("kubectl")
        applied = subprocess.run([str(kubectl), "--kubeconfig", str(fc.admin), "apply", "-f",
                                  str(ROOT / "clusterproof" / "kube" / "rbac.yaml")],
                                 capture_output=True, text=True, timeout=120)
        assert applied.returncode == 0, applied.stderr
        fc.sa, _token = guest.kubeconfig_for(fc.api, work)
        # The authorizer reads RBAC from a cache: the run starts once the harness's own preflight passes.
        wait_for(lambda: _preflight(fc.sa), until=lambda why: why is None, timeout=60, interval=1,
                 what="the shipped manifest in effect for the ServiceAccount")
        fc.profile = work / "site.yaml"
        fc.profile.write_text(yaml.safe_dump(PROFILE))
        yield fc


def _run(site, tmp_path: Path, *args: str, timeout: float = 900):
    """The suites as the ServiceAccount; (run id, the run, {test: (outcome, message)})."""
    run_id = f"site-{os.urandom(2).hex()}"
    run = run_pytest([*args, "--cp-kubeconfig", str(site.sa), "--cp-profile", str(site.profile),
                      "--cp-run-id", run_id, *[f"--cp-set={s}" for s in WINDOWS]], tmp_path, timeout=timeout)
    return run_id, run, _outcomes(tmp_path / "junit.xml")


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """{test: (passed | skipped | xfailed | failed | error, message)} from a run's junit XML (a teardown error,
    written as a testcase of its own, wins over the pass before it). An xfail is a known upstream defect with its
    measured reason (junit files it as skipped, type pytest.xfail), not a mechanism the cluster lacks."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase") if junit.exists() else ():
        kind, el = next(((k, case.find(k)) for k in ("error", "failure", "skipped") if case.find(k) is not None),
                        ("passed", None))
        if kind == "skipped" and el.get("type") == "pytest.xfail":
            kind = "xfailed"
        if out.get(case.get("name"), ("passed",))[0] == "passed":
            out[case.get("name")] = ({"failure": "failed"}.get(kind, kind),
                                     "" if el is None else (el.get("message") or el.text or ""))
    return out


def _names_what_enables_it(reason: str) -> bool:
    """Does a skip's reason name a profile key, an option or the embedded cluster (what would let it run)?"""
    keys = [k for k in profile_model().model_fields if "_" in k]
    return any(k in reason for k in keys) or any(o in reason for o in OPTIONS) or "embedded cluster" in reason


def _labelled(api, run_id: str) -> list[str]:
    """Every object of any listable kind carrying the run's label (discovery, every group), and any label,
    annotation or taint of the harness's keys on a node (the site's nodes had none): what "nothing the run
    labelled is left" means, asked of the API server as its admin."""
    left = []
    groups = ["/api/v1"] + [f"/apis/{g['preferredVersion']['groupVersion']}"
                            for g in get_if_present(api, "/apis")["groups"]]
    for gv in groups:
        for r in (get_if_present(api, gv) or {}).get("resources", []):
            if "/" in r["name"] or "list" not in r.get("verbs", []):
                continue
            items = (get_if_present(api, f"{gv}/{r['name']}", {"labelSelector": f"{RUN_LABEL}={run_id}"})
                     or {}).get("items", [])
            left += [f"{r['name']}/{i['metadata'].get('namespace', '-')}/{i['metadata']['name']}" for i in items]
    for n in list_raw(api, "/api/v1/nodes")["items"]:
        meta = n["metadata"]
        keys = [*(meta.get("labels") or {}), *(meta.get("annotations") or {}),
                *(t["key"] for t in n["spec"].get("taints") or [])]
        left += [f"{k} on node {meta['name']}" for k in keys if "clusterproof.io/" in k]
    return left


# --- ownership: what makes a cluster the harness's own ---------------------------------------------

@pytest.mark.parametrize("found,as_real,owned", [
    pytest.param("cp-20990101-000000-abcd", False, True, id="embedded-here-as-admin"),
    pytest.param(None, False, False, id="anything-else"),
    pytest.param("cp-20990101-000000-abcd", True, False, id="as-real-cluster")])
@pytest.mark.unit
def test_only_an_embedded_cluster_reached_as_its_admin_is_owned(monkeypatch, found, as_real, owned):
    """Pure: the decision is ``kwok.embedded_here`` (its own checks are the server, the CA of a cluster directory
    of this machine's and an identity in system:masters), overridden by --cp-as-real-cluster."""
    monkeypatch.setattr(backends, "embedded_here", lambda api: found)
    got, why = backends.ownership(object(), as_real_cluster=as_real)
    assert got == owned and why.startswith("the harness's own embedded cluster" if owned else "a guest"), why


@pytest.mark.cluster
def test_a_cluster_made_by_hand_is_a_guest_even_reached_as_its_admin(site):
    """Its nodes are all kwok nodes, it runs on this machine, its admin is in system:masters: still a guest's."""
    for kubeconfig in (site.admin, site.sa):
        api = load_client(kubeconfig)
        assert embedded_here(api) is None
        owned, why = backends.ownership(api, as_real_cluster=False)
        assert not owned and why.startswith("a guest"), why


# --- every suite, as the ServiceAccount ------------------------------------------------------------

@pytest.fixture(scope="module")
def guest_run(site, tmp_path_factory):
    """Every suite, read-only, as the ServiceAccount."""
    run_id, run, outcomes = _run(site, tmp_path_factory.mktemp("guest-run"), "suites")
    return SimpleNamespace(run_id=run_id, run=run, outcomes=outcomes)


@pytest.mark.cluster
def test_the_harness_is_a_guest_working_in_the_pool(guest_run):
    out = guest_run.run.output
    assert "a guest: not an embedded cluster the harness started" in out and "namespace pool:" in out, out[-3000:]
    assert "every node a kwok node" in out, out[-3000:]


@pytest.mark.cluster
def test_the_one_red_is_kwokctls_admin_components_and_nothing_errors(guest_run):
    """kwokctl's components run as system:masters: APF exempts their traffic, and the classification check says so,
    naming each FlowSchema the profile expects and ``exempt``. Nothing else is red, and nothing is an error."""
    run, outcomes = guest_run.run, guest_run.outcomes
    assert outcomes, run.output[-3000:]
    red = {t: m for t, (o, m) in outcomes.items() if o in ("failed", "error")}
    shown = json.dumps({t: m.splitlines()[0] if m else "" for t, m in red.items()}, indent=1)
    assert set(red) == {EXEMPT_CHECK} and outcomes[EXEMPT_CHECK][0] == "failed", \
        f"exit {run.returncode}; red: {shown}\n" + run.output[-3000:]
    said = red[EXEMPT_CHECK]
    assert "system traffic is not classified where the profile expects it" in said, said
    assert all(f"FlowSchema {fs} dispatched no request" in said for fs in FLOW_SCHEMAS), said
    assert "exempt dispatched" in said and "system:masters" in said, said
    assert run.returncode == 1, run.output[-3000:]
    assert sum(o == "passed" for o, _ in outcomes.values()) >= 10, outcomes


@pytest.mark.cluster
def test_every_skip_is_one_line_naming_what_would_enable_the_check(guest_run):
    skips = {t: m for t, (o, m) in guest_run.outcomes.items() if o == "skipped"}
    assert skips, guest_run.outcomes
    bad = {t: m for t, m in skips.items() if not m.strip() or "\n" in m.strip() or not _names_what_enables_it(m)}
    assert not bad, f"skips that are not one line naming what would enable them: {json.dumps(bad, indent=1)}"
    old = {t: m for t, m in skips.items() if OLD_OPTION.search(m)}
    assert not old, f"skips naming an option by its deprecated name: {json.dumps(old, indent=1)}"
    assert "does not grant" not in guest_run.run.output, "a check asked for a permission the shipped roles lack"


@pytest.mark.cluster
def test_nothing_the_run_labelled_is_left_on_the_cluster(site, guest_run):
    left = run_leftovers(site.api, guest_run.run_id) + _labelled(site.api, guest_run.run_id)
    assert not left, f"left on the site's cluster by run {guest_run.run_id}: {sorted(set(left))}"


# --- negative control: the suites judge there, they do not only skip -------------------------------

@contextlib.contextmanager
def _untainted(api, node: str):
    """``node`` without its team taint for one run (as a site's mistake would leave it); put back afterwards."""
    path = f"/api/v1/nodes/{node}"
    kept = json.loads(raw_request(api, "GET", path).data)["spec"]["taints"]
    merge_patch(api, path, {"spec": {"taints": [t for t in kept if t["key"] != TEAM_KEY]}})
    try:
        yield
    finally:
        merge_patch(api, path, {"spec": {"taints": kept}})


@pytest.mark.cluster
def test_a_team_node_without_its_taint_is_red_there_naming_it(site, tmp_path):
    """The site broken on purpose: the shape check of that pool is red, naming the node and the taint; nothing
    else of the suite is."""
    node = next(n["metadata"]["name"] for n in list_raw(site.api, "/api/v1/nodes")["items"]
                if n["metadata"]["labels"].get(POOL_KEY) == "team-applied")
    with _untainted(site.api, node):
        _run_id, run, outcomes = _run(site, tmp_path, "suites/test_cluster_scale.py", timeout=300)
    red = {t: m for t, (o, m) in outcomes.items() if o in ("failed", "error")}
    check = "test_every_node_has_its_pool_labels_and_taints[team-applied]"
    assert set(red) == {check}, json.dumps({t: m[:300] for t, m in red.items()}, indent=1) + run.output[-2000:]
    assert f"{node}: missing taint {TEAM_KEY}=applied:NoSchedule" in red[check], red[check]
