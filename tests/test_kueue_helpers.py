"""Unit tests of Kueue and JobSet in the embedded cluster (clusterproof.cluster.kueue) and of the simulated
nodes' topology labels: pure, no cluster (the modules' own files are read from Go's module cache)."""
from __future__ import annotations

import base64

import pytest

from clusterproof.cluster import kueue
from clusterproof.cluster.node_plan import topology_labels
from clusterproof.config.profile import load_profile


@pytest.fixture(scope="module")
def dirs():
    return kueue.module_dirs()


@pytest.mark.cluster
def test_each_crd_keeps_only_its_storage_version_and_is_the_clusters(dirs):
    bodies = kueue.crds(dirs[kueue.KUEUE])
    names = {b["metadata"]["name"] for b in bodies}
    assert {"workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "topologies.kueue.x-k8s.io",
            "localqueues.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"} <= names
    for b in bodies:
        assert [v["name"] for v in b["spec"]["versions"]] == ["v1beta2"], b["metadata"]["name"]
        assert "conversion" not in b["spec"] and "status" not in b
        assert b["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "clusterproof"
    [jobset] = kueue.crds(dirs[kueue.JOBSET])
    assert jobset["metadata"]["name"] == "jobsets.jobset.x-k8s.io"


@pytest.mark.cluster
def test_webhooks_call_the_process_on_loopback_through_the_clusters_ca_and_only_in_managed_namespaces(dirs):
    got = kueue.webhook_configurations(dirs[kueue.KUEUE], "kueue", kueue.KUEUE_WEBHOOKS, 19443, b"CA PEM")
    assert [body["metadata"]["name"] for _, body in got] == ["clusterproof-kueue-mutating",
                                                             "clusterproof-kueue-validating"]
    hooks = {h["name"] + body["kind"][0]: h for _, body in got for h in body["webhooks"]}
    assert len(hooks) == len(kueue.KUEUE_WEBHOOKS)
    job = hooks["mjob.kb.ioM"]
    assert job["clientConfig"] == {"url": "https://127.0.0.1:19443/mutate-batch-v1-job",
                                   "caBundle": base64.b64encode(b"CA PEM").decode()}
    assert job["failurePolicy"] == "Fail"
    assert job["namespaceSelector"] == {"matchLabels": {kueue.MANAGED_LABEL: "true"}}
    assert "namespaceSelector" not in hooks["vclusterqueue.kb.ioV"]      # cluster-scoped: no namespace
    assert "namespaceSelector" in hooks["vworkload.kb.ioV"]
    assert not any("pod" in h["clientConfig"]["url"].rsplit("/", 1)[1].split("-") for h in hooks.values())


@pytest.mark.cluster
def test_a_webhook_the_module_does_not_ship_is_one_line(dirs):
    with pytest.raises(Exception, match=r"webhooks \['mnothing.kb.io'\] are not in"):
        kueue.webhook_configurations(dirs[kueue.JOBSET], "jobset", ("mnothing.kb.io",), 1, b"")


@pytest.mark.unit
def test_kueues_launcher_waits_for_its_crds_and_runs_it_with_an_etc_of_its_own(tmp_path):
    binary = tmp_path / "cache" / "kueue"
    script = kueue.launcher(binary, tmp_path / "c", private_etc=True, as_root=True)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[2] == f"while [ ! -e {tmp_path}/c/{kueue.READY_MARK} ]; do sleep 0.5; done"
    assert lines[3].startswith("exec unshare --mount --propagation private /bin/sh -c 'mount -n -t overlay overlay "
                               f"-o lowerdir=/etc,upperdir={tmp_path}/c/etc/kueue/upper,")
    assert lines[3].endswith(f"' {binary} \"$@\"")
    user = kueue.launcher(binary, tmp_path / "c", private_etc=True, as_root=False)
    assert "unshare --user --map-root-user --mount " in user
    plain = kueue.launcher(tmp_path / "jobset", tmp_path / "c", private_etc=False, as_root=True)
    assert plain.splitlines()[-1] == f'exec {tmp_path}/jobset "$@"'


@pytest.mark.unit
def test_kueues_configuration_turns_off_what_needs_a_container_and_scopes_it(tmp_path):
    ports = dict(zip(kueue.PORTS, range(1, 6)))
    cfg = kueue.kueue_config(tmp_path, ports, 50, 100, 30, 1, 10)
    assert cfg["leaderElection"] == {"leaderElect": False} and cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": str(tmp_path)}
    assert cfg["managedJobsNamespaceSelector"] == {"matchLabels": {kueue.MANAGED_LABEL: "true"}}
    assert cfg["waitForPodsReady"]["timeout"] == "30s"
    assert cfg["waitForPodsReady"]["requeuingStrategy"]["backoffMaxSeconds"] == 10
    assert "waitForPodsReady" not in kueue.kueue_config(tmp_path, ports, 50, 100, None, 1, 10)


@pytest.mark.unit
def test_consecutive_nodes_share_a_rack_and_consecutive_racks_a_block():
    p = load_profile("smoke", ["topology_nodes_per_rack=4", "topology_racks_per_block=2"])
    got = [topology_labels(p, i) for i in (0, 3, 4, 7, 8, 16)]
    rack, block = p.topology_rack_label, p.topology_block_label
    assert [(g[block], g[rack]) for g in got] == [("block-0", "rack-0"), ("block-0", "rack-0"), ("block-0", "rack-1"),
                                                  ("block-0", "rack-1"), ("block-1", "rack-2"), ("block-2", "rack-4")]
    assert topology_labels(load_profile("smoke", ["topology_nodes_per_rack=0"]), 5) == {}


@pytest.mark.cluster
def test_kueues_webhooks_are_found_by_their_configuration_with_policy_and_version(monkeypatch, dirs):
    """The read-only check's reading: webhooks of configurations named *kueue* that stand in front of creating
    a Job or JobSet, with the policy the API server applies (unset: Fail) and the chart's version label."""
    from clusterproof.gang import kueue_jobs as kq
    ca = b"-----BEGIN CERTIFICATE-----\n"
    shipped = {which: body for path, body in kueue.webhook_configurations(dirs[kueue.KUEUE], kueue.KUEUE,
                                                                           kueue.KUEUE_WEBHOOKS, 9443, ca, "Ignore")
               for which in ("mutating", "validating") if which in path}
    other = {"metadata": {"name": "jobset-mutating"}, "webhooks": [{"name": "mjobset.kb.io", "rules": [
        {"operations": ["CREATE"], "resources": ["jobsets"]}]}]}
    unset = {"metadata": {"name": "kueue-site"}, "webhooks": [
        {"name": "m.kb.io", "rules": [{"operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]},
        {"name": "u.kb.io", "rules": [{"operations": ["UPDATE"], "resources": ["jobsets"]}]}]}
    lists = {"mutating": [shipped["mutating"], other, unset], "validating": [shipped["validating"]]}
    monkeypatch.setattr(kq, "list_raw", lambda api, path: {"items": lists[
        "mutating" if "/mutating" in path else "validating"]})
    hooks = kq.kueue_webhooks(None)
    by_name = {(h.configuration, h.name): h for h in hooks}
    assert ("jobset-mutating", "mjobset.kb.io") not in by_name            # not a Kueue configuration
    assert ("kueue-site", "u.kb.io") not in by_name                       # not in front of creation
    assert by_name[("kueue-site", "m.kb.io")].failure_policy == "Fail"    # unset: the API server's default
    ours = by_name[("clusterproof-kueue-mutating", "mjobset.kb.io")]
    assert ours.failure_policy == "Ignore" and ours.version == "v0.17.0" and ours.resources == {"jobsets"}
    assert "failurePolicy Ignore" in ours.describe()


@pytest.mark.unit
def test_the_admission_benchs_cpu_window_names_each_process_and_how_busy_the_cores_were():
    from clusterproof.bench.kueue import MACHINE, cpu_window
    a = {"kueue": 10.0, "kube-apiserver": 100.0, "harness": 5.0, MACHINE: 1000.0, "_at": 50.0}
    b = {"kueue": 40.0, "kube-apiserver": 150.0, "harness": 6.0, "jobset": 2.0, MACHINE: 1090.0, "_at": 100.0}
    w = cpu_window(a, b, cpus=2)
    assert w == {"seconds": 50.0, "busy_share": 0.9,
                 "cpu_s_by_process": {"kube-apiserver": 50.0, "kueue": 30.0, "jobset": 2.0, "harness": 1.0}}
    assert list(w["cpu_s_by_process"]) == ["kube-apiserver", "kueue", "jobset", "harness"]   # largest first
