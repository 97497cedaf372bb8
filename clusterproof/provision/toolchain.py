"""Upstream binaries, built from their Go modules at pinned versions and cached.

Why build: this machine (and CI) reaches the Go module proxy but not dl.k8s.io
or GitHub releases, so every control-plane binary is compiled from its
published module. Builds are cached by component and version under
``$CLUSTERPROOF_CACHE`` (default ``~/.cache/clusterproof``): only the first run
pays; a second run finds the binaries and builds nothing.

Version choice (see docs/toolchain.md): the newest Coscheduling release the
module proxy serves is scheduler-plugins v0.34.7 (Kubernetes 1.34 libraries).
The version-skew policy lets a scheduler be one minor older than the
apiserver, so the control plane is Kubernetes 1.35 -- the newest minor that
all components support together.

Trust (docs/toolchain.md#trust): what is cached here runs as root, so ``trusted`` refuses, in one line,
a binary that another user could have replaced -- one they own or can write, or a directory on the way to
it -- and the Go module downloads are checked against the checksum database (``go_binary``).

Run ``python -m clusterproof.provision.toolchain`` to build (or verify) everything.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clusterproof.core import filelock, kubeversions
from clusterproof.core import progress as progress_lines
from clusterproof.core.errors import HarnessError
from clusterproof.core.texttable import text_table

# The pinned control plane (clusterproof.core.kubeversions: every version the harness knows, and what differs).
KUBERNETES_VERSION = kubeversions.PINNED
KWOK_VERSION = "v0.8.0"
ETCD_VERSION = "v3.6.16"
SCHEDULER_PLUGINS_VERSION = "v0.34.7"
# Kueue and JobSet, the admission and training-job pair of today's GPU clusters: v0.17.0 is the newest Kueue
# on the Kubernetes 1.35 libraries (v0.35.3; later ones move to 1.36), JobSet v0.11.1 on v0.35.0.
KUEUE_VERSION = "v0.17.0"
JOBSET_VERSION = "v0.11.1"
# scheduler-plugins v0.34.7 pins Kubernetes v1.34.7 libraries, but the module
# proxy this project builds from serves no v0.34.7 of some staging modules
# (k8s.io/dynamic-resource-allocation, k8s.io/csi-translation-lib: 403). The
# newest 1.34 patch it serves completely is v1.34.4; patch releases keep the
# library APIs, so the plugins are built against that instead.
SCHEDULER_PLUGINS_K8S_LIBS = "v1.34.4"
# The mock NVML library (clusterproof/preflight/checker/mocknvml, the project's own cgo code) answers
# from go-nvml's mock DGX machines; v0.13.4-1 is the newest go-nvml the module
# proxy serves (go list -m -versions).
GO_NVML_VERSION = "v0.13.4-1"
MOCKNVML_DIR = Path(__file__).resolve().parent.parent / "preflight" / "checker" / "mocknvml"
# What the mock library reads from its environment (clusterproof.preflight.mock_nvml sets them; so does a
# real node's GPU runtime, clusterproof.cluster.gpu_runtime).
FAULTS_ENV = "CLUSTERPROOF_NVML_FAULTS"      # read by the mock library at every first nvmlInit
MACHINE_ENV = "CLUSTERPROOF_NVML_MACHINE"    # which simulated machine it serves
# Prometheus (and promtool) from module github.com/prometheus/prometheus, whose
# v0.3MM.P tags are Prometheus 3.MM.P. The newest the module proxy serves,
# v0.316.0, builds (measured 2026-11-23; older notes said v0.310+ lacked
# github.com/pb33f/* modules -- the proxy serves them now).
PROMETHEUS_VERSION = "v0.316.0"

# actionlint (the GitHub Actions workflow linter `make test` runs on
# .github/workflows/): the newest release the module proxy serves.
ACTIONLINT_VERSION = "v1.7.12"

# Oldest Go that builds all of the above (kwok v0.8.0 declares go 1.26.0).
MIN_GO = (1, 26)


def cache_root() -> Path:
    return Path(os.environ.get("CLUSTERPROOF_CACHE", Path.home() / ".cache" / "clusterproof"))


# ---------------------------------------------------------------- trust in the cache

def _who(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def untrusted(path: Path, root: Path, uid: int | None = None) -> str | None:
    """Why ``path`` (a cached binary or image under the cache ``root``) must not be run, or None.

    The harness runs what it cached as root (the real nodes' kubelet and images) or as itself, so whoever can
    replace the file, or rename a directory on the way to it, could run their program as us. Every entry from
    ``path`` up to ``/`` must therefore belong to root or to ``uid`` (default: us) and be writable by neither
    its group nor others. A symbolic link is judged by its owner (its mode means nothing), and the path it
    leads to is walked as well. Missing entries are skipped: nothing is there to run."""
    uid = os.geteuid() if uid is None else uid
    path, root = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    for entry in dict.fromkeys([path, *path.parents, real, *real.parents]):
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        where = f"{entry} (owner {_who(st.st_uid)}, mode {mode:04o})"
        us = "root" if uid == 0 else f"root or {_who(uid)}"
        could = f"could replace {path}, which the harness runs as {_who(uid)}"
        fix = f"or set CLUSTERPROOF_CACHE to a directory that only {us} can write, and every one above it"
        if st.st_uid not in (0, uid):
            return f"{where} belongs to another user, who {could}: give it to {us} (chown), {fix}"
        if stat.S_ISLNK(st.st_mode) or not mode & 0o022:
            continue
        # Outside the cache (the directories above it, and where a link in it leads) a writable directory
        # with the sticky bit is accepted, /tmp's case: there the kernel lets only an entry's owner, the
        # directory's owner or root rename or remove it (rename(2), unlink(2): EPERM), so another user can
        # neither move our cache away nor put theirs in its place -- at most take the name first, and then
        # the cache is theirs, which the owner check above refuses. Not inside the cache: anyone could add
        # entries there that the harness would find (a component not yet built, a cluster's directory).
        inside = any(entry == r or r in entry.parents for r in (root, real_root))
        if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX and not inside:
            continue
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "every user")) if mode & bit)
        return f"{where} is writable by {who}, who {could}: chmod go-w {entry}, {fix}"
    return None


def trusted(path: Path) -> Path:
    """``path`` (under the cache) if only root or we could have put it there (``untrusted``); else one line.
    The gate before anything cached is run or imported: ``Component.path``, ``ensure`` and the images'."""
    why = untrusted(path, cache_root())
    if why:
        raise HarnessError(why)
    return path


def make_cache_root() -> Path:
    """The cache root, created 0700 if missing, and trusted. 0700: no other user needs to read it (the
    harness's children run as it or as root; a container gets the mock NVML library through a bind mount
    that runc makes as root), and the embedded clusters' directories under it hold their CA keys and admin
    kubeconfigs. An existing 0755 root is accepted (only its owner can write it)."""
    root = cache_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return trusted(root)


def cache_dir(name: str) -> Path:
    """``cache_root()/name``, created if missing: mode 0755 at most whatever the umask (a group-writable
    directory there would fail ``trusted``)."""
    d = make_cache_root() / name
    d.mkdir(mode=0o755, exist_ok=True)
    return trusted(d)


def seal(directory: Path) -> None:
    """Before a build's staging directory becomes the cache's: nothing in it writable by group or others
    (a umask of 002 makes the compilers' outputs so, which ``trusted`` would then refuse)."""
    for p in [directory, *directory.rglob("*")]:
        if not p.is_symlink():
            p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o022 | (0o755 if p.is_dir() else 0))


@dataclass(frozen=True)
class Component:
    name: str
    version: str
    binaries: tuple[str, ...]
    # Part of the cache key: bumped when the build recipe changes, so a
    # cached binary from an older recipe is rebuilt instead of reused.
    build: str = ""

    @property
    def directory(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}{self.build}"

    def path(self, binary: str) -> Path:
        """Where ``binary`` is, if only root or we could have put it there (``trusted``): the way to run it."""
        return trusted(self.directory / binary)

    def is_built(self) -> bool:
        return all(os.access(self.directory / b, os.X_OK) for b in self.binaries)

    def verified(self) -> Component:
        """This component, each of its binaries ``trusted``."""
        for b in self.binaries:
            self.path(b)
        return self


KWOK = Component("kwok", KWOK_VERSION, ("kwok", "kwokctl"))
KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
KUBERNETES = Component("kubernetes", KUBERNETES_VERSION, KUBERNETES_BINARIES)


def kubernetes(version: str = KUBERNETES_VERSION) -> Component:
    """The control plane at ``version`` (profile key ``kubernetes_version``): each version built
    once into its own cache directory; a version the harness does not know is one line
    (``kubeversions.release``)."""
    kubeversions.release(version)
    return KUBERNETES if version == KUBERNETES_VERSION else Component("kubernetes", version, KUBERNETES_BINARIES)
# The kubelet of a real node (profile key real_nodes): the same module and recipe as the control
# plane, its own cache directory (so adding it does not rebuild the control plane).
KUBELET = Component("kubelet", KUBERNETES_VERSION, ("kubelet",))


def kubelet(version: str = KUBERNETES_VERSION) -> Component:
    """The real nodes' kubelet for a control plane at ``version``: the same version, or the one its row of the
    version table names (``kubeversions.kubelet_version``: 1.38's pre-release cannot be built here)."""
    kubernetes(version)   # the same validation
    version = kubeversions.kubelet_version(version)
    return KUBELET if version == KUBERNETES_VERSION else Component("kubelet", version, ("kubelet",))


ETCD = Component("etcd", ETCD_VERSION, ("etcd",))
SCHEDULER_PLUGINS = Component(
    "scheduler-plugins", SCHEDULER_PLUGINS_VERSION, ("kube-scheduler", "controller"),
    build=f"+k8s-{SCHEDULER_PLUGINS_K8S_LIBS}")


def _source_hash(directory: Path) -> str:
    """A digest of the project's own Go/C sources of a component: an edit rebuilds it."""
    digest = hashlib.sha256()
    for f in sorted(directory.glob("*")):
        if f.suffix in (".go", ".c", ".h") or f.name in ("go.mod", "go.sum"):
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]


MOCKNVML = Component("mocknvml", GO_NVML_VERSION, ("libnvidia-ml.so.1",),
                     build=f"+src-{_source_hash(MOCKNVML_DIR)}")
PROMETHEUS = Component("prometheus", PROMETHEUS_VERSION, ("prometheus", "promtool"))
# The Kueue suite's admission pair: started by an embedded cluster whose run collects a check marked kueue.
KUEUE = Component("kueue", KUEUE_VERSION, ("kueue",))
JOBSET = Component("jobset", JOBSET_VERSION, ("jobset",))
COMPONENTS = (KWOK, ETCD, KUBERNETES, KUBELET, SCHEDULER_PLUGINS, KUEUE, JOBSET, PROMETHEUS, MOCKNVML)
# Not needed by a run: built when the workflows are linted (make lint-workflows, the self-tests).
ACTIONLINT = Component("actionlint", ACTIONLINT_VERSION, ("actionlint",))
# Not needed by a run: the reader of --cp-export perfdata's file in the export self-test (tests/test_export.py):
# the project's Go program decoding it into the type perfdash decodes ClusterLoader2's files into,
# k8s.io/kubernetes/test/e2e/perftype.PerfData (perfdash itself is not on the module proxy). In a checkout only.
PERFDATA_READER_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "perfdata_reader"
PERFDATA_READER = Component("perfdata-reader", KUBERNETES_VERSION, ("perfdata-reader",),
                            build=f"+src-{_source_hash(PERFDATA_READER_DIR)}")


def prometheus_release(version: str = PROMETHEUS_VERSION) -> str:
    """The Prometheus release a module tag is: v0.316.0 -> 3.16.0."""
    minor, patch = re.fullmatch(r"v0\.3(\d\d)\.(\d+)", version).groups()
    return f"3.{int(minor)}.{patch}"


BUILD_GOGC, BUILD_GOMEMLIMIT = "400", "4GiB"    # the go command's, its compiler's and linker's (go_env)


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Never let go silently switch to another toolchain: builds use the Go that is installed, so results are
    # reproducible; a build that needs a newer Go names it exactly (kubernetes_go: GOTOOLCHAIN=go1.27.3).
    env["GOTOOLCHAIN"] = "local"
    env["GOFLAGS"] = "-buildvcs=false -mod=mod"
    env.setdefault("CGO_ENABLED", "0")
    # The compiler and linker are Go programs: on two cores, memory buys CPU here too (issue 39). With
    # GOGC=400 a cold build of etcd took 135 CPU-s against 164 with Go's default (-18 %), its largest
    # process 438 MiB against 402 (docs/toolchain.md); the limit keeps a big link within a small machine.
    # A GOGC or GOMEMLIMIT of the user's own is kept.
    env.setdefault("GOGC", BUILD_GOGC)
    env.setdefault("GOMEMLIMIT", BUILD_GOMEMLIMIT)
    return env


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise HarnessError("Go is not installed: install Go >= 1.26 (e.g. from go.dev or "
                           "your distribution) so the control-plane binaries can be built")
    out = subprocess.run([go, "env", "-json", "GOVERSION", *UNCHECKED_BY], capture_output=True, text=True).stdout
    try:
        goenv = json.loads(out)
    except ValueError:
        goenv = {}
    version = goenv.get("GOVERSION", "")
    m = re.match(r"go(\d+)\.(\d+)", version)
    if m and (int(m[1]), int(m[2])) < MIN_GO:
        raise HarnessError(f"{version} is too old: install Go >= "
                           f"{MIN_GO[0]}.{MIN_GO[1]} to build kwok {KWOK_VERSION}")
    why = unchecked_modules(goenv)
    if why:
        raise HarnessError(f"Go would not check every module against the checksum database ({why}), and the "
                           "binaries built from them run as root: unset it for the build (env -u NAME, or "
                           "go env -u NAME)")
    return go


# The go settings that exempt modules from the checksum database (sum.golang.org), whose signed hashes are
# what makes a module from the proxy the one its author published (go help module-auth). Any module of the
# builds (hundreds, dependencies included) could match a pattern, so any value is refused. GOINSECURE only
# allows plain-HTTP fetches; the checksums are still checked.
UNCHECKED_BY = ("GOSUMDB", "GONOSUMDB", "GOPRIVATE")


def unchecked_modules(goenv: dict[str, str]) -> str | None:
    """Which of ``go env``'s settings (``UNCHECKED_BY``) would let a module skip the checksum database."""
    if goenv.get("GOSUMDB", "") == "off":
        return "GOSUMDB=off"
    set_ = [f"{k}={goenv[k]}" for k in UNCHECKED_BY[1:] if goenv.get(k)]
    return ", ".join(set_) or None


def _run(cmd: list[str], cwd: Path, log: Path, what: str, **env: str) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}  (in {cwd})\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, env={**go_env(), **env}, stdout=fh,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise HarnessError(f"building {what} failed ({tail[0].strip()}); full log: {log}")


def _version_ldflags(version: str) -> str:
    major, minor = re.match(r"v(\d+)\.(\d+)", version).groups()
    base = "k8s.io/component-base/version"
    return (f"-s -w -X {base}.gitVersion={version} -X {base}.gitMajor={major} "
            f"-X {base}.gitMinor={minor} -X {base}.gitTreeState=clean")


def _mod_download(go: str, module: str, work: Path, log: Path, **env: str) -> dict:
    with log.open("a") as fh:
        proc = subprocess.run([go, "mod", "download", "-json", module], cwd=work,
                              env={**go_env(), **env}, stdout=subprocess.PIPE, stderr=fh, text=True)
    if proc.returncode != 0:
        try:
            err = json.loads(proc.stdout).get("Error", "")
        except ValueError:
            err = ""
        why = "the module proxy does not serve it" if re.search(r"\b(403|404|410)\b|not found|unknown revision|"
                                                              r"invalid version", err) else "check GOPROXY/network"
        raise HarnessError(f"cannot download Go module {module} ({why}); log: {log}")
    return json.loads(proc.stdout)


# module_dir's answers in this process, by module, version and where Go keeps its module cache: every embedded
# cluster's start reads kwok's Stage presets, and one `go mod download` per process is enough.
_MODULE_DIRS: dict[tuple[str, ...], Path] = {}


def module_dir(module: str, version: str, why: str) -> Path:
    """Where ``module@version`` is in Go's module cache, downloaded if it is not there yet: the files a run
    reads from a dependency (its CRDs, its webhook configurations; ``why`` says which, for the error)."""
    key = (module, version, *(os.environ.get(v, "") for v in ("GOMODCACHE", "GOPATH", "HOME")))
    known = _MODULE_DIRS.get(key)
    if known is not None and known.is_dir():
        return known
    with tempfile.TemporaryDirectory(prefix="cp-gomod-") as work:
        proc = subprocess.run([go_binary(), "mod", "download", "-json", f"{module}@{version}"], cwd=work,
                              env=go_env(), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise HarnessError(f"cannot download Go module {module}@{version} for {why} "
                           f"({(proc.stderr or proc.stdout).strip().splitlines()[-1:]}): check GOPROXY")
    _MODULE_DIRS[key] = Path(json.loads(proc.stdout)["Dir"])
    return _MODULE_DIRS[key]


def _build_kwok(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    cmd = [go, "install", "-trimpath", "-ldflags=-s -w",
           f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}", f"sigs.k8s.io/kwok/cmd/kwokctl@{KWOK_VERSION}"]
    _run(cmd, work, log, f"kwok {KWOK_VERSION}", GOBIN=str(out))


def _build_actionlint(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    _run([go, "install", "-trimpath", "-ldflags=-s -w", f"github.com/rhysd/actionlint/cmd/actionlint@{c.version}"],
         work, log, f"actionlint {c.version}", GOBIN=str(out))


def _write_wrapper(work: Path, requires: dict[str, str], replaces: dict[str, str]) -> None:
    lines = ["module clusterproof.local/toolchain", "", "go 1.26", "", "require ("]
    lines += [f"\t{m} {v}" for m, v in requires.items()]
    lines += [")", ""]
    if replaces:
        lines += ["replace ("] + [f"\t{m} => {m} {v}" for m, v in replaces.items()] + [")"]
    (work / "go.mod").write_text("\n".join(lines) + "\n")


def _kubernetes_wrapper(go: str, version: str, work: Path, log: Path) -> None:
    """``work/go.mod`` requiring k8s.io/kubernetes at ``version``. It replaces every staging module with
    ./staging/...; a consumer must map each to its published v0.MINOR.PATCH tag instead."""
    info = _mod_download(go, f"k8s.io/kubernetes@{version}", work, log, GOTOOLCHAIN=kubernetes_go(version))
    gomod = Path(info["GoMod"]).read_text()
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", gomod, flags=re.M)
    if not staging:
        raise HarnessError(f"unexpected go.mod in k8s.io/kubernetes@{version}: "
                           "no staging replaces found")
    staging_version = "v0." + version[len("v1."):]
    _write_wrapper(work, {"k8s.io/kubernetes": version},
                   {m: staging_version for m in staging})


def kubernetes_go(version: str) -> str:
    """GOTOOLCHAIN for building Kubernetes ``version``: ``local`` (the installed Go), or the newer Go its
    go.mod asks for (v1.38's ``go 1.27.0``: go1.27.3), which the go command takes from the module proxy
    and checks against the checksum database like any module (``kubeversions.MINORS``)."""
    return kubeversions.release(version).go


def _build_kubernetes(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    version = c.version
    _kubernetes_wrapper(go, version, work, log)
    pkgs = [f"k8s.io/kubernetes/cmd/{b}" for b in c.binaries]
    toolchain = {"GOTOOLCHAIN": kubernetes_go(version)}
    try:
        _run([go, "get", *[f"{p}@{version}" for p in pkgs]], work, log,
             f"kubernetes {version} (go get)", **toolchain)
    except HarnessError:
        missing = missing_module(log.read_text(errors="replace"))
        if missing:
            raise HarnessError(f"Kubernetes {version} cannot be built: the module proxy does not serve "
                               f"{missing} (choose a kubernetes_version whose modules are all published, "
                               f"e.g. {KUBERNETES_VERSION}); log: {log}") from None
        raise
    _run([go, "build", "-trimpath", f"-ldflags={_version_ldflags(version)}",
          "-o", str(out) + "/", *pkgs], work, log, f"kubernetes {version}", **toolchain)


def missing_module(go_output: str) -> str | None:
    """The first module@version a go command could not fetch, from its output (e.g.
    ``k8s.io/dynamic-resource-allocation@v0.34.7: reading https://proxy.golang.org/...: 403 Forbidden``)."""
    m = re.search(r"([\w.-]+(?:/[\w.~-]+)+@v[\w.+-]+): (?:reading|verifying|invalid version|unknown revision|"
                  r"module .* not found|.*(?:403|404|410)\b)", go_output)
    return m[1] if m else None


def _build_etcd(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    _build_module_main(go, work, out, log, "etcd", ETCD_VERSION, "go.etcd.io/etcd/server/v3", "etcd")


def _build_module_main(go: str, work: Path, out: Path, log: Path, what: str, version: str, package: str,
                       binary: str, ldflags: str = "-s -w") -> None:
    """``package``@``version`` built as its module pins its dependencies, in a wrapper module requiring only
    it (``go install pkg@version`` would first list the module's versions, which the proxy this project
    builds from refuses for some modules: sigs.k8s.io/jobset, 403)."""
    _write_wrapper(work, {}, {})
    _run([go, "get", f"{package}@{version}"], work, log, f"{what} {version} (go get)")
    _run([go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(out / binary), package], work, log,
         f"{what} {version}")


def _build_kueue(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    _build_module_main(go, work, out, log, "kueue", c.version, "sigs.k8s.io/kueue/cmd/kueue", "kueue",
                       f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={c.version}")


def _build_jobset(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    _build_module_main(go, work, out, log, "jobset", c.version, "sigs.k8s.io/jobset", "jobset")


def _writable_module(go: str, module: str, work: Path, log: Path) -> Path:
    """A writable copy of a downloaded module: replace/exclude directives apply only inside it."""
    src = work / "src"
    shutil.copytree(_mod_download(go, module, work, log)["Dir"], src)
    for p in [src, *src.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return src


def _build_scheduler_plugins(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    # Its go.mod pins k8s.io/* with version replaces, which only apply inside
    # the module itself: build in a writable copy of the downloaded module.
    src = _writable_module(go, f"sigs.k8s.io/scheduler-plugins@{SCHEDULER_PLUGINS_VERSION}", work, log)
    gomod = src / "go.mod"
    pinned = re.search(r"^\s*k8s\.io/kubernetes => k8s\.io/kubernetes (v1\.\d+\.\d+)",
                       gomod.read_text(), flags=re.M)
    if pinned is None:
        raise HarnessError(f"unexpected go.mod in scheduler-plugins {SCHEDULER_PLUGINS_VERSION}: "
                           "no k8s.io/kubernetes replace found")
    old_lib, new_lib = "v0." + pinned[1][3:], "v0." + SCHEDULER_PLUGINS_K8S_LIBS[3:]
    gomod.write_text(gomod.read_text()
                     .replace(f" {pinned[1]}", f" {SCHEDULER_PLUGINS_K8S_LIBS}")
                     .replace(f" {old_lib}", f" {new_lib}"))
    what = f"scheduler-plugins {SCHEDULER_PLUGINS_VERSION}"
    # component-base/version is the *Kubernetes* version the scheduler is
    # built from: kube-scheduler derives its compatibility (emulation)
    # version from it and refuses to start with v0.34.7 ("emulation version
    # 0.34 is not between [1.31, 0.34.0]").
    _run([go, "build", "-trimpath", f"-ldflags={_version_ldflags(SCHEDULER_PLUGINS_K8S_LIBS)}",
          "-o", str(out / "kube-scheduler"), "./cmd/scheduler"], src, log, what)
    _run([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(out / "controller"),
          "./cmd/controller"], src, log, what + " controller")


def _build_mocknvml(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    """The mock libnvidia-ml.so.1: cgo, -buildmode=c-shared, in a copy of clusterproof/preflight/checker/mocknvml.

    CGO_ENABLED=1 for this build only (go_env turns cgo off for the rest).
    nvml.h is read from the go-nvml module in the module cache (abi_check.c
    proves the exports' types against it). go-nvml's own cgo code references
    every NVML function; Python's ctypes loads with RTLD_NOW, so each one the
    library does not implement must exist: a first build lists them (``nm``),
    a generated file defines each as answering NVML_ERROR_NOT_SUPPORTED (what a
    real library says for a feature the GPU lacks), and a second build links it.
    """
    info = _mod_download(go, f"github.com/NVIDIA/go-nvml@{GO_NVML_VERSION}", work, log)
    include = Path(info["Dir"]) / "pkg" / "nvml"
    src = work / "src"
    shutil.copytree(MOCKNVML_DIR, src, ignore=shutil.ignore_patterns("zz_*", "*.so*"))
    lib = out / MOCKNVML.binaries[0]
    what = f"mocknvml (go-nvml {GO_NVML_VERSION})"
    env = {"CGO_ENABLED": "1", "CGO_CFLAGS": f"-O2 -I{include}", "GOFLAGS": "-buildvcs=false -mod=readonly"}
    cmd = [go, "build", "-buildmode=c-shared", "-trimpath",
           f"-ldflags=-s -w -extldflags=-Wl,-soname,{lib.name}", "-o", str(lib), "."]
    _run(cmd, src, log, what, **env)
    nm = shutil.which("nm")
    if nm is None:
        raise HarnessError("building the mock NVML library needs `nm` (binutils): install binutils")
    undefined = subprocess.run([nm, "-D", "--undefined-only", str(lib)], capture_output=True, text=True,
                               check=True).stdout
    names = sorted({ln.split()[-1] for ln in undefined.splitlines() if ln.split()[-1].startswith("nvml")})
    (src / "zz_not_supported.c").write_text(
        "/* Generated at build time: NVML functions the mock does not implement. */\n"
        + "".join(f"unsigned int {n}(void) {{ return 3; /* NVML_ERROR_NOT_SUPPORTED */ }}\n" for n in names))
    _run(cmd, src, log, what + " (with stubs)", **env)
    lib.with_suffix(".h").unlink(missing_ok=True)   # cgo's export header: not needed at run time
    lib.chmod(0o755)


def _build_prometheus(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    # Built inside a writable copy of the downloaded module (its go.mod has
    # excludes and replaces that only apply there). GOWORK=off: the module
    # ships a go.work. remove_all_sd: no service-discovery plugins (the
    # harness gives static targets); no builtinassets tag: no web UI, the
    # HTTP API is complete without it.
    src = _writable_module(go, f"github.com/prometheus/prometheus@{PROMETHEUS_VERSION}", work, log)
    base = "github.com/prometheus/common/version"
    ldflags = (f"-s -w -X {base}.Version={prometheus_release()} -X {base}.Revision={PROMETHEUS_VERSION} "
               f"-X {base}.Branch=module-proxy -X {base}.BuildUser=clusterproof")
    _run([go, "build", "-trimpath", "-tags", "remove_all_sd", f"-ldflags={ldflags}", "-o", str(out) + "/",
          "./cmd/prometheus", "./cmd/promtool"], src, log, f"prometheus {PROMETHEUS_VERSION}", GOWORK="off")


def _build_perfdata_reader(go: str, work: Path, out: Path, log: Path, c: Component) -> None:
    """The project's PerfData reader (tests/data/perfdata_reader): one Go file importing
    k8s.io/kubernetes/test/e2e/perftype, built in a wrapper module at the control plane's version."""
    if not (PERFDATA_READER_DIR / "main.go").is_file():
        raise HarnessError(f"the PerfData reader's source is not here ({PERFDATA_READER_DIR}): it is built from a "
                           "checkout, for the export self-test")
    shutil.copy(PERFDATA_READER_DIR / "main.go", work / "main.go")
    _kubernetes_wrapper(go, c.version, work, log)
    _run([go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(out / "perfdata-reader"), "."], work, log,
         f"perfdata-reader (perftype of k8s.io/kubernetes {c.version})")


_BUILDERS = {
    "mocknvml": _build_mocknvml,
    "kwok": _build_kwok,
    "kubernetes": _build_kubernetes,
    "kubelet": _build_kubernetes,
    "etcd": _build_etcd,
    "scheduler-plugins": _build_scheduler_plugins,
    "prometheus": _build_prometheus,
    "actionlint": _build_actionlint,
    "kueue": _build_kueue,
    "jobset": _build_jobset,
    "perfdata-reader": _build_perfdata_reader,
}


def ensure(component: Component, progress=progress_lines.say) -> Component:
    """Build ``component`` unless its binaries are already cached. One build per component at a time on
    this machine: a second process (the self-tests' parallel workers on a cold cache) waits for the
    first one's build, under a lock beside the cache, and then finds it built. Either way its binaries are
    ``trusted`` before it is returned."""
    if component.is_built():
        return component.verified()
    with filelock.held(cache_dir("bin") / f".{component.name}-{component.version}.lock",
                       f"waiting for another process's build of {component.name} {component.version}", progress):
        if component.is_built():
            return component.verified()
        return _build(component, progress).verified()


def _build(component: Component, progress) -> Component:
    go = go_binary()
    log = cache_dir("logs") / f"{component.name}-{component.version}.log"
    log.write_text("")
    progress(f"building {component.name} {component.version} from Go modules "
             f"(first run only; log: {log})")
    staging = Path(tempfile.mkdtemp(prefix=f"{component.name}-", dir=cache_root() / "bin"))
    try:
        with tempfile.TemporaryDirectory(prefix="cp-build-") as work, progress_lines.heartbeat(
                f"the build of {component.name} {component.version} (log: {log})",
                status=lambda: progress_lines.last_line(log)):
            _BUILDERS[component.name](go, Path(work), staging, log, component)
        missing = [b for b in component.binaries if not (staging / b).exists()]
        if missing:
            raise HarnessError(f"building {component.name} produced no {', '.join(missing)}; "
                               f"log: {log}")
        if component.directory.exists():
            shutil.rmtree(component.directory)
        seal(staging)
        staging.rename(component.directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return component


def components(kubernetes_version: str = KUBERNETES_VERSION) -> tuple[Component, ...]:
    """Every component an embedded cluster's run may need, with the control plane at ``kubernetes_version``."""
    return _at(kubernetes_version, COMPONENTS)


# What an embedded cluster always runs: kwok, etcd, the control plane, and the mock NVML library (a minute
# to build; the preflight checker's simulated GPUs, on kwok nodes and on the real nodes).
BRINGUP = (KWOK, ETCD, KUBERNETES, MOCKNVML)
# What the checks a run selects may use beyond that, by the name the plugin's collection gives it
# (clusterproof.fixtures.cluster.checks_use). The embedded cluster starts with the first three.
USES = {"real_nodes": (KUBELET,),               # the profile's real nodes (profile key real_nodes)
        "gangs": (SCHEDULER_PLUGINS,),          # the Coscheduling scheduler and its PodGroup controller
        "kueue": (KUEUE, JOBSET),
        "prometheus": (PROMETHEUS,)}            # the embedded Prometheus (and its history)
STARTS_WITH_THE_CLUSTER = ("real_nodes", "gangs", "kueue")


def _at(version: str, wanted) -> tuple[Component, ...]:
    """``wanted`` once each, in order, with the control plane and kubelet at ``version``."""
    swap = {KUBERNETES: kubernetes(version), KUBELET: kubelet(version)}
    return tuple(dict.fromkeys(swap.get(c, c) for c in wanted))


def bringup(uses=None, kubernetes_version: str = KUBERNETES_VERSION) -> tuple[Component, ...]:
    """What an embedded cluster's start runs: ``BRINGUP``, then what it starts for ``uses``
    (``STARTS_WITH_THE_CLUSTER``; None: all of them)."""
    uses = USES if uses is None else uses
    return _at(kubernetes_version, [*BRINGUP, *(c for u in STARTS_WITH_THE_CLUSTER if u in uses for c in USES[u])])


def for_run(existing_cluster: bool, prometheus_url: bool,
            kubernetes_version: str = KUBERNETES_VERSION, uses=None) -> tuple[Component, ...]:
    """What a run of the suites uses, in the order it needs them. ``uses``: what its checks use (``USES``' names,
    in the order the run first needs each, from its collection); None when not known: all of them.

    The embedded cluster: its bring-up (``bringup``), then the rest of ``uses``. An existing cluster
    (--cp-kubeconfig): the mock NVML library (the preflight checker runs here, and the simulated GPUs of a
    kwok cluster) and, if a check uses it and --cp-prometheus-url names no Prometheus under test, Prometheus
    (the embedded one that scrapes the cluster). Nothing of a cluster of the harness's own."""
    uses = [u for u in (USES if uses is None else uses) if not (prometheus_url and u == "prometheus")]
    if existing_cluster:
        return (MOCKNVML, *(USES["prometheus"] if "prometheus" in uses else ()))
    return _at(kubernetes_version, [*bringup(uses, kubernetes_version), *(c for u in uses for c in USES[u])])


def named(name: str) -> Component:
    """A component by its name (``kubernetes@v1.34.4``: the control plane at that version)."""
    if name.startswith("kubernetes@"):
        return kubernetes(name.split("@", 1)[1])
    if name.startswith("kubelet@"):
        return kubelet(name.split("@", 1)[1])
    by_name = {c.name: c for c in (*COMPONENTS, ACTIONLINT, PERFDATA_READER)}
    if name not in by_name:
        raise HarnessError(f"no toolchain component {name!r} (known: {', '.join(by_name)}, kubernetes@VERSION)")
    return by_name[name]


def ensure_many(wanted: list[Component] | tuple[Component, ...], progress=progress_lines.say, jobs: int = 1) -> None:
    """Build every component of ``wanted`` that is not cached, ``jobs`` at a time (each build is its own
    staging directory, log and Go invocation; Go's module and build caches take concurrent builds). Every
    build runs to its end; the first failure is then raised (one line)."""
    todo = [c for c in dict.fromkeys(wanted) if not c.is_built()]
    if jobs <= 1 or len(todo) <= 1:
        for c in todo:
            ensure(c, progress)
        return
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(ensure, c, progress) for c in todo]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


def ensure_all(progress=progress_lines.say, kubernetes_version: str = KUBERNETES_VERSION) -> None:
    for c in components(kubernetes_version):
        ensure(c, progress)


def versions() -> dict[str, str]:
    return {c.name: c.version for c in COMPONENTS}


USAGE = ("python -m clusterproof.provision.toolchain [--only NAME[,NAME...]] [--jobs N] [--dry-run] "
         f"[kubernetes@{KUBERNETES_VERSION}] [actionlint]")


def main(argv: list[str] | None = None) -> int:
    """``python -m clusterproof.provision.toolchain``: build (or verify) every component a run on the embedded
    cluster needs; ``kubernetes@VERSION`` builds that control-plane version too, ``actionlint`` the workflow
    linter. ``--only a,b`` (or ``--only`` then names): just those. ``--jobs N``: N builds at a time.
    ``--dry-run``: say what would be built, build nothing."""
    from clusterproof.core import exitcodes
    from clusterproof.core.errors import ArgumentParser
    ap = ArgumentParser(prog="python -m clusterproof.provision.toolchain", usage=USAGE, add_help=True)
    ap.add_argument("--only", nargs="?", const="", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("names", nargs="*")
    args, unknown = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if unknown or args.jobs < 1:
        print(f"clusterproof: unknown argument {(unknown or ['--jobs'])[0]!r} (usage: {USAGE})", file=sys.stderr)
        return exitcodes.USAGE
    names = [n for part in [args.only or "", *args.names] for n in part.split(",") if n]
    try:
        wanted = [] if args.only is not None else list(COMPONENTS)
        wanted += [named(n) for n in names]
        wanted = list(dict.fromkeys(wanted))
    except HarnessError as e:   # a name it does not know: 4
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        if args.dry_run:
            print(text_table((), [[c.name, c.version, "cached" if c.is_built() else "would be built"] for c in wanted]))
            return 0
        progress_lines.to_terminal()   # the builds' heartbeats, timestamped, on stderr
        ensure_many(wanted, progress=lambda m: print(m, flush=True), jobs=args.jobs)
    except HarnessError as e:   # a build failed: a set-up failure, 8
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.SETUP_FAILED
    print(text_table((), [[c.name, c.version, c.directory] for c in wanted]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
