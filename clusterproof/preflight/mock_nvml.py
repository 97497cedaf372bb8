"""Simulated GPUs: the project's mock NVML library, fault files, and the checker run against them.

Why a module: the checker's self-tests, the harness's preflight agent, the
suite's cross-check and the benchmark all need the same three things -- the
built ``libnvidia-ml.so.1`` (``clusterproof/preflight/checker/mocknvml``, built and cached by the
toolchain), a fault file saying what is wrong with which simulated machine,
and an environment in which the *real* pynvml binding loads that library
(``LD_LIBRARY_PATH``: only a fresh process picks it up, so the checker runs
as a subprocess: ``python -m preflight check``).

The fault catalog is the one list of what the harness injects and the reason
code the checker must answer for it: a fault the checker misses, or a benign
condition it fails a node for, is a defect of the checker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clusterproof import IMPORT_ROOT as ROOT
from clusterproof.core.errors import HarnessError
from clusterproof.provision import toolchain
from clusterproof.provision.toolchain import FAULTS_ENV, MACHINE_ENV


@dataclass(frozen=True)
class Fault:
    """Per-GPU fault spec (the mock's fault file format) and the checker's expected reason code."""
    gpus: dict
    code: str
    what: str


# Each fault kind the harness injects, and what the checker must say (its first reason's code).
FAULTS: dict[str, Fault] = {
    "xid-79": Fault({"3": {"xid": [79]}}, "xid-79", "XID 79 (GPU fell off the bus) on GPU 3"),
    "xid-48": Fault({"0": {"xid": [48]}}, "xid-48", "XID 48 (double-bit ECC) on GPU 0"),
    "xid-94": Fault({"6": {"xid": [94]}}, "xid-94", "XID 94 (contained ECC error) on GPU 6"),
    "gpu-lost": Fault({"5": {"lost": True}}, "gpu-lost", "GPU 5 lost (NVML_ERROR_GPU_IS_LOST)"),
    "gpu-missing": Fault({"7": {"missing": True}}, "gpu-count", "GPU 7 not enumerated (7 of 8 GPUs)"),
    "ecc-uncorrectable": Fault({"2": {"ecc_uncorrected": 3}}, "ecc-uncorrectable",
                               "3 uncorrectable ECC errors on GPU 2"),
    "row-remap-failed": Fault({"1": {"remap_failure": True, "remapped_uncorrectable": 4}}, "row-remap-failed",
                              "row remapping failed on GPU 1"),
    "row-remap-pending": Fault({"4": {"remap_pending": True, "remapped_uncorrectable": 1}}, "row-remap-pending",
                               "row remap pending on GPU 4"),
    "nvlink-down": Fault({"4": {"nvlink_down": [2, 7]}}, "nvlink-down", "NVLinks 2 and 7 down on GPU 4"),
    "pcie-degraded": Fault({"6": {"pcie_width": 8}}, "pcie-degraded", "PCIe x8 instead of x16 on GPU 6"),
    "overheat": Fault({"0": {"temperature_c": 94}}, "temperature", "GPU 0 at 94 °C (slowdown 90 °C)"),
    "hw-slowdown": Fault({"3": {"clock_events": ["hw_slowdown"]}}, "clock-throttle", "hardware slowdown on GPU 3"),
}
# Conditions a healthy node may show; the checker must pass them (a preflight that fails them
# would quarantine good nodes).
BENIGN: dict[str, Fault] = {
    "xid-13-43": Fault({"2": {"xid": [13, 43]}}, "", "application XIDs 13 and 43 on GPU 2"),
    "ecc-corrected": Fault({"1": {"ecc_corrected": 12, "remapped_correctable": 2}}, "",
                           "12 corrected ECC errors, 2 correctable rows remapped on GPU 1"),
    "power-capped": Fault({"4": {"clock_events": ["gpu_idle", "sw_power_cap"]}}, "", "software power cap on GPU 4"),
    "pcie-gen1-idle": Fault({"5": {"pcie_gen": 1}}, "", "idle GPU 5 trained its PCIe link down to gen1"),
}


def library_dir(progress=lambda m: None) -> Path:
    """The directory holding the built mock ``libnvidia-ml.so.1`` (built on first use)."""
    return toolchain.ensure(toolchain.MOCKNVML, progress).directory


def checker_env(faults: Path | None, library: Path | None, base: dict | None = None) -> dict[str, str]:
    """An environment in which ``python -m preflight`` loads ``library`` (None: no NVML library at all)."""
    env = dict(os.environ if base is None else base)
    env.pop(FAULTS_ENV, None)
    env.pop(MACHINE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if library is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(library), *filter(None, [env.get("LD_LIBRARY_PATH")])])
    if faults is not None:
        env[FAULTS_ENV] = str(faults)
    return env


def machine_spec(kind: str | None, model: str = "dgxh100") -> dict:
    """A machine's entry in the fault file: a fault kind, a benign kind, or healthy (None)."""
    spec: dict = {"model": model}
    fault = FAULTS.get(kind) or BENIGN.get(kind) if kind else None
    if kind and fault is None:
        raise ValueError(f"unknown fault kind {kind!r}")
    if fault is not None:
        spec["gpus"] = json.loads(json.dumps(fault.gpus))
    return spec


class FaultFile:
    """The fault file of a run: which simulated machine has which fault; rewritten atomically.

    The mock library re-reads it whenever it changes (size/mtime), so a fault
    injected into an in-service node is seen at that node's next check.
    """

    def __init__(self, path: Path):
        self.path = path
        self.kinds: dict[str, str] = {}

    def set(self, machines: dict[str, str | None]) -> None:
        for name, kind in machines.items():
            if kind is None:
                self.kinds.pop(name, None)
            else:
                machine_spec(kind)  # validates the kind
                self.kinds[name] = kind
        self.write()

    def write(self) -> None:
        body = {"machines": {name: machine_spec(kind) for name, kind in sorted(self.kinds.items())}}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".faults-")
        # Readable by the checker: its container runs as a non-root user (kube.pod_spec), and mkstemp makes 0600.
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        # A new mtime even within the clock's resolution: the size may not change.
        os.replace(tmp, self.path)

    def expected_code(self, name: str) -> str:
        """The reason code the checker must give ``name`` ('' = must pass)."""
        kind = self.kinds.get(name)
        return FAULTS[kind].code if kind in FAULTS else ""


def plan_faults(names: list[str], fraction: float) -> dict[str, str | None]:
    """Which nodes get which fault: ``round(len * fraction)`` faulty nodes (at least one if
    ``fraction`` > 0), spread evenly over the list and cycling through every fault kind; then one
    node per benign kind among the healthy ones (if there are enough). Deterministic. Pure."""
    n = len(names)
    faulty = max(1, round(n * fraction)) if fraction > 0 and n else 0
    faulty = min(faulty, n)
    step = n / faulty if faulty else 0
    picks = [names[int(i * step)] for i in range(faulty)]
    kinds = list(FAULTS)
    plan: dict[str, str | None] = {name: None for name in names}
    for i, name in enumerate(picks):
        plan[name] = kinds[i % len(kinds)]
    healthy = [x for x in names if plan[x] is None]
    benign = list(BENIGN)
    if len(healthy) > 2 * len(benign):
        stride = len(healthy) // len(benign)
        for i, kind in enumerate(benign):
            plan[healthy[i * stride + stride // 2]] = kind
    return plan


@dataclass
class CheckerRun:
    returncode: int
    verdicts: dict[str, dict]     # machine -> verdict (JSON)
    stderr: str


def run_checker(machines: list[str] | None, env: dict[str, str], *args: str, timeout: float = 300) -> CheckerRun:
    """``python -m preflight check`` as a fresh process (so ``LD_LIBRARY_PATH`` decides the library)."""
    cmd = [sys.executable, "-m", "clusterproof.preflight.checker", "check", *args]
    for m in machines or []:
        cmd += ["--machine", m]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"the preflight checker did not finish within {timeout:g} s") from None
    verdicts = {}
    for line in proc.stdout.splitlines():
        if line.strip():
            v = json.loads(line)
            verdicts[v["machine"]] = v
    return CheckerRun(proc.returncode, verdicts, proc.stderr.strip())
