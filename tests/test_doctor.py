"""Help costs nothing, and the doctor names what a run needs: self-tests without a cluster.

``./proof run --help``, ``--version``, ``--co`` and ``--cp-doctor`` answer from the venv alone, with
nothing built: run here against an empty cache (``CLUSTERPROOF_CACHE``), which must stay empty. The
Makefile's ``make -s venv`` is replaced by a stub on PATH, as in tests/test_exit_codes.py (a real one
could reinstall the venv). ``clusterproof doctor`` (``clusterproof.doctor``) lists every prerequisite
of the run its arguments describe: on this machine each is present (exit 0); one taken off PATH in a
child process is named, with its fix, and the doctor exits 4.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterproof import __version__, doctor
from clusterproof.config.profile import load_profile
from tests.harness import ROOT

# What ./proof's fast path may take at most on the loaded two cores (it measured ~5 s beside the self-tests):
# far from the 14-16 minutes a cold set-up took before any word was printed.
FAST_S = 60


def _doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterproof.doctor", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def _lines(out: str) -> dict[str, str]:
    """{prerequisite: its whole line}, from the doctor's output (the verdict line aside)."""
    return {ln[9:].split(":", 1)[0]: ln for ln in out.splitlines() if ln[:9].strip() in ("present", "MISSING",
                                                                                          "unused")}


def _path_without(tmp_path: Path, tool: str) -> str:
    """A PATH holding everything the current one does but ``tool``: links, first found first."""
    bin_dir = tmp_path / f"path-without-{tool}"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            if entry.name != tool and not (bin_dir / entry.name).exists() and os.access(entry.path, os.X_OK):
                (bin_dir / entry.name).symlink_to(entry.path)
    return str(bin_dir)


@pytest.mark.control
def test_on_this_machine_every_prerequisite_of_the_embedded_run_with_a_real_node_is_present():
    run = _doctor("--cp-profile", "smoke", "--cp-set", "real_nodes=1")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _lines(run.stdout)
    for name in ("Python >= 3.11", "Go >= 1.26", "gcc and the C library headers", "openssl", "root",
                 "cgroup v1 hierarchies", "overlayfs", "ip", "unshare", "nsenter", "Java >= 8", "npx",
                 "containerd 1.6.20~ds1-1+deb12u3", "runc 1.1.5+ds1-1+deb12u1"):
        assert name in lines and lines[name].startswith("present"), f"{name}: {lines.get(name)}\n{run.stdout}"
    assert not [ln for ln in lines.values() if ln.startswith("MISSING")], run.stdout
    assert run.stdout.splitlines()[-1].startswith(f"clusterproof doctor: all {len(lines)} prerequisites"), run.stdout


@pytest.mark.control
def test_a_run_against_a_kubeconfig_needs_no_root_real_node_or_openssl(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    run = _doctor("--cp-kubeconfig", str(kubeconfig), "--cp-profile", "smoke")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _lines(run.stdout)
    assert f"kubeconfig {kubeconfig}" in lines and "Go >= 1.26" in lines and "npx" in lines, run.stdout
    assert not {"root", "openssl", "cgroup v1 hierarchies", "ip"} & set(lines), run.stdout


@pytest.mark.parametrize("tool,name,fix,args", [
    ("openssl", "openssl", "apt-get install openssl, or --cp-set component_identities=false", ()),
    ("java", "Java >= 8", "apt-get install default-jre-headless", ()),
    ("npx", "npx", "apt-get install npm", ()),
    ("ip", "ip", "apt-get install iproute2, or --cp-set real_nodes=0", ("--cp-set", "real_nodes=1")),
], ids=["openssl", "java", "npx", "iproute2"])
@pytest.mark.control
def test_a_missing_prerequisite_is_named_with_its_fix_and_exit_4(tmp_path, tool, name, fix, args):
    run = _doctor("--cp-profile", "smoke", *args, env={"PATH": _path_without(tmp_path, tool)})
    assert run.returncode == 4, run.stdout + run.stderr
    line = _lines(run.stdout)[name]
    assert line.startswith(f"MISSING  {name}: {fix}"), line
    assert "1 of " in run.stdout.splitlines()[-1] and f"missing ({name})" in run.stdout.splitlines()[-1], run.stdout


@pytest.mark.control
def test_go_is_missing_only_while_something_is_left_to_build(tmp_path):
    """No Go: with an empty cache the run cannot be set up (MISSING, exit 4); with every binary cached
    nothing needs it (``unused``, exit 0)."""
    no_go = {"PATH": _path_without(tmp_path, "go")}
    empty = _doctor("--cp-profile", "smoke", env={**no_go, "CLUSTERPROOF_CACHE": str(tmp_path / "empty-cache")})
    assert empty.returncode == 4, empty.stdout + empty.stderr
    line = _lines(empty.stdout)["Go >= 1.26"]
    assert line.startswith("MISSING  Go >= 1.26: Go is not installed: install Go >= 1.26") and "kwok v0.8.0" in line
    cached = _doctor("--cp-profile", "smoke", env=no_go)
    assert cached.returncode == 0 and _lines(cached.stdout)["Go >= 1.26"].startswith("unused"), cached.stdout


@pytest.mark.control
def test_the_prerequisites_follow_the_profile():
    """A pure check of the decision (no process): real nodes bring root and the cgroups, none leave them out."""
    with_node = {p.name for p in doctor.prerequisites(doctor.Run(load_profile("smoke", ["real_nodes=1"])))}
    without = {p.name for p in doctor.prerequisites(doctor.Run(load_profile("smoke", ["real_nodes=0"])))}
    assert {"root", "cgroup v1 hierarchies", "overlayfs"} <= with_node - without
    no_identities = doctor.prerequisites(doctor.Run(load_profile("smoke", ["real_nodes=0",
                                                                           "component_identities=false"])))
    assert "openssl" not in {p.name for p in no_identities}


@pytest.mark.control
def test_bad_input_is_one_line_and_4():
    run = _doctor("--cp-set", "no_such_key=1")
    assert run.returncode == 4 and run.stdout == "", run
    assert run.stderr.count("\n") == 1 and "unknown key 'no_such_key'" in run.stderr, run.stderr


# --- ./proof: help costs nothing -----------------------------------------------------------------------

def _proof(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """./proof with an empty cache and a stub make (the venv is what it is), and how long it took."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "make").write_text(f"#!/usr/bin/env bash\necho \"make $*\" >> {tmp_path / 'make.log'}\n")
    (bin_dir / "make").chmod(0o755)
    (tmp_path / "cache").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PROFILE", "ARGS")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", CLUSTERPROOF_CACHE=str(tmp_path / "cache"),
               CLUSTERPROOF_OUTPUT_DIR=str(tmp_path / "out"))
    t0 = time.monotonic()
    run = subprocess.run([str(ROOT / "proof"), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    return run, time.monotonic() - t0


def _nothing_built(tmp_path: Path, run: subprocess.CompletedProcess) -> None:
    assert not any((tmp_path / "cache").iterdir()), sorted((tmp_path / "cache").rglob("*"))
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert (tmp_path / "make.log").read_text().split() == ["make", "-s", "venv"]   # the venv only


@pytest.mark.parametrize("args,expected", [
    (["run", "--help"], "--cp-kubeconfig=KUBECONFIG"),
    (["run", "--version"], "pytest "),
    (["run", "--co", "-q"], "tests collected"),
    (["run", "--collect-only", "-q", "-k", "every_node_is_ready"], "test_every_node_is_ready"),
    (["run", "--cp-doctor", "--cp-set", "real_nodes=0"], "clusterproof doctor: all "),
    (["doctor", "--cp-set", "real_nodes=0"], "clusterproof doctor: "),
], ids=["help", "version", "co", "collect-only", "cp-doctor", "doctor"])
@pytest.mark.control
def test_help_version_collection_and_the_doctor_answer_without_building(tmp_path, args, expected):
    run, took = _proof(tmp_path, *args)
    out = run.stdout + run.stderr
    # The doctor on an empty cache: Go is here, so the builds it names miss nothing.
    assert run.returncode == 0, out[-3000:]
    assert expected in out, out[-3000:]
    _nothing_built(tmp_path, run)
    assert took < FAST_S, f"./proof {' '.join(args)} took {took:.0f} s"
    assert not (tmp_path / "out" / "runs").exists(), "a run was started"


@pytest.mark.unit
def test_the_versions_answer_without_a_venv_or_a_build(tmp_path):
    run, _ = _proof(tmp_path, "--version")
    assert run.returncode == 0 and run.stdout == f"clusterproof {__version__}\n", run
    assert not (tmp_path / "make.log").exists(), "./proof --version needs no venv"
    cli = subprocess.run([Path(sys.executable).with_name("clusterproof"), "--version"], capture_output=True,
                         text=True, timeout=60)
    assert cli.returncode == 0 and cli.stdout == f"clusterproof {__version__}\n", cli
