"""Unit tests of the real nodes' pure helpers (no cluster, no kubelet, no containerd).

The node's GPU runtime (which containers ask for GPUs, what it adds to their
OCI spec, which runc calls it touches -- and, run as containerd runs it, that
every other call reaches runc unchanged), the configuration files a real node
is started with, the audit rules and the flow-schema count the
classification check reads, and the one line a host that cannot run real
nodes gets.
"""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clusterproof.cluster import gpu_runtime, nodehost, realnode_config, realnodes
from clusterproof.cluster.gpu_runtime import ASKS, FAULTS_TARGET, LIB_TARGET, bundle_of, inject, wants_gpus
from clusterproof.core.errors import HarnessError
from clusterproof.preflight.mock_nvml import FAULTS_ENV, MACHINE_ENV
from clusterproof.provision import hostpkgs

pytestmark = pytest.mark.unit

STATE = {"machine": "cp-real-0", "library": "/opt/mock/libnvidia-ml.so.1", "faults": "/c/rn/nvml-faults.json",
         "runc": "/usr/sbin/runc", "faults_env": FAULTS_ENV, "machine_env": MACHINE_ENV}


def spec(*env: str) -> dict:
    return {"ociVersion": "1.0.2", "process": {"args": ["/checker"], "env": ["PATH=/usr/bin", *env]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]}


def node(tmp_path: Path, index: int = 0) -> realnode_config.RealNode:
    return realnode_config.RealNode(name=f"cp-real-{index}", index=index, directory=tmp_path / "rn" / str(index),
                              address="172.31.4.1", pod_subnet="172.31.4.0/24", bridge="cpbdeadbeef",
                              veth="cpvdeadbeef",
                              cgroup_root=f"/clusterproof/cp-x/cp-real-{index}", kubelet_port=40001,
                              healthz_port=40002)


# --- the GPU runtime -------------------------------------------------------------------------------------

@pytest.mark.parametrize("env, wants", [
    pytest.param([f"{ASKS}=all"], True, id="all"),
    pytest.param([f"{ASKS}=0,1"], True, id="indices"),
    pytest.param([f"{ASKS}=GPU-1234"], True, id="uuid"),
    pytest.param([f"{ASKS}=void"], False, id="void"),
    pytest.param([f"{ASKS}=NONE"], False, id="none-any-case"),
    pytest.param([f"{ASKS}="], False, id="empty"),
    pytest.param([f"{ASKS}= "], False, id="blank"),
    pytest.param(["NVIDIA_DRIVER_CAPABILITIES=all"], False, id="other-nvidia-variable"),
    pytest.param([f"X_{ASKS}=all"], False, id="longer-name"),
    pytest.param([], False, id="no-env"),
])
def test_a_container_wants_gpus_only_when_its_env_names_devices(env, wants):
    assert wants_gpus(["HOME=/root", *env]) is wants


def test_a_gpu_container_gets_the_library_the_fault_file_and_its_machine():
    s = spec(f"{ASKS}=all")
    assert inject(s, STATE) is True
    lib, faults = s["mounts"][1:]
    assert lib == {"destination": LIB_TARGET, "type": "bind", "source": STATE["library"],
                   "options": ["rbind", "ro", "nosuid", "nodev"]}
    assert faults["destination"] == FAULTS_TARGET and faults["source"] == STATE["faults"]
    assert "ro" in faults["options"], "the container must not be able to change its node's faults"
    assert s["process"]["env"][-2:] == [f"{FAULTS_ENV}={FAULTS_TARGET}", f"{MACHINE_ENV}=cp-real-0"]
    assert s["mounts"][0]["destination"] == "/proc", "the spec's own mounts are kept, first"


def test_a_node_without_a_library_hands_in_no_library_but_still_its_machine():
    """The negative control "NVML missing": the checker finds no libnvidia-ml.so.1 in its container."""
    s = spec(f"{ASKS}=all")
    assert inject(s, {**STATE, "library": None}) is True
    assert LIB_TARGET not in [m["destination"] for m in s["mounts"]]
    assert FAULTS_TARGET in [m["destination"] for m in s["mounts"]]
    assert f"{MACHINE_ENV}=cp-real-0" in s["process"]["env"]


@pytest.mark.parametrize("env", [pytest.param([], id="no-gpus"), pytest.param([f"{ASKS}=void"], id="void")])
def test_a_container_that_asks_for_no_gpus_is_left_exactly_as_it_was(env):
    s = spec(*env)
    before = json.dumps(s, sort_keys=True)
    assert inject(s, STATE) is False
    assert json.dumps(s, sort_keys=True) == before


def test_a_spec_without_mounts_or_env_is_handled():
    s = {"process": {"env": [f"{ASKS}=all"]}}
    assert inject(s, STATE) and [m["destination"] for m in s["mounts"]] == [LIB_TARGET, FAULTS_TARGET]
    assert inject({"process": {}}, STATE) is False and inject({}, STATE) is False


@pytest.mark.parametrize("args, bundle", [
    pytest.param(["--root", "/r", "--log", "/l.json", "create", "--bundle", "/b/x", "--pid-file", "/p", "id1"],
                 "/b/x", id="create --bundle"),
    pytest.param(["create", "-b", "/b/y", "id1"], "/b/y", id="create -b"),
    pytest.param(["create", "--bundle=/b/z", "id1"], "/b/z", id="create --bundle="),
    pytest.param(["run", "--bundle", "/b/r", "id1"], "/b/r", id="run"),
    pytest.param(["--root", "/r", "start", "id1"], None, id="start"),
    pytest.param(["--root", "/r", "state", "id1"], None, id="state"),
    pytest.param(["--root", "/r", "kill", "id1", "9"], None, id="kill"),
    pytest.param(["--root", "/r", "delete", "--force", "id1"], None, id="delete"),
    pytest.param(["--version"], None, id="version"),
])
def test_only_create_and_run_have_a_bundle(args, bundle):
    assert bundle_of(args) == bundle


def test_create_without_a_bundle_flag_means_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bundle_of(["create", "id1"]) == str(tmp_path)


@pytest.fixture
def runtime(tmp_path):
    """The node's runtime script as containerd runs it, in front of a fake runc that records its argv."""
    record = tmp_path / "runc-argv.json"
    fake = tmp_path / "runc"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    fake.chmod(0o755)
    (tmp_path / "node").mkdir()
    script = gpu_runtime.write_wrapper(tmp_path / "node", "cp-real-0", STATE["library"], STATE["faults"], str(fake))
    bundle = tmp_path / "bundle"
    bundle.mkdir()

    def run(*args: str, spec_env=(f"{ASKS}=all",)) -> tuple[list[str], dict]:
        (bundle / "config.json").write_text(json.dumps(spec(*spec_env)))
        proc = subprocess.run([script, *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return json.loads(record.read_text()), json.loads((bundle / "config.json").read_text())
    return run, bundle


def test_the_runtime_rewrites_a_gpu_containers_spec_then_runs_runc_with_the_same_arguments(runtime):
    run, bundle = runtime
    args = ["--root", "/r", "create", "--bundle", str(bundle), "--pid-file", "/p", "id1"]
    argv, config = run(*args)
    assert argv == args
    assert LIB_TARGET in [m["destination"] for m in config["mounts"]]
    assert not (bundle / "config.json.tmp").exists()


@pytest.mark.parametrize("verb", ["start", "state"])
def test_the_runtime_passes_every_other_call_through_unchanged(runtime, verb):
    run, bundle = runtime
    argv, config = run("--root", "/r", verb, "id1")
    assert argv == ["--root", "/r", verb, "id1"]
    assert config == spec(f"{ASKS}=all"), f"runc {verb} must not touch any bundle"


def test_the_runtime_leaves_a_container_without_gpus_alone(runtime):
    run, bundle = runtime
    argv, config = run("create", "--bundle", str(bundle), "id1", spec_env=())
    assert argv == ["create", "--bundle", str(bundle), "id1"] and config == spec()


# --- a real node's configuration files --------------------------------------------------------------------

def test_containerd_is_confined_to_the_nodes_directory_and_runs_the_gpu_runtime(tmp_path):
    n = node(tmp_path)
    cfg = tomllib.loads(realnode_config.containerd_config(n, "registry.local/pause:3.10",
                                                          "/x/nvidia-container-runtime"))
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True, "without it runc cannot start a sandbox (NOTES.md)"
    assert cri["netns_mounts_under_state_dir"] is True, "network namespaces must live under the node's directory"
    assert cri["sandbox_image"] == "registry.local/pause:3.10"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["BinaryName"] == "/x/nvidia-container-runtime"
    assert runc["options"]["SystemdCgroup"] is False
    assert cfg["grpc"]["address"] == str(n.socket)
    d = str(n.directory)
    for path in (cfg["root"], cfg["state"], cfg["ttrpc"]["address"], runc["options"]["Root"], cri["cni"]["conf_dir"],
                 cfg["plugins"]["io.containerd.internal.v1.opt"]["path"]):
        assert path.startswith(d + "/"), f"{path} is outside the node's directory {d}"


def test_the_kubelet_runs_on_cgroup_v1_without_anonymous_access_and_registers_tainted(tmp_path):
    n = node(tmp_path)
    cfg = realnode_config.kubelet_config(n, tmp_path / "pki" / "ca.crt")
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["cgroupRoot"] == n.cgroup_root
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "pki" / "ca.crt")
    assert cfg["authorization"]["mode"] == "Webhook" and cfg["readOnlyPort"] == 0
    assert cfg["registerWithTaints"] == [realnode_config.REAL_NODE_TAINT]
    assert cfg["containerRuntimeEndpoint"] == f"unix://{n.socket}"
    assert (cfg["address"], cfg["port"], cfg["healthzPort"]) == (n.address, n.kubelet_port, n.healthz_port)
    assert cfg["nodeLeaseDurationSeconds"] == realnode_config.LEASE_DURATION_S
    assert cfg["podLogsDir"].startswith(str(n.directory) + "/")


def test_the_kubelet_changes_no_kernel_tunable_and_makes_no_iptables_chain(tmp_path):
    """It would set vm.overcommit_memory, kernel.panic... on the host, and hook KUBE-FIREWALL into INPUT/OUTPUT."""
    cfg = realnode_config.kubelet_config(node(tmp_path), tmp_path / "pki" / "ca.crt")
    assert cfg["protectKernelDefaults"] is True, "the kubelet must refuse to start rather than write a kernel tunable"
    assert cfg["makeIPTablesUtilChains"] is False, "the kubelet must make no iptables chain"


def test_the_bridge_is_no_gateway_and_the_pods_never_get_the_hosts_address(tmp_path):
    """A gateway bridge plugin turns net.ipv4.ip_forward on (containernetworking-plugins 1.1.1 bridge.go); .254
    is the host's end of the node's veth (nodehost.host_address)."""
    n = node(tmp_path)
    [bridge] = realnode_config.cni_config(n)["plugins"]
    assert bridge["bridge"] == n.bridge and bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert not bridge.get("isDefaultGateway"), "isDefaultGateway implies isGateway"
    [[r]] = bridge["ipam"]["ranges"]
    host_end = nodehost.host_address(ipaddress.ip_network(n.pod_subnet))
    assert (r["subnet"], r["rangeEnd"], host_end) == (n.pod_subnet, "172.31.4.253", "172.31.4.254")
    assert bridge["ipam"]["dataDir"].startswith(str(n.directory) + "/")


def test_a_nodes_socket_path_fits_a_unix_socket():
    """sun_path is 108 bytes: the deepest socket (the ttrpc one) of a node in a long-named cluster fits."""
    home = Path("/home/a-rather-long-user-name/.cache/clusterproof/kwok/clusters/cp-20261125-193726-c0a0")
    n = realnode_config.RealNode("cp-real-7", 7, home / realnodes.DIR / "7", "", "", "", "", "", 0, 0)
    assert len(f"{n.socket}.ttrpc".encode()) < 108


# --- audit rules and the flow schemas of a kubelet's responses -----------------------------------------

def test_audit_rules_log_only_the_named_nodes_heartbeats_at_metadata_level():
    assert realnode_config.audit_rules([]) == []
    lease, status = realnode_config.audit_rules(["cp-real-0", "cp-real-1"])
    for rule in (lease, status):
        assert rule["level"] == "Metadata" and sorted(rule["verbs"]) == ["patch", "update"]
        [res] = rule["resources"]
        assert res["resourceNames"] == ["cp-real-0", "cp-real-1"]
    assert lease["namespaces"] == ["kube-node-lease"]
    assert lease["resources"][0] == {"group": "coordination.k8s.io", "resources": ["leases"],
                                     "resourceNames": ["cp-real-0", "cp-real-1"]}
    assert status["resources"][0]["group"] == "" and status["resources"][0]["resources"] == ["nodes/status"]
    assert "namespaces" not in status, "nodes are cluster-scoped"


def test_flow_schema_uids_counts_each_responses_schema(tmp_path):
    h = realnodes.FLOW_SCHEMA_HEADER
    log = tmp_path / "kubelet.log"
    log.write_text("\n".join([
        'I1125 19:37:26.1 round_trippers.go:632] "Response" verb="PUT" url="https://127.0.0.1:1/..." status="200 OK"',
        f"    {h}: ",                                         # the API server's first seconds
        f"    {h}: 0b6e9c2f-aaaa",
        f"    {h}: 0b6e9c2f-aaaa",
        "    X-Kubernetes-Pf-Prioritylevel-Uid: 11111111-bbbb",   # a neighbour header, not counted
        f"    {h}: 7f00ed1e-cccc",
        f"I1125 19:37:27.0 kubelet.go:1] not a header line mentioning {h}: 99999999",
        "\udcff garbage",
    ]), errors="surrogateescape")
    assert realnodes.flow_schema_uids(log) == {realnodes.UNCLASSIFIED: 1, "0b6e9c2f-aaaa": 2, "7f00ed1e-cccc": 1}
    assert realnodes.flow_schema_uids(tmp_path / "absent.log") == {}


# --- a host that cannot run real nodes: one line -----------------------------------------------------------

def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


def test_a_host_run_without_root_is_told_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(HarnessError) as e:
        realnodes.require_host()
    msg = _one_line(e)
    assert "real_nodes needs root" in msg and "set real_nodes: 0" in msg, msg


def test_a_host_missing_a_cgroup_hierarchy_is_told_which(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for c in ("cpu", "cpuacct", "pids"):      # memory and cpuset not mounted
        (tmp_path / c).mkdir()
        (tmp_path / c / "cgroup.procs").write_text("")
    monkeypatch.setattr(realnodes, "CGROUP_V1", tmp_path)
    with pytest.raises(HarnessError) as e:
        realnodes.require_host()
    msg = _one_line(e)
    assert f"cgroup v1 hierarchies memory, cpuset mounted under {tmp_path}" in msg, msg
    assert "set real_nodes: 0" in msg, msg


def test_a_host_with_every_piece_passes(monkeypatch, tmp_path):
    """The control for the two above: the same checks, nothing missing, no error."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for c in ("cpu", "cpuacct", "memory", "pids", "cpuset"):
        (tmp_path / c).mkdir()
        (tmp_path / c / "cgroup.procs").write_text("")
    cni = tmp_path / "cni"
    cni.mkdir()
    for p in ("bridge", "host-local", "loopback"):
        (cni / p).touch()
    monkeypatch.setattr(realnodes, "CGROUP_V1", tmp_path)
    monkeypatch.setattr(realnodes, "CNI_BIN", cni)
    monkeypatch.setattr(hostpkgs, "installed", lambda: dict(hostpkgs.PACKAGES))
    if "overlay" not in Path("/proc/filesystems").read_text():
        pytest.skip("this host has no overlayfs")
    realnodes.require_host()


def test_a_pinned_package_at_another_version_is_named_with_both_versions(monkeypatch):
    have = {**hostpkgs.PACKAGES, "containerd": "1.7.24~ds1-1", "runc": None}
    monkeypatch.setattr(hostpkgs, "installed", lambda: have)
    with pytest.raises(HarnessError) as e:
        hostpkgs.require()
    msg = _one_line(e)
    assert f"containerd 1.7.24~ds1-1 (pinned {hostpkgs.PACKAGES['containerd']})" in msg, msg
    assert f"runc not installed (pinned {hostpkgs.PACKAGES['runc']})" in msg, msg
    assert "debootstrap" not in msg.split(":")[0], "a package at its pinned version is not named"
    assert f"containerd={hostpkgs.PACKAGES['containerd']}" in msg, "the line says how to fix it"
    monkeypatch.setattr(hostpkgs, "installed", lambda: dict(hostpkgs.PACKAGES))
    hostpkgs.require()


# --- what the real-node checks measure (clusterproof.cluster.realnode_measure) -----------------------------

def _beat(node: str, resource: str, at: str, user: str | None = None) -> dict:
    return {"objectRef": {"name": node, "resource": resource}, "stage": "ResponseComplete",
            "stageTimestamp": f"2026-11-25T10:00:{at}Z", "user": {"username": user or f"system:node:{node}"},
            "userAgent": "kubelet/v1.35.0"}


def test_heartbeats_are_read_from_the_audit_log_and_judged_per_node(tmp_path):
    from clusterproof.cluster import realnode_measure as rm
    audit = tmp_path / "audit.log"
    beats = [_beat("cp-real-0", "leases", s) for s in ("00", "10", "20", "55")] + [
        _beat("cp-real-1", "leases", "00"), _beat("cp-real-1", "nodes", "05", user="admin"),
        _beat("elsewhere", "leases", "00"), {**_beat("cp-real-0", "leases", "30"), "stage": "RequestReceived"}]
    audit.write_text("\n".join(json.dumps(b) for b in beats) + "\nnot json\n")
    names = ["cp-real-0", "cp-real-1"]
    events = rm.audited_heartbeats(audit, names)
    assert len(events) == 6 and not rm.renewals_audited(events, names)
    assert rm.renewals_audited(events, ["cp-real-0"])
    assert rm.audited_heartbeats(tmp_path / "absent.log", names) == []
    h = realnodes.FLOW_SCHEMA_HEADER
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "kubelet-cp-real-0.log").write_text(f"{h}: uid-high\n{h}: uid-high\n{h}: uid-exempt\n")
    out = rm.judge_heartbeats(names, events, {"uid-high": "system-node-high", "uid-exempt": "exempt"}, tmp_path)
    assert out.flows == {"cp-real-0": {"system-node-high": 2, "exempt": 1}, "cp-real-1": {}}
    assert list(out.leases) == ["cp-real-0"]
    lease = out.leases["cp-real-0"]
    assert (lease.count, lease.span_s, lease.gaps, out.longest_gap_s) == (4, 55.0, [10.0, 10.0, 35.0], 35.0)
    assert out.problems == [
        "node cp-real-0: 1 of its kubelet's requests were classified outside the node flows: exempt 1",
        "node cp-real-1: none of its kubelet's 0 responses was classified system-node-high (its flows: none)",
        "node cp-real-1: 1 heartbeats came from admin, not system:node:cp-real-1",
        "node cp-real-1: 1 Lease renewal(s) audited"]
    assert {f.name: f.value for f in out.gather()} == {"lease_longest_gap_s": 35.0, "problems": 4}
    assert rm.KubeletHeartbeats().longest_gap_s is None


def test_checker_rounds_are_timed_and_keep_their_problems():
    from types import SimpleNamespace

    from clusterproof.cluster.realnode_measure import CheckerRounds
    run = CheckerRounds()
    assert run.round_max_s is None
    r = run.timed(lambda: SimpleNamespace(problems=["node cp-real-0 was released"]))
    run.timed(lambda: SimpleNamespace(problems=[]))
    assert run.rounds[0] is r and len(run.seconds) == 2 and run.round_max_s == max(run.seconds)
    assert run.problems == ["node cp-real-0 was released"]
    assert [f.name for f in run.gather()] == ["round_max_s", "problems"]
