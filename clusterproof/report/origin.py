"""What produced a result: clusterproof's version and commit, the Kubernetes versions, the profile's hash.

Why: a summary.json, a report or a junit.xml read weeks later must say what
made it -- docs/triage.md sends the reader of a regression to ``git log
<baseline's commit>..HEAD``, so the baseline has to name its commit. The same
facts go to summary.json (``run``), the Allure environment and junit.xml's
testsuite properties (``clusterproof.fixtures.report``).

The commit comes from git, read once per session, when the package runs
from a checkout (``clusterproof.CHECKOUT``), with whether the tree had
changes git would commit (tracked edits or untracked files that are not
ignored: "dirty"). An installed package has no git and says so: "unknown
(installed package)". The commit is deliberately not embedded in the wheel at
build time: pip builds from a copy of the sources (tests/test_wheel.py does
so too) that has no ``.git``, and a wheel built from a dirty tree would carry
a commit that does not describe its files -- a hook would need
setuptools-scm or a build backend of our own to say anything honest. The
version (pyproject.toml, ``clusterproof.__version__``) names the release.

The profile's hash is a sha256 of the profile's effective values (base.yaml,
the profile file, ``--cp-set`` and the key groups' defaults, as canonical
JSON): two runs with the same hash ran the same numbers, whatever the file
was called. Pure: no pytest, no domain (the profile and the cluster's server
version are passed in).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import clusterproof

INSTALLED = "unknown (installed package)"
GIT_TIMEOUT_S = 20


@dataclass(frozen=True)
class Source:
    """The code that ran: its version, and its commit when it is known (else ``why``)."""
    version: str
    commit: str | None = None      # the full sha of HEAD
    dirty: bool | None = None      # uncommitted changes in the tree (None: not known)
    why: str = ""                  # why the commit is unknown

    @property
    def commit_field(self) -> str:
        """summary.json's ``commit``: the sha, or 'unknown (...)'."""
        return self.commit or self.why

    def commit_shown(self) -> str:
        return commit_shown(self.commit_field, self.dirty)


def commit_shown(commit: str | None, dirty: bool | None) -> str:
    """A commit for a reader: 'a1b2c3d4e5f6 (uncommitted changes)', or 'unknown (installed package)'."""
    if not commit:
        return "unknown"
    if str(commit).startswith("unknown"):
        return str(commit)
    return str(commit)[:12] + (" (uncommitted changes)" if dirty else "")


def _git(checkout: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                          timeout=GIT_TIMEOUT_S)
    if proc.returncode != 0:
        raise OSError((proc.stderr.strip().splitlines() or [f"git exited {proc.returncode}"])[-1])
    return proc.stdout


def source(checkout: Path | None = clusterproof.CHECKOUT, version: str = clusterproof.__version__) -> Source:
    """The running code's version and commit (``checkout``: the source tree it runs from; None when it
    runs installed)."""
    if checkout is None:
        return Source(version, why=INSTALLED)
    if not (checkout / ".git").exists():
        return Source(version, why="unknown (a source tree without .git)")
    try:
        commit = _git(checkout, "rev-parse", "--verify", "HEAD").strip()
        dirty = bool(_git(checkout, "status", "--porcelain", "--untracked-files=normal").strip())
    except FileNotFoundError:
        return Source(version, why="unknown (git is not installed)")
    except (OSError, subprocess.TimeoutExpired) as e:
        return Source(version, why=f"unknown (git: {str(e)[:120]})")
    return Source(version, commit, dirty)


def profile_sha256(profile) -> str | None:
    """The sha256 of a profile's effective values (canonical JSON); None without a profile."""
    if profile is None or not hasattr(profile, "model_dump"):
        return None
    canonical = json.dumps(profile.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def kubernetes_client() -> str:
    """The Kubernetes client the harness talks to the API server with (the Python client library)."""
    try:
        return f"kubernetes (Python client) {metadata.version('kubernetes')}"
    except metadata.PackageNotFoundError:
        return "kubernetes (Python client) unknown"


@dataclass(frozen=True)
class Origin:
    """Everything a result carries about what produced it."""
    source: Source
    kubernetes_server: str | None
    kubernetes_client: str
    profile: str | None
    profile_sha256: str | None

    @classmethod
    def of(cls, source_: Source, profile, server_version: str | None) -> "Origin":
        return cls(source_, server_version, kubernetes_client(), getattr(profile, "name", None),
                   profile_sha256(profile))

    def summary_fields(self) -> dict:
        """The keys summary.json's ``run`` gets (beside ``kubernetes``, the server's version)."""
        return {"clusterproof": self.source.version, "commit": self.source.commit_field, "dirty": self.source.dirty,
                "kubernetes_client": self.kubernetes_client, "profile_sha256": self.profile_sha256}

    def properties(self) -> dict[str, str]:
        """The same as name -> text: the Allure environment's keys and junit.xml's testsuite properties."""
        out = {"clusterproof.version": self.source.version, "clusterproof.commit": self.source.commit_field,
               "clusterproof.dirty": "unknown" if self.source.dirty is None else str(self.source.dirty).lower(),
               "kubernetes.client": self.kubernetes_client}
        if self.kubernetes_server:
            out["kubernetes.server"] = self.kubernetes_server
        if self.profile is not None:
            out["profile"] = self.profile
        if self.profile_sha256:
            out["profile.sha256"] = self.profile_sha256
        return out


def shown(run: dict) -> str:
    """A summary's origin in a few words: 'clusterproof 0.22.0, commit a1b2c3d4e5f6 (uncommitted changes)'
    ('' for a summary written before these fields existed)."""
    if not run.get("clusterproof"):
        return ""
    return f"clusterproof {run['clusterproof']}, commit {commit_shown(run.get('commit'), run.get('dirty'))}"
