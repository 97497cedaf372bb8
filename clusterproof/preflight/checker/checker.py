"""The checks: a node's GPUs through NVML, one verdict with one reason per failed check.

Each check and why it fails a node (the ``id`` is what a node's reason label
carries; the order is the order of severity, the first reason names the node):

- ``gpu-lost``: a GPU's handle or a query answers NVML_ERROR_GPU_IS_LOST (the
  driver lost it; XID 79's usual aftermath).
- ``gpu-count``: NVML sees another number of GPUs than expected (one fell off
  the bus before the driver enumerated it).
- ``xid``: a fatal XID arrived through NVML events during the watch window
  (``xids.py`` says which are fatal, after NVIDIA's device plugin); the
  reason id names the first one, e.g. ``xid-79``.
- ``ecc-uncorrectable``: volatile uncorrected ECC errors since the driver
  loaded (``nvmlDeviceGetTotalEccErrors``); corrected ones are reported, not failed.
- ``row-remap-failed`` / ``row-remap-pending``: a row remap failed (the GPU
  needs an RMA) or waits for a GPU reset (``nvmlDeviceGetRemappedRows``).
- ``nvlink-down``: an NVLink the GPU has is inactive.
- ``pcie-degraded``: the PCIe link is narrower than the GPU's maximum, or
  (only while the GPU is busy) slower: an idle GPU trains its link down to
  save power, so a lower generation at idle is normal and not failed.
- ``temperature``: at or above the GPU's own slowdown threshold (NVML), or
  ``max_temp_c`` where the GPU does not report one.
- ``clock-throttle``: clocks held down by hardware slowdown, hardware or
  software thermal slowdown, or the power brake (power capping, idle,
  application clocks and sync boost are normal operation).

A check the GPU does not support (NVML_ERROR_NOT_SUPPORTED: ECC off, no
NVLink, pre-Ampere row remapping) is recorded as skipped with its reason,
never silently passed.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, field

import pynvml as nv

from . import xids

CHECK_ORDER = ("gpu-lost", "gpu-count", "xid", "ecc-uncorrectable", "row-remap-failed", "row-remap-pending",
               "nvlink-down", "pcie-degraded", "temperature", "clock-throttle")
# Clock event reasons that mean the hardware is protecting itself (nvmlClocksEventReason*).
THROTTLE_BAD = {0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                0x80: "hw_power_brake_slowdown"}
THROTTLE_OK = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x10: "sync_boost",
               0x100: "display_clocks"}
GPU_IDLE = 0x1
DEFAULT_MAX_TEMP_C = 85     # only where NVML has no slowdown threshold for the GPU
MACHINE_ENV = "CLUSTERPROOF_NVML_MACHINE"   # read by the project's mock library only


class CannotCheck(Exception):
    """NVML cannot be used here at all; str(e) is the one line to print (exit 4)."""


@dataclass
class Reason:
    check: str                 # one of CHECK_ORDER
    code: str                  # label-safe id: the check, or e.g. "xid-79"
    gpus: list[int]
    message: str


@dataclass
class Verdict:
    machine: str
    ok: bool
    reasons: list[Reason]
    checks: dict[str, str]                     # check -> "pass" | "fail" | "skipped: why"
    gpus: list[dict]                           # one row per GPU, for the report's GPU table
    expected_gpus: int | None
    driver: str = ""
    nvml: str = ""
    library: str = ""
    seconds: float = 0.0

    @property
    def code(self) -> str:
        """The first reason's id (what a node's reason label carries); '' when ok."""
        return self.reasons[0].code if self.reasons else ""

    def summary(self) -> str:
        return "; ".join(r.message for r in self.reasons) or "all checks passed"

    def as_dict(self) -> dict:
        return {**asdict(self), "code": self.code}


@dataclass
class Options:
    expected_gpus: int | None = None
    xid_window_ms: int = 1000
    ignored_xids: frozenset[int] = xids.APPLICATION_XIDS
    max_temp_c: int = DEFAULT_MAX_TEMP_C


@dataclass
class _Findings:
    """What the checks found, per check (messages and GPUs), before it becomes a verdict."""
    fails: dict[str, list[tuple[int | None, str, str]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def fail(self, check: str, gpu: int | None, message: str, code: str | None = None) -> None:
        self.fails.setdefault(check, []).append((gpu, message, code or check))

    def skip(self, check: str, why: str) -> None:
        self.skipped.setdefault(check, why)


def _call(fn, *args):
    """(value, None) or (None, NVMLError)."""
    try:
        return fn(*args), None
    except nv.NVMLError as e:
        return None, e


def _error_name(e: nv.NVMLError) -> str:
    """pynvml's class name (NVMLError_GpuIsLost), or the code for one it has no class for."""
    return type(e).__name__ if type(e) is not nv.NVMLError else f"NVML error {e.value}"


def _loaded_library() -> str:
    """Path of the libnvidia-ml this process loaded (the report says which library answered)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnvidia-ml" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return ""


def nvml_init() -> None:
    """nvmlInit, with every way it can fail as one readable line (CannotCheck)."""
    try:
        nv.nvmlInit()
    except nv.NVMLError_LibraryNotFound:
        raise CannotCheck("no NVML library: libnvidia-ml.so.1 was not found (NVMLError_LibraryNotFound); run on "
                          "a node with the NVIDIA driver installed, or put the directory holding "
                          "libnvidia-ml.so.1 on LD_LIBRARY_PATH") from None
    except nv.NVMLError_LibRmVersionMismatch:
        raise CannotCheck("NVML library and kernel driver do not match (NVMLError_LibRmVersionMismatch: RM has "
                          "detected an NVML/RM version mismatch): the user-space libnvidia-ml is from another "
                          "driver version than the loaded kernel module; reboot the node or reinstall the "
                          "driver") from None
    except nv.NVMLError_DriverNotLoaded:
        raise CannotCheck("the NVIDIA kernel driver is not loaded (NVMLError_DriverNotLoaded): load the nvidia "
                          "module (or fix the driver install) before running preflight") from None
    except nv.NVMLError as e:
        detail = _call(nv.nvmlErrorString, e.value)[0] or str(e)
        raise CannotCheck(f"NVML cannot start ({_error_name(e)}): {detail}") from None


def check(options: Options, machine: str | None = None) -> Verdict:
    """Run every check on the GPUs NVML shows; init and shut NVML down around it.

    ``machine`` (simulation only) selects which simulated machine the
    project's mock library serves; a real library ignores it.
    """
    if machine is not None:
        os.environ[MACHINE_ENV] = machine
    t0 = time.monotonic()
    nvml_init()
    try:
        return _check_initialised(options, machine or os.environ.get(MACHINE_ENV) or socket.gethostname(), t0)
    finally:
        _call(nv.nvmlShutdown)


def _check_initialised(opt: Options, machine: str, t0: float) -> Verdict:
    found = _Findings()
    count = nv.nvmlDeviceGetCount()
    if opt.expected_gpus is not None and count != opt.expected_gpus:
        found.fail("gpu-count", None, f"NVML sees {count} GPU(s), expected {opt.expected_gpus}")
    handles: dict[int, object] = {}
    rows: list[dict] = []
    for i in range(count):
        h, err = _call(nv.nvmlDeviceGetHandleByIndex, i)
        if err is not None:
            found.fail("gpu-lost", i, f"GPU {i}: no handle ({_error_name(err)}: {err})")
            rows.append({"index": i, "error": f"{_error_name(err)}: {err}"})
            continue
        handles[i] = h
    xid_seen = _watch_xids(handles, opt, found)
    for i, h in handles.items():
        rows.append(_check_gpu(i, h, opt, found, xid_seen.get(i, [])))
    rows.sort(key=lambda r: r["index"])
    reasons = []
    for check_id in CHECK_ORDER:
        hits = found.fails.get(check_id)
        if not hits:
            continue
        gpus = sorted({g for g, _, _ in hits if g is not None})
        reasons.append(Reason(check_id, hits[0][2], gpus, "; ".join(m for _, m, _ in hits)))
    checks = {c: ("fail" if c in found.fails else f"skipped: {found.skipped[c]}" if c in found.skipped else "pass")
              for c in CHECK_ORDER}
    return Verdict(machine, not reasons, reasons, checks, rows, opt.expected_gpus,
                   driver=_call(nv.nvmlSystemGetDriverVersion)[0] or "",
                   nvml=_call(nv.nvmlSystemGetNVMLVersion)[0] or "", library=_loaded_library(),
                   seconds=round(time.monotonic() - t0, 4))


def _lost(found: _Findings, i: int, err: nv.NVMLError, what: str) -> bool:
    """A query that says the GPU is gone fails gpu-lost; True if so."""
    if isinstance(err, nv.NVMLError_GpuIsLost):
        found.fail("gpu-lost", i, f"GPU {i}: lost while reading {what} ({_error_name(err)})")
        return True
    return False


def _watch_xids(handles: dict, opt: Options, found: _Findings) -> dict[int, list[int]]:
    """Register every GPU for XID events and collect what arrives within the window."""
    seen: dict[int, list[int]] = {}
    es, err = _call(nv.nvmlEventSetCreate)
    if err is not None:
        found.skip("xid", f"no NVML event set ({_error_name(err)})")
        return seen
    index_of = {}
    try:
        for i, h in handles.items():
            supported, err = _call(nv.nvmlDeviceGetSupportedEventTypes, h)
            if err is not None or not supported & nv.nvmlEventTypeXidCriticalError:
                found.skip("xid", f"GPU {i} cannot report XID events"
                                  + (f" ({_error_name(err)})" if err is not None else ""))
                continue
            _, err = _call(nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, es)
            if err is not None:
                found.skip("xid", f"GPU {i}: XID events not registered ({_error_name(err)})")
                continue
            index_of[_call(nv.nvmlDeviceGetIndex, h)[0]] = i
        deadline = time.monotonic() + opt.xid_window_ms / 1000
        while index_of:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            data, err = _call(nv.nvmlEventSetWait, es, left_ms)
            if err is not None:
                break  # NVML_ERROR_TIMEOUT: the window is over (or nothing is queued)
            if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            idx = index_of.get(_call(nv.nvmlDeviceGetIndex, data.device)[0], -1)
            seen.setdefault(idx, []).append(int(data.eventData))
    finally:
        _call(nv.nvmlEventSetFree, es)
    for i, codes in sorted(seen.items()):
        fatal = [x for x in codes if xids.is_fatal(x, opt.ignored_xids)]
        if fatal:
            found.fail("xid", i, f"GPU {i}: " + ", ".join(xids.describe(x) for x in fatal), code=f"xid-{fatal[0]}")
    return seen


def _check_gpu(i: int, h, opt: Options, found: _Findings, xid_codes: list[int]) -> dict:
    row: dict = {"index": i, "name": _call(nv.nvmlDeviceGetName, h)[0], "uuid": _call(nv.nvmlDeviceGetUUID, h)[0],
                 "xids": xid_codes}
    pci, _ = _call(nv.nvmlDeviceGetPciInfo, h)
    row["bus_id"] = pci.busId if pci is not None else None
    # ECC: volatile counts (since the driver loaded).
    unc, err = _call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
    corr, _ = _call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
    row["ecc_uncorrected"], row["ecc_corrected"] = unc, corr
    if err is not None and not _lost(found, i, err, "ECC counters"):
        found.skip("ecc-uncorrectable", f"GPU {i}: ECC counters unavailable ({_error_name(err)})")
    elif unc:
        found.fail("ecc-uncorrectable", i, f"GPU {i}: {unc} uncorrectable (volatile) ECC error(s)")
    # Row remapping (Ampere and later).
    remap, err = _call(nv.nvmlDeviceGetRemappedRows, h)
    if remap is not None:
        c_rows, u_rows, pending, failure = remap
        row["remapped_rows"] = {"correctable": c_rows, "uncorrectable": u_rows, "pending": bool(pending),
                                "failure": bool(failure)}
        if failure:
            found.fail("row-remap-failed", i, f"GPU {i}: row remapping failed ({u_rows} uncorrectable rows remapped)")
        if pending:
            found.fail("row-remap-pending", i, f"GPU {i}: a row remap is pending (needs a GPU reset)")
    elif not _lost(found, i, err, "remapped rows"):
        for c in ("row-remap-failed", "row-remap-pending"):
            found.skip(c, f"GPU {i}: no row remapping ({_error_name(err)})")
    _check_nvlinks(i, h, found, row)
    reasons_bits, err = _call(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
    if err is not None and not _lost(found, i, err, "clock event reasons"):
        found.skip("clock-throttle", f"GPU {i}: clock event reasons unavailable ({_error_name(err)})")
    bits = reasons_bits or 0
    row["clock_events"] = [n for b, n in sorted({**THROTTLE_BAD, **THROTTLE_OK}.items()) if bits & b]
    bad = [n for b, n in sorted(THROTTLE_BAD.items()) if bits & b]
    if bad:
        found.fail("clock-throttle", i, f"GPU {i}: clocks held down by {', '.join(bad)}")
    _check_pcie(i, h, found, row, idle=bool(bits & GPU_IDLE))
    _check_temperature(i, h, opt, found, row)
    return row


def _check_nvlinks(i: int, h, found: _Findings, row: dict) -> None:
    up, down = 0, []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        state, err = _call(nv.nvmlDeviceGetNvLinkState, h, link)
        if err is not None:
            if _lost(found, i, err, f"NVLink {link}"):
                return
            continue  # NOT_SUPPORTED / INVALID_ARGUMENT: the GPU has no such link
        if state == nv.NVML_FEATURE_ENABLED:
            up += 1
        else:
            down.append(link)
    row["nvlinks_up"], row["nvlinks"] = up, up + len(down)
    if not up and not down:
        found.skip("nvlink-down", f"GPU {i} reports no NVLinks")
    if down:
        found.fail("nvlink-down", i, f"GPU {i}: NVLink {', '.join(map(str, down))} down ({up} of {up + len(down)} up)")


def _check_pcie(i: int, h, found: _Findings, row: dict, idle: bool) -> None:
    gen, e1 = _call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
    max_gen, e2 = _call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
    width, e3 = _call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)
    max_width, e4 = _call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
    err = e1 or e2 or e3 or e4
    if err is not None:
        if not _lost(found, i, err, "the PCIe link"):
            found.skip("pcie-degraded", f"GPU {i}: PCIe link unavailable ({_error_name(err)})")
        return
    row["pcie"] = f"gen{gen} x{width} (max gen{max_gen} x{max_width})"
    problems = []
    if width < max_width:
        problems.append(f"x{width} instead of x{max_width}")
    if gen < max_gen and not idle:
        problems.append(f"gen{gen} instead of gen{max_gen} under load")
    if problems:
        found.fail("pcie-degraded", i, f"GPU {i}: PCIe link {' and '.join(problems)}")


def _check_temperature(i: int, h, opt: Options, found: _Findings, row: dict) -> None:
    temp, err = _call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
    if err is not None:
        if not _lost(found, i, err, "the temperature"):
            found.skip("temperature", f"GPU {i}: temperature unavailable ({_error_name(err)})")
        return
    slowdown, _ = _call(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    limit, source = (slowdown, "its slowdown threshold") if slowdown else (opt.max_temp_c, "max_temp_c")
    row["temperature_c"], row["slowdown_c"] = temp, slowdown
    if temp >= limit:
        found.fail("temperature", i, f"GPU {i}: {temp} °C, at or above {source} ({limit} °C)")
