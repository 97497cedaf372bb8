"""The host is left as the run found it, and a run listens on loopback only.

A run with a real node (the smoke profile, ``real_nodes=1``, one check of
``suites/test_real_nodes.py`` that runs a container: sandbox, CNI, bridge) is
started as a user types it, once ending normally and once SIGKILLed while its
container runs (then its watchdog, ``clusterproof.cluster.watchdog``, must clean
up within seconds, no later run needed). Before and after, this machine's state
is recorded; any difference fails the check, each named:

- sysctls: the six the kubelet writes unless ``protectKernelDefaults``
  (NOTES.md), ``net.ipv4.ip_forward`` (the bridge plugin's ``isGateway``),
  IPv6 forwarding, every ``net.ipv4.conf.{all,default}.*`` and ``net.bridge.*``;
- iptables (``iptables-save``/``ip6tables-save``, ``nft list ruleset``, each if
  installed; the check says which are not);
- network links; mounts (``/proc/self/mountinfo``); ``/run`` entries (top level,
  and below the runtime's own directories); cgroups (each hierarchy's top level,
  and all of ``/sys/fs/cgroup/*/clusterproof``); ``/var/log/{containers,pods}``;
- processes the run started that outlive it, and sockets they listen on.

While the run is up, every socket its processes listen on in this host's network
namespace -- the one other machines reach -- must be on loopback (``ss -ltnup``;
the lines are printed, with those of a real node's own network namespace, which
are shown and not judged).

What a run started is told apart from the rest of the machine by ancestry (the
run's pytest and its children), by its cluster's directory or name on a command
line (kwokctl's components, the watchdog), and by its real nodes' cgroups: a
sampler follows them while the run lives. The global state (sysctls, iptables,
links, mounts, /run, cgroups) cannot be told apart so: another run's real node
beside this one changes it too. So this module runs alone: ``./proof test``
runs it in a step of its own after the self-tests' parallel step (which ignores
it), and on an xdist worker it is skipped, saying why.

Negative control: a stand-in "run" that flips a sysctl, leaves a process
listening on every address, a link, a mount, a /run entry and a cgroup (and an
iptables chain where iptables is installed) is caught, each by name -- then
everything it changed is put back.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from clusterproof.cluster import realnodes, watchdog
from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster
from clusterproof.core.ports import free_port
from clusterproof.core.waiting import wait_for
from clusterproof.provision import toolchain
from tests.harness import background_pytest, ended_early, private_cache

pytestmark = [pytest.mark.host,
              pytest.mark.skipif(bool(os.environ.get("PYTEST_XDIST_WORKER")),
                                 reason="the host's global state is compared: this module runs alone, not beside "
                                        "other workers' real nodes (./proof test runs it in a step of its own)")]
SUITE = "suites/test_real_nodes.py"
CHECK = "noexecute_taint"            # one check that runs a container on the real node
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
           "net.ipv6.conf.all.forwarding")
SYSCTL_TREES = ("net.ipv4.conf.all", "net.ipv4.conf.default", "net.bridge")
RUNTIME_DIRS = ("containerd", "netns", "runc", "cni", "kubernetes", "kubelet")   # /run/<dir>: walked whole
LOG_DIRS = (Path("/var/log/containers"), Path("/var/log/pods"))
CGROUP = Path("/sys/fs/cgroup")
SAMPLE_S = 1.0
WATCHDOG_BOUND_S = 120               # a bound, not a figure: the watchdog's reaction is measured and printed


# --- the machine's state --------------------------------------------------------------------------------------

def _sysctl(name: str) -> str | None:
    try:
        return " ".join(Path("/proc/sys", *name.split(".")).read_text().split())
    except OSError:
        return None


def sysctls() -> dict[str, str]:
    out = {k: v for k in SYSCTLS if (v := _sysctl(k)) is not None}
    for tree in SYSCTL_TREES:
        base = Path("/proc/sys", *tree.split("."))
        for f in sorted(base.iterdir()) if base.is_dir() else []:
            if f.is_file() and (v := _sysctl(f"{tree}.{f.name}")) is not None:
                out[f"{tree}.{f.name}"] = v
    return out


def firewall() -> dict[str, set[str]]:
    """Rules and chains per tool (counters and comments dropped); a tool that is not installed is absent."""
    out = {}
    for tool, cmd in (("iptables-save", ["iptables-save"]), ("ip6tables-save", ["ip6tables-save"]),
                      ("nft", ["nft", "list", "ruleset"])):
        if shutil.which(cmd[0]) is None:
            continue
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        out[tool] = {re.sub(r"\[\d+:\d+\]", "", ln).strip() for ln in proc.stdout.splitlines()
                     if ln.strip() and not ln.startswith("#")}
    return out


def listeners(netns_of: int | None = None) -> list[dict]:
    """Every listening TCP and bound UDP socket of this network namespace (or of process ``netns_of``'s), as
    ``ss -Hltnup`` prints it."""
    enter = ["nsenter", f"--net=/proc/{netns_of}/ns/net"] if netns_of else []
    proc = subprocess.run([*enter, "ss", "-Hltnup"], capture_output=True, text=True, timeout=30)
    out = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        users = re.findall(r'\("([^"]*)",pid=(\d+)', line)
        out.append({"proto": parts[0], "local": parts[4], "pids": {int(p) for _, p in users},
                    "names": sorted({n for n, _ in users}), "line": " ".join(parts)})
    return out


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def on_loopback(local: str) -> bool:
    host = local.rsplit(":", 1)[0].strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False        # "*", or a name


def links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    return {m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", out, re.M)}


def mounts() -> set[str]:
    out = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        sep = f.index("-")
        out.add(f"{f[4]} ({f[sep + 1]} {f[sep + 2]})")
    return out


def _walk(base: Path, depth: int) -> set[str]:
    out = set()
    for top, dirs, files in os.walk(base, onerror=lambda e: None):
        if len(Path(top).relative_to(base).parts) >= depth:
            dirs[:] = []
        out |= {str(Path(top) / n) for n in [*dirs, *files]}
    return out


def run_entries() -> set[str]:
    run = Path("/run")
    out = {str(p) for p in run.iterdir()}
    for d in RUNTIME_DIRS:
        out |= _walk(run / d, 6)
    return out


def cgroups() -> set[str]:
    out = set()
    for h in sorted(CGROUP.iterdir()) if CGROUP.is_dir() else []:
        if not (h / "cgroup.procs").exists():
            continue
        out |= {str(p) for p in h.iterdir() if p.is_dir()}
        out |= {str(Path(top)) for top, _, _ in os.walk(h / "clusterproof", onerror=lambda e: None)}
    return out


def log_entries() -> set[str]:
    return {str(p) for d in LOG_DIRS if d.is_dir() for p in d.iterdir()}


@dataclass
class HostState:
    sysctls: dict[str, str]
    firewall: dict[str, set[str]]
    listeners: list[dict]
    links: set[str]
    mounts: set[str]
    run: set[str]
    cgroups: set[str]
    logs: set[str]

    @classmethod
    def record(cls) -> HostState:
        return cls(sysctls(), firewall(), listeners(), links(), mounts(), run_entries(), cgroups(), log_entries())


# A path of an embedded cluster (its directory, its real nodes' cgroups): one naming another cluster is that
# cluster's run's doing, not this run's (someone ran one beside this module after all).
CLUSTER_PATH = re.compile(r"(?:/clusterproof/|/kwok/clusters/)(cp-[\w.-]+)")


def _set_diff(kind: str, before: set[str], after: set[str], cluster: str, foreign: set[str]) -> list[str]:
    def ours(x: str) -> bool:
        return x not in foreign and all(m == cluster for m in CLUSTER_PATH.findall(x))
    return ([f"{kind} {x} appeared" for x in sorted(after - before) if ours(x)]
            + [f"{kind} {x} went away" for x in sorted(before - after) if ours(x)])


def foreign(state: HostState, cluster: str) -> set[str]:
    """What another embedded cluster on this machine holds and names nowhere in its path: its real nodes'
    links (their ``node.json``), and the ``clusterproof`` cgroup parent while its cgroups are in it."""
    out = set()
    for f in (toolchain.cache_root() / "kwok" / "clusters").glob(f"*/{realnodes.DIR}/*/{realnodes.STATE_FILE}"):
        if f.parts[-4] == cluster:
            continue
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out |= {v for k, v in st.items() if k in ("bridge", "veth") and isinstance(v, str)}
    for cg in state.cgroups:
        m = re.fullmatch(r"(.*/clusterproof)/(cp-[^/]+)", cg)
        if m and m.group(2) != cluster:
            out.add(m.group(1))
    return out


def differences(before: HostState, after: HostState, run: RunProcesses) -> list[str]:
    """Each way the host differs after the run from before it, one phrase each."""
    out, others = [], foreign(before, run.cluster) | foreign(after, run.cluster)
    for k in sorted(before.sysctls.keys() | after.sysctls.keys()):
        a, b = before.sysctls.get(k), after.sysctls.get(k)
        if a != b:
            out.append(f"sysctl {k} {a if a is not None else '(absent)'} -> {b if b is not None else '(absent)'}")
    for tool in sorted(before.firewall.keys() | after.firewall.keys()):
        out += _set_diff(f"{tool} rule", before.firewall.get(tool, set()), after.firewall.get(tool, set()),
                         run.cluster, others)
    old = {(s["proto"], s["local"]) for s in before.listeners}
    for s in after.listeners:
        if (s["proto"], s["local"]) not in old and (not s["pids"] or s["pids"] & run.pids()):
            out.append(f"listening socket {s['proto']} {s['local']} of {', '.join(s['names']) or 'no process'} "
                       "appeared")
    out += [f"process {p} still running" for p in run.alive()]
    for kind, a, b in (("link", before.links, after.links), ("mount", before.mounts, after.mounts),
                       ("/run entry", before.run, after.run), ("cgroup", before.cgroups, after.cgroups),
                       ("log entry", before.logs, after.logs)):
        out += _set_diff(kind, a, b, run.cluster, others)
    return out


def firewall_note(state: HostState) -> str:
    tools = ("iptables-save", "ip6tables-save", "nft")
    missing = [t for t in tools if t not in state.firewall]
    return (f"compared with {', '.join(t for t in tools if t in state.firewall) or 'nothing'}"
            + (f"; not installed (not compared): {', '.join(missing)}" if missing else ""))


# --- what the run started ------------------------------------------------------------------------------------

@dataclass
class RunProcesses:
    """The processes a run started, followed while it lives: descendants of its process, processes naming its
    cluster's directory or name, processes in its real nodes' cgroups; and the sockets they listen on."""
    root: int
    marks: tuple[str, ...]                # strings a command line or /proc/<pid>/cgroup of the run's holds
    seen: dict[tuple[int, float], str] = field(default_factory=dict)
    # (network namespace, proto, local) -> ss line; "" is this host's namespace, the only one other
    # machines can reach (a real node in a namespace of its own: its listeners are shown, not judged)
    heard: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self._thread = threading.Thread(target=self._loop, daemon=True, name="run process sampler")

    def start(self) -> RunProcesses:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def _marked(self, pid: int, cmdline: list[str]) -> bool:
        if any(m in a for a in cmdline for m in self.marks):
            return True
        try:
            cg = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        return any(f"/clusterproof/{m}/" in cg for m in self.marks if "/" not in m)

    def current(self) -> dict[tuple[int, float], str]:
        procs = {}
        children: dict[int, list[int]] = {}
        # Not process_iter(attrs): it sets .info on Process objects psutil shares between threads, and another
        # thread's process_iter(["cmdline"]) overwrote it under this sampler (KeyError 'ppid' in a gate run).
        for p in psutil.process_iter():
            try:
                info = p.as_dict(["ppid", "cmdline", "create_time", "name", "status"])
            except psutil.NoSuchProcess:
                continue
            if info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            procs[p.pid] = info
            children.setdefault(info["ppid"], []).append(p.pid)
        mine, todo = set(), [self.root]
        while todo:
            pid = todo.pop()
            if pid in mine:
                continue
            mine.add(pid)
            todo += children.get(pid, [])
        mine |= {pid for pid, info in procs.items() if self._marked(pid, info["cmdline"] or [])}
        return {(pid, procs[pid]["create_time"]): f"{pid} ({procs[pid]['name']}: "
                f"{' '.join(procs[pid]['cmdline'] or [])[:120]})" for pid in mine if pid in procs}

    def sample(self) -> None:
        now = self.current()
        with self._lock:
            self.seen.update(now)
        pids = {pid for pid, _ in now}
        host, others = _netns(os.getpid()), {}
        for pid in sorted(pids):
            ns = _netns(pid)
            if ns and ns != host:
                others.setdefault(ns, pid)
        for ns, pid in [("", None), *others.items()]:
            for s in listeners(pid):
                if s["pids"] & pids:
                    with self._lock:
                        self.heard[(ns, s["proto"], s["local"])] = s["line"]

    def pids(self) -> set[int]:
        with self._lock:
            return {pid for pid, _ in self.seen}

    def alive(self) -> list[str]:
        """The run's processes still running (seen while it lived, or marked as its own now)."""
        with self._lock:
            seen = dict(self.seen)
        seen.update(self.current())
        out = []
        for (pid, created), what in sorted(seen.items()):
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - created) < 1.0:
                    out.append(what)
            except psutil.NoSuchProcess:
                continue
        return out

    @property
    def cluster(self) -> str:
        return next(m for m in self.marks if "/" not in m)

    def heard_lines(self) -> list[str]:
        with self._lock:
            return sorted(f"{ns + ': ' if ns else ''}{line}" for (ns, _, _), line in self.heard.items())

    def beyond_loopback(self) -> list[str]:
        with self._lock:
            return sorted(line for (ns, _, local), line in self.heard.items() if not ns and not on_loopback(local))


# --- a run with a real node ----------------------------------------------------------------------------------

def _container_running(kc: KwokCluster, proc) -> bool:
    """A container (its shim) runs on the cluster's real node: sandbox, CNI and bridge are all in place."""
    ended_early(proc)
    for f in (kc.directory / realnodes.DIR).glob(f"*/{realnodes.STATE_FILE}"):
        try:
            if realnodes.shims_of(json.loads(f.read_text())["socket"]):
                return True
        except (OSError, ValueError, KeyError):
            continue
    return False


@pytest.mark.parametrize("end", ["ends", "sigkill"])
def test_a_run_with_a_real_node_leaves_the_host_as_it_found_it_and_listens_on_loopback(end, tmp_path):
    run_id = f"hs-{end[0]}-{os.urandom(2).hex()}"
    # A cache of its own, so that no other run sweeps the cluster (after SIGKILL, only its watchdog may), at a
    # short path: the real node's unix sockets live in the cluster's directory (at most 107 bytes).
    short = Path(tempfile.mkdtemp(prefix="cphs-", dir="/tmp"))
    cache = private_cache(short)
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40, root=cache / "kwok")
    before = HostState.record()
    run = None
    try:
        with background_pytest([SUITE, "--cp-profile", "smoke", "--cp-run-id", run_id, "--cp-set", "real_nodes=1",
                                "-k", CHECK], tmp_path, env={"CLUSTERPROOF_CACHE": str(cache)}) as proc:
            run = RunProcesses(proc.pid, (str(kc.directory), kc.name)).start()
            wait_for(lambda: _container_running(kc, proc), timeout=600, interval=0.5,
                     what=f"a container running on run {run_id}'s real node")
            dog = watchdog.running(kc.directory)
            assert dog is not None, f"cluster {kc.name} has no watchdog running"
            run.sample()
            if end == "sigkill":
                proc.kill()          # no teardown runs: the watchdog must clean up
                killed = time.monotonic()
                proc.wait(timeout=60)
            out, _ = proc.communicate(timeout=900)
        if end == "ends":
            assert proc.returncode == 0, out[-3000:]
        wait_for(lambda: kc.directory.exists() or psutil.pid_exists(dog["pid"]), until=lambda x: not x,
                 timeout=WATCHDOG_BOUND_S, interval=0.2,
                 what=f"cluster {kc.name} removed and its watchdog (pid {dog['pid']}) gone")
        if end == "sigkill":
            print(f"SIGKILL -> cluster {kc.name} removed by its watchdog in {time.monotonic() - killed:.1f} s")
        run.stop()
        after = HostState.record()
    finally:
        if run is not None:
            run.stop()
        kc.delete()
        if not kc.directory.exists():
            shutil.rmtree(short, ignore_errors=True)    # its links into the shared cache are removed, not followed
    problems = differences(before, after, run)
    wide = run.beyond_loopback()
    heard = run.heard_lines()
    print(f"firewall: {firewall_note(before)}; the run's listeners (ss -ltnup, its processes; net:[...]: in a network "
          "namespace of the run's own):\n" + "\n".join(heard))
    assert heard, f"no listening socket of run {run_id} was seen: the loopback check could not fail"
    assert not problems and not wide, (
        f"run {run_id} ({'ended normally' if end == 'ends' else 'SIGKILLed, cleaned by its watchdog'}) "
        + (f"left the host changed: {'; '.join(problems)}" if problems else "left the host as it found it")
        + (f"; while it ran it listened beyond loopback: {'; '.join(wide)}" if wide else ""))


# --- negative control ----------------------------------------------------------------------------------------

MARTIANS = "net.ipv4.conf.all.log_martians"
LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
STANDIN = """\
import os, socket, sys, time
d = sys.argv[1]
if os.fork() == 0:                       # a process that outlives the "run", listening on every address
    os.setsid()
    s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[2]))); s.listen(); os.set_inheritable(s.fileno(), True)
    os.execvp(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", d])
sys.stdin.read()                         # until the test has looked
"""


def test_the_host_check_names_each_change_a_run_leaves(tmp_path):
    """A stand-in run changes the host on purpose: the check must name each change (then all is put back)."""
    name = f"{NAME_PREFIX}hs-ctl-{os.urandom(2).hex()}"
    directory = tmp_path / "kwok" / "clusters" / name
    directory.mkdir(parents=True)
    link, rundir, mnt = f"cphs{os.urandom(4).hex()}", Path(f"/run/clusterproof-{name}"), tmp_path / "mnt"
    cgroup = CGROUP / "pids" / "clusterproof" / name
    chain = f"CP-HS-{os.urandom(2).hex().upper()}"
    martians, port = _sysctl(MARTIANS), free_port()
    before = HostState.record()
    # A chain only where the filter table is there already: iptables-nft would make the table (and leave it)
    iptables = shutil.which("iptables") is not None and "*filter" in before.firewall.get("iptables-save", set())
    proc = subprocess.Popen([sys.executable, "-c", STANDIN, str(directory), str(port)], stdin=subprocess.PIPE,
                            text=True)
    run = RunProcesses(proc.pid, (str(directory), name)).start()
    try:
        Path("/proc/sys/net/ipv4/conf/all/log_martians").write_text("0" if martians == "1" else "1")
        subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True, timeout=30)
        rundir.mkdir()
        cgroup.mkdir(parents=True)
        mnt.mkdir()
        # mount(2), not mount(8): util-linux would also leave /run/mount/utab behind
        if LIBC.mount(b"clusterproof-hs", str(mnt).encode(), b"tmpfs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {mnt}")
        if iptables:
            subprocess.run(["iptables", "-N", chain], check=True, timeout=30)
        wait_for(lambda: (run.sample(), run.heard)[1], timeout=30, interval=0.5,
                 what=f"the stand-in's socket on port {port} seen")
        proc.communicate(input="", timeout=30)
        run.stop()
        problems = differences(before, HostState.record(), run)
        wide = run.beyond_loopback()
    finally:
        run.stop()
        for p in psutil.process_iter(["cmdline"]):
            if str(directory) in (p.info["cmdline"] or []):
                p.kill()
        Path("/proc/sys/net/ipv4/conf/all/log_martians").write_text(martians or "0")
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        LIBC.umount2(str(mnt).encode(), 2)    # MNT_DETACH
        if iptables:
            subprocess.run(["iptables", "-X", chain], capture_output=True, timeout=30)
        for d in (rundir, cgroup, cgroup.parent):
            try:
                d.rmdir()
            except OSError:
                pass
    said = "; ".join(problems)
    expected = [f"sysctl {MARTIANS} {martians} -> ", f"listening socket tcp 0.0.0.0:{port} of ",
                "still running", f"link {link} appeared", f"mount {mnt} (tmpfs clusterproof-hs) appeared",
                f"/run entry {rundir} appeared", f"cgroup {cgroup} appeared",
                *([f"iptables-save rule :{chain} - appeared"] if iptables else [])]
    missing = [e for e in expected if e not in said]
    assert not missing, f"the host check missed {missing}; it said: {said}"
    assert any("time.sleep(600)" in p and "still running" in p for p in problems), said
    assert any(f"0.0.0.0:{port}" in w for w in wide), f"the loopback check missed the stand-in's socket: {wide}"
    assert _sysctl(MARTIANS) == martians and link not in links() and not rundir.exists(), "the control's changes stay"
