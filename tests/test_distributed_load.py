"""Load on locust's distributed mode, across hosts: the harness's master, workers in network namespaces.

The test makes its own two "hosts": network namespaces joined to this machine by veth pairs, with
addresses of their own (10.251.N.0/30 test ranges, nothing else is ever a target). The harness runs
locust's master on the host side, bound to the first pair's host address; a worker runs in each
namespace (``ip netns exec ... clusterproof load-worker``) and reaches the master through its veth, and
the session's embedded API server -- which listens on this machine's loopback only -- through a relay
into its namespace, the road a real node's kubelet takes (``clusterproof.cluster.noderelay``). The
namespaces, the links and the relays are removed whatever happens (a namespace left by a dead run is
removed by the next).

Proved against the embedded cluster:

- the burst is split across both workers (each created pods, by the pods' own creator label; the sum
  is the plan) and the figures are the master's aggregate;
- a worker killed mid-burst is reported (the master's record, the figures, a log line) and nothing
  is lost: the cluster lists every planned pod exactly once;
- a master expecting two workers of which only one starts fails with one line naming the missing one;
- the flood (load/flood.py) runs through the same master with a worker in a namespace.

Plus the pure parts (shares, the missing-workers line, the flood's merge, ``load-worker``'s bad input).
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

from clusterproof.burst.measure import clear_phase, run_phase
from clusterproof.burst.plan import CREATOR_LABEL, PHASE_LABEL, Phase
from clusterproof.core.errors import HarnessError
from clusterproof.core.locust import ROOT, Master, missing_workers_line, read_workers, run_locust
from clusterproof.core.ports import free_port
from clusterproof.core.processes import own_session_dying_with_parent, stop_group, unmount_under
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.kube.pods import list_pods
from clusterproof.kube.tokens import create_load_identity

NETNS_PREFIX = "cp-lw-"
NETNS_DIR = Path("/run/netns")


# --- pure ---------------------------------------------------------------------------------------

@pytest.mark.unit
def test_worker_shares_never_overlap_and_cover_the_phase():
    phase = Phase("burst", 3, 7, 0)
    for workers in (1, 2, 3, 5):
        shares = [phase.pod_names(workers, k) for k in range(workers)]
        names = [n for s in shares for n in s]
        assert sorted(names) == sorted(phase.pod_names()) and len(set(names)) == phase.pods
        assert all(shares), shares
    assert phase.pod_names(2, 7) == []          # a worker beyond the expected count has no share


@pytest.mark.unit
def test_missing_workers_line_names_the_missing_ones():
    m = Master(3, ("a", "b", "c"), "10.0.0.1", 5557, 30)
    line = missing_workers_line(m, [{"name": "b", "address": "10.0.0.7"}])
    assert "\n" not in line and "1 of 3 expected workers joined within 30 s; missing: a, c (joined: b from " \
        "10.0.0.7)" in line, line
    line = missing_workers_line(Master(2, wait_s=5), [])
    assert "0 of 2 expected workers joined within 5 s; missing: 2 unnamed worker(s) (joined: none)" in line, line


@pytest.mark.unit
def test_a_lost_flood_workers_share_is_named_and_left_unjudged():
    """The flood's merge (in a process of its own: the locustfile imports locust, which patches the
    interpreter): worker 1 of 2 lost, so every second name of each kind is its share, and only the
    survivor's counts are summed. The check then neither demands nor rejects those names."""
    code = (
        "import json, types\n"
        "from clusterproof.load.flood import merged\n"
        "opts = types.SimpleNamespace(flood_pods=12, flood_impatient_fraction=0.25)\n"
        "part = {k: {'created': 3, 'gave_up': [], 'responses': {'status 201': 3}, 'retry_after_s': {},\n"
        "            'last_create_s': 1.0} for k in ('honouring', 'impatient')}\n"
        "print(json.dumps(merged(opts, [part], ['b'], (1,), 2)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.splitlines()[-1])
    assert m["lost_workers"] == ["b"] and m["workers"] == 2, m
    assert m["honouring"]["lost_share"] == [f"honouring-{i:04d}" for i in range(1, 9, 2)], m["honouring"]
    assert m["impatient"]["lost_share"] == ["impatient-0001"], m["impatient"]   # 3 impatient of 12: 0, 1, 2
    assert m["honouring"]["created"] == 3 and m["honouring"]["planned"] == 9, m["honouring"]


# Run in a process of its own: importing locust monkey-patches this one (gevent).
REBALANCED_USER = """
import argparse
import tempfile

from locust.env import Environment

from clusterproof.load import workers
from clusterproof.load.kube_user import KubeApiUser


class WorkerRunner:      # workers.kind() reads the runner's class name, nothing else
    pass


token = tempfile.NamedTemporaryFile("w", suffix=".token", delete=False)
token.write("worker-token")
token.close()
opts = argparse.Namespace(kube_server="https://10.251.0.1:6443", kube_token_file=token.name, kube_ca_file="",
                          kube_ca_pem="", kube_tls_server_name="", cp_worker_name="host-b", kube_token_value="",
                          kube_max_retries=5)
env = Environment(parsed_options=opts, host="https://127.0.0.1:6443")
env.runner = WorkerRunner()
workers._Local.values = {k: getattr(opts, k) for k in workers.LOCAL_OPTIONS if getattr(opts, k)}
# A rebalance's spawn message: locust applies the master's arguments to this worker again.
opts.kube_server, opts.kube_token_file, opts.cp_worker_name = "", "/on/the/masters/host/token", ""
user = KubeApiUser(env)
print(user.host, user._headers["Authorization"], opts.cp_worker_name)
"""


@pytest.mark.cluster
def test_a_user_a_rebalance_spawns_keeps_the_workers_own_api_server_and_token():
    """Locust applies the master's arguments at every spawn message, and the master sends one again when a
    worker quits and its users move. Users made then must still use this worker's own ``--kube-*`` values:
    they once dialled the master's URL (127.0.0.1 inside a network namespace: "Connection refused" on the
    moved users' creates, the flake of the two-host test under parallel self-tests)."""
    p = subprocess.run([sys.executable, "-c", REBALANCED_USER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["https://10.251.0.1:6443", "Bearer", "worker-token", "host-b"], p.stdout


@pytest.mark.cluster
def test_load_worker_bad_input_is_one_line_and_exit_4():
    for args, expected in ((["--master", "nohost", "--locustfile", "burst"], "is not HOST:PORT"),
                           (["--master", "10.0.0.1:99999", "--locustfile", "burst"], "is not HOST:PORT"),
                           (["--master", "10.0.0.1:5557", "--locustfile", "burst", "--kube-token-file", "/nonexistent"],
                            "--kube-token-file /nonexistent: no such file"),
                           (["--master", "10.0.0.1:5557", "--locustfile", "burst", "--kube-server", "10.0.0.1:6443"],
                            "is not a URL")):
        p = subprocess.run([sys.executable, "-m", "clusterproof", "load-worker", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 4 and expected in p.stderr and len(p.stderr.strip().splitlines()) == 1, (
            args, p.returncode, p.stderr)


# --- test hosts: network namespaces -------------------------------------------------------------

@dataclass
class NetnsHost:
    netns: str
    host_ip: str       # this machine's end of the veth pair
    ip: str            # the namespace's end


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def _sweep_stale_namespaces() -> None:
    """Namespaces a dead run of this test left (its pid is in the name) are removed."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(rf"{NETNS_PREFIX}(\d+)-\d", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _ip("netns", "del", name, check=False)


def _free_blocks(count: int) -> list[int]:
    """``count`` third octets N whose 10.251.N.0/30 no address or route of this machine uses."""
    used = _ip("-o", "-4", "addr").stdout + _ip("-4", "route").stdout
    start = os.getpid() % 200
    blocks = [n for n in (*range(start, 250), *range(0, start)) if f"10.251.{n}." not in used]
    if len(blocks) < count:
        pytest.skip("no free 10.251.N.0/30 test range on this machine")
    return blocks[:count]


@pytest.fixture
def test_hosts():
    """Two network namespaces, each joined to this machine by a veth pair with addresses of its own; the second
    routes to the first pair's host address (where the master listens). Removed always."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    _sweep_stale_namespaces()
    hosts: list[NetnsHost] = []
    # `ip netns add` makes /run/netns (a mount of its own) the first time: the host is left without it if it was.
    made_run_netns = not NETNS_DIR.exists()
    try:
        for i, n in enumerate(_free_blocks(2)):
            ns, h, inner = f"{NETNS_PREFIX}{os.getpid()}-{i}", f"cplw{os.getpid() % 100000}h{i}", \
                f"cplw{os.getpid() % 100000}n{i}"
            host = NetnsHost(ns, f"10.251.{n}.1", f"10.251.{n}.2")
            _ip("netns", "add", ns)
            hosts.append(host)
            _ip("link", "add", h, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("addr", "add", f"{host.host_ip}/30", "dev", h)
            _ip("link", "set", h, "up")
            _ip("-n", ns, "addr", "add", f"{host.ip}/30", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        # The second host reaches the first pair's host address (the master's and the API server's) via its own.
        _ip("-n", hosts[1].netns, "route", "add", f"{hosts[0].host_ip}/32", "via", hosts[1].host_ip)
        yield hosts
    finally:
        for host in hosts:   # deleting a namespace deletes its veth end, and so the pair
            _ip("netns", "del", host.netns, check=False)
        if made_run_netns and NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()):
            unmount_under(NETNS_DIR)
            NETNS_DIR.rmdir()


class Workers:
    """``clusterproof load-worker`` processes in the test hosts' namespaces, and each namespace's relay to the API
    server; stopped always."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.relays = tmp, {}, {}

    def _relay(self, host: NetnsHost, port: int) -> None:
        """127.0.0.1:``port`` in ``host``'s namespace joined to the API server's on this machine's loopback."""
        if host.netns in self.relays:
            return
        log = open(self.tmp / f"relay-{host.netns}.log", "w")
        self.relays[host.netns] = subprocess.Popen(
            [sys.executable, "-S", str(ROOT / "clusterproof" / "cluster" / "noderelay.py"),
             f"/run/netns/{host.netns}", str(port)], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, preexec_fn=own_session_dying_with_parent)
        log.close()
        wait_for(lambda: (self.tmp / f"relay-{host.netns}.log").read_text(), until=lambda t: "relay:" in t,
                 timeout=10, interval=0.1, what=f"the API relay into {host.netns} listening")

    def start(self, host: NetnsHost, name: str, master: str, api_url: str, locustfile: str = "burst") -> None:
        api = urlparse(api_url)
        self._relay(host, api.port)
        cmd = ["ip", "netns", "exec", host.netns, sys.executable, "-m", "clusterproof", "load-worker",
               "--master", master, "--locustfile", locustfile, "--name", name,
               # The API server as this namespace reaches it (its relay), its certificate checked for that name.
               "--kube-server", f"{api.scheme}://127.0.0.1:{api.port}", "--kube-tls-server-name", api.hostname]
        log = open(self.tmp / f"worker-{name}.log", "w")
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, preexec_fn=own_session_dying_with_parent,
                                            env={**os.environ, "PYTHONPATH": str(ROOT)})
        log.close()

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)

    def log(self, name: str) -> str:
        return (self.tmp / f"worker-{name}.log").read_text(errors="replace")[-1500:]

    def stop(self) -> None:
        for p in [*self.procs.values(), *self.relays.values()]:
            stop_group(p, grace_s=5)


@pytest.fixture
def workers(tmp_path):
    w = Workers(tmp_path)
    yield w
    w.stop()


def _profile(profile, hosts: list[NetnsHost], names: list[str], **more):
    port = free_port()
    return profile.model_copy(update={"burst_locust_workers": len(names), "burst_locust_worker_names": names,
                                      "burst_locust_processes": 1, "load_master_bind": hosts[0].host_ip,
                                      "load_master_port": port, "load_workers_wait_s": 60.0, "burst_users": 8,
                                      **more})


def _by_creator(api, ns: str, run_id: str, phase: Phase) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in list_pods(api, ns, f"{RUN_LABEL}={run_id},{PHASE_LABEL}={phase.name}").values():
        who = p["metadata"]["labels"].get(CREATOR_LABEL, "?")
        out[who] = out.get(who, 0) + 1
    return out


# --- against the embedded cluster ----------------------------------------------------------------

@pytest.mark.cluster
def test_burst_is_split_across_two_hosts_and_a_lost_worker_loses_nothing(cluster, profile, namespace, run_id,
                                                                         test_hosts, workers, tmp_path, caplog):
    """Two workers in two network namespaces; the harness's master. First the burst is split (each worker
    created pods, the sum is the plan, the master's aggregate counts them all); then the same workers serve
    the next run's master, and one is killed mid-burst: it is reported and every planned pod exists exactly
    once."""
    a, b = test_hosts
    p = _profile(profile, test_hosts, ["host-a", "host-b"])
    master = f"{a.host_ip}:{p.load_master_port}"
    host = cluster.api.configuration.host

    # 1. split: as fast as the users can
    split = Phase("split", 2, 10, 0)
    workers.start(a, "host-a", master, host)
    workers.start(b, "host-b", master, host)
    run = run_phase(cluster.api, p, split, namespace, run_id, tmp_path / "split")
    joined = {w["name"]: w for w in run.locust.workers}
    assert set(joined) == {"host-a", "host-b"} and all(w["state"] == "done" for w in joined.values()), (
        run.locust.workers, workers.log("host-a"), workers.log("host-b"))
    assert (joined["host-a"]["address"], joined["host-b"]["address"]) == (a.ip, b.ip), run.locust.workers
    by = _by_creator(cluster.api, namespace, run_id, split)
    assert set(by) == {"w0", "w1"} and all(v > 0 for v in by.values()) and sum(by.values()) == split.pods, by
    assert run.figures.pods_by_creator == by and run.figures.pods_in_cluster == split.pods, run.figures
    create = run.locust.stats["create pod"]
    assert create.requests == split.pods and create.failures == 0, (create, run.locust.failures)
    clear_phase(cluster.api, namespace, run_id, split)

    # 2. the same workers join the next run's master (a suite's phases are runs of their own); one of them
    # is killed mid-burst (a paced phase, so there is a "mid")
    lost = Phase("lost", 2, 12, 4.0)

    def kill_when_both_created():
        wait_for(lambda: _by_creator(cluster.api, namespace, run_id, lost),
                 until=lambda by: by.get("w0", 0) >= 2 and by.get("w1", 0) >= 2, timeout=120, interval=0.3,
                 what="both workers to create pods")
        workers.kill("host-b")
    killer = threading.Thread(target=kill_when_both_created, daemon=True)
    killer.start()
    with caplog.at_level(logging.INFO, logger="clusterproof"):
        run = run_phase(cluster.api, p, lost, namespace, run_id, tmp_path / "lost")
    killer.join(timeout=5)
    f = run.figures
    gone = [w for w in run.locust.workers if w["state"] == "lost"]
    assert [w["name"] for w in gone] == ["host-b"] and f.load_workers_lost == 1, (run.locust.workers, f)
    assert any("locust worker host-b" in r.getMessage() and "was lost" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records][-10:]
    assert f.pods_in_cluster == lost.pods and f.pods_missing_count == 0 and not f.pods_unplanned, f
    assert f.pods_seen == lost.pods and f.pods_running == lost.pods, f
    # The killed worker's share: what it made before it died, and the rest by the harness -- never a pod twice.
    k = gone[0]["index"]
    share = set(lost.pod_names(2, k))
    mine = {n for n, pod in list_pods(cluster.api, namespace, f"{RUN_LABEL}={run_id},{PHASE_LABEL}=lost").items()
            if pod["metadata"]["labels"].get(CREATOR_LABEL) in (f"w{k}", "harness")}
    assert mine == share and f.pods_by_creator.get("harness", 0) == f.pods_completed_by_harness > 0, (
        sorted(share - mine), sorted(mine - share), f)
    assert sum(f.pods_by_creator.values()) == lost.pods, f
    saved = json.loads(Path(f"{run.locust.csv_prefix}_workers.json").read_text())["workers"]
    assert [w["state"] for w in saved if w["name"] == "host-b"] == ["lost"], saved
    clear_phase(cluster.api, namespace, run_id, lost)


@pytest.mark.cluster
def test_master_names_the_worker_that_never_joined(cluster, profile, namespace, run_id, test_hosts, workers,
                                                   tmp_path):
    """Two workers expected, one started: the run fails within the wait with one line naming the missing one."""
    a, b = test_hosts
    p = _profile(profile, test_hosts, ["host-a", "host-b"], load_workers_wait_s=8.0)
    workers.start(b, "host-a", f"{a.host_ip}:{p.load_master_port}", cluster.api.configuration.host)
    t0 = time.monotonic()
    with pytest.raises(HarnessError) as e:
        run_phase(cluster.api, p, Phase("missing", 1, 4, 0), namespace, run_id, tmp_path)
    line = str(e.value)
    assert "\n" not in line and "1 of 2 expected workers joined within 8 s; missing: host-b (joined: host-a from " \
        f"{b.ip})" in line, line
    assert time.monotonic() - t0 < 60, "the master waited far longer than load_workers_wait_s"
    assert read_workers(tmp_path / "locust-missing")[0]["name"] == "host-a"


@pytest.mark.cluster
def test_flood_runs_through_the_master_with_a_worker_in_a_namespace(cluster, profile, namespace, run_id,
                                                                   test_hosts, workers, tmp_path):
    """load/flood.py in distributed mode: one worker in a namespace, the master's summary and aggregate."""
    a, _ = test_hosts
    port = free_port()
    ident = create_load_identity(cluster.api, namespace, run_id, tmp_path / "id")
    args = ["--kube-token-file", str(ident.token_file), "--flood-namespace", namespace, "--flood-run-id", run_id,
            "--flood-pods", "12", "--flood-seconds", "3", "--flood-impatient-fraction", "0.25"]
    if ident.ca_file:
        args += ["--kube-ca-file", ident.ca_file]
    workers.start(a, "flood-a", f"{a.host_ip}:{port}", cluster.api.configuration.host, "flood")
    result = run_locust("load/flood.py", cluster.api.configuration.host, 4, args, tmp_path / "flood", timeout_s=120,
                        master=Master(1, ("flood-a",), a.host_ip, port, 60))
    summary = json.loads(Path(f"{result.csv_prefix}_flood.json").read_text())
    assert summary["workers"] == 1 and summary["lost_workers"] == [], summary
    assert [(summary[k]["planned"], summary[k]["created"]) for k in ("honouring", "impatient")] == [(9, 9), (3, 3)], \
        (summary, workers.log("flood-a"))
    created = sum(s.requests - s.failures for n, s in result.stats.items() if n.startswith("create pod ("))
    assert created == 12, result.stats
    pods = list_pods(cluster.api, namespace, f"{RUN_LABEL}={run_id}")
    assert len([n for n in pods if n.startswith(("honouring-", "impatient-"))]) == 12, sorted(pods)
