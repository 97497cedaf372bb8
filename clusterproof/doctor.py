"""What a run needs from this machine, one line per prerequisite, present or missing -- and nothing built.

Why: the prerequisites used to be scattered (the README, docs/exit-codes.md,
docs/report.md) and a missing one surfaced minutes into the set-up, or an
hour into a run. Given the run's own arguments (as ``./proof run`` and
``clusterproof run`` take them), this says what that run would use -- the
embedded cluster or ``--cp-kubeconfig``, real nodes or not, the builds its
cache still lacks, the report -- and for each prerequisite whether this
machine has it, and how to get it if not. Exit 0 when everything is there, 4
(``clusterproof.core.exitcodes.USAGE``: the machine is not fit for this run,
docs/exit-codes.md) when anything is missing.

    python -m clusterproof.doctor [RUN ARGS]     (./proof doctor, clusterproof doctor, pytest --cp-doctor)

Unknown arguments (the rest of the run's pytest arguments) are ignored, as
``clusterproof.prepare`` ignores them.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import clusterproof
from clusterproof import prepare
from clusterproof.cluster import realnodes
from clusterproof.config.profile import Profile
from clusterproof.core import exitcodes
from clusterproof.core.errors import HarnessError, one_line_main
from clusterproof.provision import hostpkgs, toolchain

MIN_PYTHON = (3, 11)
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids", "cpuset")   # what realnodes.require_host checks
ALLURE = "allure-commandline@2.46.1"                                  # ./proof's report (npx)


@dataclass(frozen=True)
class Prerequisite:
    """One thing the run needs: ``found`` says what is there (None: missing), ``fix`` how to get it.
    ``needed`` False: only a build needs it, and what it builds is cached -- missing, it stops nothing."""
    name: str
    why: str
    found: str | None
    fix: str
    needed: bool = True

    @property
    def present(self) -> bool:
        return self.found is not None or not self.needed

    def line(self) -> str:
        if self.found is not None:
            return f"present  {self.name}: {self.found}; for {self.why}"
        if not self.needed:
            return f"unused   {self.name}: not here, and not needed while the cache holds the builds; for {self.why}"
        return f"MISSING  {self.name}: {self.fix}; for {self.why}"


@dataclass(frozen=True)
class Run:
    """What the run's arguments decide: its profile, which cluster, which Prometheus."""
    profile: Profile
    kubeconfig: str | None = None
    context: str | None = None
    prometheus_url: str | None = None

    @property
    def existing(self) -> bool:
        return bool(self.kubeconfig or self.context)   # --cp-context alone: the current kubeconfig's cluster

    @property
    def real_nodes(self) -> int:
        return 0 if self.existing else self.profile.real_nodes

    def scope(self) -> str:
        where = (f"the cluster of {self.kubeconfig or 'the current kubeconfig'}" if self.existing
                 else f"the embedded cluster, {self.real_nodes} real node{'s' * (self.real_nodes != 1)}")
        return f"profile {self.profile.name}, {where}"


def _output(cmd: list[str]) -> str | None:
    """The first line ``cmd`` printed (stdout, else stderr; at most up to a parenthesis), or None if it failed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    said = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return said[0].split(" (")[0].strip() if proc.returncode == 0 and said else None


def _tool(name: str, why: str, fix: str, version_args: tuple[str, ...] | None = None,
          needed: bool = True) -> Prerequisite:
    """A command on PATH (with the first line of its version when ``version_args`` asks for it)."""
    path = shutil.which(name)
    found = path
    if path and version_args is not None:
        said = _output([path, *version_args])
        found = f"{said}, {path}" if said else None
    return Prerequisite(name, why, found, fix, needed)


def _python() -> Prerequisite:
    v = sys.version_info
    ok = (v.major, v.minor) >= MIN_PYTHON
    return Prerequisite(f"Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}", "the harness itself",
                        f"Python {v.major}.{v.minor}.{v.micro}, {sys.executable}" if ok else None,
                        f"this is Python {v.major}.{v.minor}: install Python >= 3.11 and make the venv with it")


def _builds(wanted, builds) -> str:
    """What a build tool is for: the components it would build now, or those it built (all cached)."""
    if builds:
        return f"building {', '.join(f'{c.name} {c.version}' for c in builds)}, not yet in {toolchain.cache_root()}"
    return f"building {', '.join(c.name for c in wanted)}: all already in {toolchain.cache_root()}"


def _go(wanted, builds) -> Prerequisite:
    name = f"Go >= {toolchain.MIN_GO[0]}.{toolchain.MIN_GO[1]}"
    try:
        go = toolchain.go_binary()      # missing, too old, or set to skip the checksum database: one line
    except HarnessError as e:
        return Prerequisite(name, _builds(wanted, builds), None, str(e), bool(builds))
    return Prerequisite(name, _builds(wanted, builds), f"{_output([go, 'env', 'GOVERSION']) or 'Go'}, {go}", "")


def _gcc(why: str, needed: bool = True) -> Prerequisite:
    gcc = shutil.which("gcc")
    headers = Path("/usr/include/stdio.h").is_file()    # libc6-dev: cgo's and the static pause binary's headers
    found = f"{gcc}, C headers in /usr/include" if gcc and headers else None
    return Prerequisite("gcc and the C library headers", why, found, "apt-get install gcc libc6-dev", needed)


def _cgroups() -> Prerequisite:
    root = realnodes.CGROUP_V1
    missing = [c for c in CGROUP_CONTROLLERS if not (root / c / "cgroup.procs").exists()]
    unified = (root / "cgroup.controllers").exists()
    version = "cgroup v2 (unified)" if unified else (
        "cgroup v1 (hybrid: cgroup2 at {})".format(root / "unified") if (root / "unified").is_dir() else "cgroup v1")
    found = None if missing else f"{version}, hierarchies {', '.join(CGROUP_CONTROLLERS)} under {root}"
    fix = (f"this host has {version}, without the v1 hierarchies {', '.join(missing)}: boot it with "
           "systemd.unified_cgroup_hierarchy=0, or --cp-set real_nodes=0")
    return Prerequisite("cgroup v1 hierarchies", "the real nodes' kubelet (failCgroupV1: false)", found, fix)


def _host_packages() -> list[Prerequisite]:
    have = hostpkgs.installed()
    install = "apt-get install " + " ".join(f"{p}={v}" for p, v in hostpkgs.PACKAGES.items())
    fix = f"{install} (as root; ./proof's set-up does it as root), or --cp-set real_nodes=0"
    why = {"containerd": "the real nodes' container runtime", "runc": "the real nodes' container runtime",
           "containernetworking-plugins": "the real nodes' pod network (bridge, host-local, loopback)",
           "debootstrap": "the real nodes' checker image (a Debian root)",
           "debian-archive-keyring": "debootstrap's check of the Debian archive's signature"}
    return [Prerequisite(f"{p} {v}", why.get(p, "real nodes"), f"installed {have[p]}" if have[p] == v else None,
                         f"{'not installed' if have[p] is None else f'{have[p]} installed'}: {fix}")
            for p, v in hostpkgs.PACKAGES.items()]


def _java() -> Prerequisite:
    java = shutil.which("java")
    said = _output([java, "-version"]) if java else None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', said or "")
    major = (int(m[2]) if m[1] == "1" else int(m[1])) if m else 0   # "1.8.0_392" is Java 8
    found = f"Java {major}, {java}" if major >= 8 else None
    return Prerequisite("Java >= 8", "Allure's CLI, which builds the report (./proof report, .ci/nightly)", found,
                        "apt-get install default-jre-headless" if not java else
                        f"{java} is not Java 8 or later: apt-get install default-jre-headless")


def prerequisites(run: Run) -> list[Prerequisite]:
    """Every prerequisite of ``run``, in the order a reader meets them: the harness, the builds, the cluster,
    the real nodes, the report."""
    out = [_python()]
    if clusterproof.CHECKOUT is not None:
        out.append(_tool("make", "./proof's set-up of the venv (make -s venv)", "apt-get install make"))
    wanted = toolchain.for_run(run.existing, bool(run.prometheus_url), run.profile.kubernetes_version)
    builds = [c for c in wanted if not c.is_built()]
    out.append(_go(wanted, builds))
    nvml = [toolchain.MOCKNVML] if toolchain.MOCKNVML in builds else []
    gcc_for = _builds([toolchain.MOCKNVML], nvml) + " (cgo)"
    if run.real_nodes:
        gcc_for += f"; the real nodes' pause image (a static binary, real_nodes: {run.real_nodes})"
    out.append(_gcc(gcc_for, bool(nvml) or bool(run.real_nodes)))
    out.append(_tool("nm", _builds([toolchain.MOCKNVML], nvml) + " (it lists the NVML functions to stub)",
                     "apt-get install binutils", needed=bool(nvml)))
    if run.existing:
        kc = Path(run.kubeconfig or os.environ.get("KUBECONFIG", "") or Path.home() / ".kube" / "config")
        out.append(Prerequisite(f"kubeconfig {kc}", "the cluster under test", "readable" if os.access(kc, os.R_OK)
                                else None, "a kubeconfig of the harness's ServiceAccount (docs/real-cluster.md)"))
    elif run.profile.component_identities:
        out.append(_tool("openssl", "the embedded cluster's component certificates (component_identities)",
                         "apt-get install openssl, or --cp-set component_identities=false", ("version",)))
    if run.real_nodes:
        why = f"real nodes (real_nodes: {run.real_nodes})"
        out.append(Prerequisite("root", f"{why}, whose kubelet and containerd manage mounts, cgroups and network "
                                        "namespaces", "uid 0" if os.geteuid() == 0 else None,
                                "run as root, or --cp-set real_nodes=0"))
        out.append(_cgroups())
        out.append(Prerequisite("overlayfs", f"{why}: containerd's snapshotter",
                                "in /proc/filesystems" if "overlay" in Path("/proc/filesystems").read_text()
                                else None, "modprobe overlay, or --cp-set real_nodes=0"))
        out.append(_tool("ip", f"{why}: each node's network namespace and veth (iproute2)",
                         "apt-get install iproute2, or --cp-set real_nodes=0", ("-V",)))
        for name in ("unshare", "nsenter"):
            out.append(_tool(name, f"{why}: each node's own namespaces (util-linux)",
                             "apt-get install util-linux, or --cp-set real_nodes=0"))
        out.append(Prerequisite("/usr/bin/python3", f"{why}: their GPU runtime and mounts run on it",
                                "executable" if os.access("/usr/bin/python3", os.X_OK) else None,
                                "apt-get install python3, or --cp-set real_nodes=0"))
        out.extend(_host_packages())
        out.append(_tool("gpgv", f"{why}: debootstrap's check of the Debian Release signature",
                         "apt-get install gpgv"))
    out.append(_java())
    out.append(_tool("npx", f"fetching and running {ALLURE}, which builds the report (./proof report)",
                     "apt-get install npm (Node.js; npx comes with it)", ("--version",)))
    return out


def report(run: Run, say=print) -> int:
    """Print one line per prerequisite and a verdict; 0 when every one is present, else USAGE (4)."""
    found = prerequisites(run)
    for p in found:
        say(p.line())
    missing = [p.name for p in found if not p.present]
    if missing:
        say(f"clusterproof doctor: {len(missing)} of {len(found)} prerequisites of this run are missing "
            f"({', '.join(missing)}); {run.scope()}")
        return exitcodes.USAGE
    say(f"clusterproof doctor: all {len(found)} prerequisites of this run are present; {run.scope()}")
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return exitcodes.OK
    a = prepare.run_args(args)

    def body() -> int:
        profile = prepare.plan(a)["profile"]     # a bad profile or --cp-set: one line, exit 4
        return report(Run(profile, a.kubeconfig, a.context, a.prometheus_url))
    return one_line_main(body, exitcodes.USAGE)


if __name__ == "__main__":
    sys.exit(main())
