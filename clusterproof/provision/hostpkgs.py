"""The host packages real nodes run on: Debian's containerd, runc and CNI plugins, pinned.

Why Debian packages and not a containerd built from the Go module proxy: a
container runtime is host software -- a shim per container, runc, the CNI
plugins, each found on the host's PATH or plugin directory -- and a GPU
node runs its distribution's (or NVIDIA's) packages, not a harness's build.
Debian bookworm's containerd 1.6.20 and runc 1.1.5 are what this machine and
CI run containers with (NOTES.md); the CNI plugins come from the same
archive. The versions are pinned here, the one place that installs them
(``make setup`` as root: ``python -m clusterproof.provision.hostpkgs --install``), and a
run checks them before it starts a real node: a different version installed
is one line, not a surprise.

debootstrap builds the GPU checker image's Debian root (``clusterproof.provision.images``), and checks
what it downloads against debian-archive-keyring's keys (``--force-check-gpg``): debootstrap only
recommends the keyring, and ``--no-install-recommends`` would leave it out, so it is pinned here too.
apt itself checks each of these packages against the keyring already installed (apt depends on it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from clusterproof.core import exitcodes, progress
from clusterproof.core.errors import HarnessError
from clusterproof.core.texttable import text_table

PACKAGES = {
    "containerd": "1.6.20~ds1-1+deb12u3",
    "runc": "1.1.5+ds1-1+deb12u1",
    "containernetworking-plugins": "1.1.1+ds1-3+b5",
    "debootstrap": "1.0.128+nmu2+deb12u2",
    "debian-archive-keyring": "2023.3+deb12u2",
}
BINARIES = {"containerd": "/usr/bin/containerd", "containerd-shim-runc-v2": "/usr/bin/containerd-shim-runc-v2",
            "ctr": "/usr/bin/ctr", "runc": "/usr/sbin/runc"}


def installed() -> dict[str, str | None]:
    """Each pinned package's installed version (None: not installed)."""
    out: dict[str, str | None] = {}
    for pkg in PACKAGES:
        proc = subprocess.run(["dpkg-query", "-W", "-f", "${Status}\t${Version}", pkg], capture_output=True,
                              text=True) if shutil.which("dpkg-query") else None
        ok = proc is not None and proc.returncode == 0 and proc.stdout.startswith("install ok installed")
        out[pkg] = proc.stdout.split("\t", 1)[1] if ok else None
    return out


def _fix() -> str:
    return ("apt-get install " + " ".join(f"{p}={v}" for p, v in PACKAGES.items()) +
            " (as root; or `make setup` as root), or set real_nodes: 0")


def require() -> None:
    """One line if a pinned package is missing or at another version."""
    have = installed()
    wrong = [f"{p} {have[p] or 'not installed'} (pinned {v})" for p, v in PACKAGES.items() if have[p] != v]
    if wrong:
        raise HarnessError(f"real nodes need {', '.join(wrong)}: {_fix()}")


def binary(name: str) -> str:
    path = BINARIES.get(name) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        raise HarnessError(f"{name} is not installed: {_fix()}")
    return path


def install() -> None:
    """apt-get install the pinned versions of whatever is not installed at them (root only)."""
    have = installed()
    todo = [f"{p}={v}" for p, v in PACKAGES.items() if have[p] != v]
    if not todo:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HarnessError(f"cannot install {', '.join(todo)} (needs root and apt-get): {_fix()}")
    print(f"installing {', '.join(todo)} (apt-get; real nodes)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in (1, 2):
        with progress.heartbeat(f"apt-get install {' '.join(todo)}"):
            proc = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *todo], env=env,
                                  capture_output=True, text=True)
        if proc.returncode == 0:
            return
        if attempt == 1:   # an old package index names versions the archive no longer has
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    raise HarnessError(f"apt-get install {' '.join(todo)} failed ({tail[0][:200]})")


def main(argv: list[str]) -> int:
    """``python -m clusterproof.provision.hostpkgs [--install]``: check (or install, as root) the pinned
    packages. Not root and not installed: a note, exit 0 -- a run with real nodes then ends with one line
    saying what to do."""
    try:
        if argv == ["--install"]:
            if os.geteuid() != 0 and any(installed()[p] != v for p, v in PACKAGES.items()):
                print(f"clusterproof: real nodes' host packages not installed (not root): {_fix()}")
                return 0
            install()
        require()
    except HarnessError as e:   # not installed, or apt-get failed: a set-up failure
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.SETUP_FAILED
    print(text_table((), PACKAGES.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
