"""A backfilled Prometheus history shaped like N GPU nodes, built once per shape and cached.

Why: the seed's Prometheus died answering queries over a 7,500-node
cluster's series; an embedded cluster scrapes only its own control plane
(a few thousand series). So the harness writes the history such a cluster
would have -- per node: node-exporter, dcgm-exporter (one set per GPU),
kube-state-metrics' node series and the kubelet's latency histograms (the
buckets a ``{le!=""}`` matcher finds) -- as OpenMetrics text, and turns it
into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``.

Series per node (``series_per_node``; 8 GPUs): node-exporter 125 (CPU time by
mode for 8 of the cores, memory, filesystems, network, disks, load, ...),
dcgm-exporter 12 per GPU (96), kube-state-metrics 30, kubelet histograms 167
(of which 145 ``_bucket`` series) -- 418 series, 145 of them buckets. At
7,500 nodes: 3.14 M series, 1.09 M buckets; 30 points each at 60 s: 94 M samples. That is a trimmed node (a real
96-core node-exporter alone exports ~1,000 series, cAdvisor many more):
sized so that the 7,500-node history is built in a few minutes and read by
a Prometheus well inside this 24 GiB machine, while the seed's queries over
it still take far longer than any sane query timeout.

Speed: every series of a family has the same values (only the node labels
differ), so a family's text is one template per label set, stamped per node
with ``str.replace`` (C speed), and a shard's text (``SHARD_NODES`` nodes) is
written once and stamped per shard; ``promtool`` parses each shard once (all
points fall in one 2 h block), two at a time. Cache: blocks are kept under
``$CLUSTERPROOF_CACHE/prometheus/history/<shape key>`` and hard-linked into
each run's data directory (TSDB block files are immutable: Prometheus
replaces files, it never writes into them), so only the first run of a
shape pays. The points keep their original time: queries over the history
name its window (``History.start``/``end``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from clusterproof.core import filelock
from clusterproof.core.errors import HarnessError
from clusterproof.core.processes import die_with_parent
from clusterproof.core.progress import heartbeat, say, to_terminal
from clusterproof.provision import toolchain

# Bump when the generated text changes: part of the cache key.
GENERATOR_VERSION = 3
BLOCK_S = 7200            # Prometheus' block range: the whole history falls into one block
SHARD_NODES = 500         # nodes per promtool run (~1 GB of promtool memory each)
MARK = "\x00"             # placeholder for the node's name in a family's text
SHARD_MARK = "\x01"       # placeholder for the shard's part of a node's name in a shard's text

CPU_MODES = ("user", "system", "idle", "iowait", "irq", "softirq", "steal", "nice")
DCGM_FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED",
               "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
               "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
               "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
# The kubelet's bucket layouts (component-base defaults for these histograms, shortened to 12 bounds).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
POD_START_BUCKETS = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120)
RUNTIME_OPS = ("create_container", "start_container", "stop_container", "remove_container",
               "list_containers", "container_status")
CLIENT_VERBS = ("GET", "PUT", "PATCH", "POST")


@dataclass(frozen=True)
class Shape:
    """What a history looks like: how many nodes, GPUs per node, how long, how dense."""
    nodes: int
    gpus: int
    minutes: int
    interval_s: int

    @property
    def points(self) -> int:
        return self.minutes * 60 // self.interval_s

    @property
    def key(self) -> str:
        raw = json.dumps({**asdict(self), "v": GENERATOR_VERSION, "prometheus": toolchain.PROMETHEUS_VERSION},
                         sort_keys=True)
        return f"n{self.nodes}-g{self.gpus}-m{self.minutes}-i{self.interval_s}-" + hashlib.sha256(
            raw.encode()).hexdigest()[:8]

    def series_per_node(self) -> tuple[int, int]:
        """(series, of which histogram buckets) one node contributes."""
        series = buckets = 0
        for fam in families(self.gpus):
            for _labels, kind, n_buckets in fam.series:
                series += 1 if kind != "histogram" else n_buckets + 1 + 2   # buckets, +Inf, _sum, _count
                buckets += n_buckets + 1 if kind == "histogram" else 0
        return series, buckets

    def node_labelled_series(self) -> int:
        """Series of one node that carry its ``node`` label (all but dcgm-exporter's)."""
        return sum(1 if kind != "histogram" else n + 3 for fam in families(self.gpus)
                   for labels, kind, n in fam.series if 'node="{node}"' in labels)

    @property
    def series(self) -> int:
        return self.nodes * self.series_per_node()[0]

    @property
    def bucket_series(self) -> int:
        return self.nodes * self.series_per_node()[1]

    @property
    def samples(self) -> int:
        return self.series * self.points


def shape_of(profile) -> Shape:
    """The history a profile asks for (``prometheus_backfill_*``; as many nodes as the cluster by default)."""
    return Shape(profile.prometheus_backfill_nodes or profile.nodes, profile.node_gpus,
                 profile.prometheus_backfill_minutes, profile.prometheus_backfill_interval_s)


@dataclass(frozen=True)
class Family:
    """One metric family: per node, the same label sets (``{node}`` filled in per node)."""
    name: str
    kind: str                                     # counter, gauge, histogram
    series: tuple[tuple[str, str, int], ...]      # (labels with a {node} field, kind, buckets)
    buckets: tuple[float, ...] = ()


def families(gpus: int) -> list[Family]:
    ne = 'job="node-exporter",instance="{node}:9100",node="{node}"'
    dc = 'job="dcgm-exporter",instance="{node}:9400",Hostname="{node}",modelName="NVIDIA H100 80GB HBM3"'
    ks = 'job="kube-state-metrics",instance="kube-state-metrics:8080",node="{node}"'
    kl = 'job="kubelet",instance="{node}:10250",node="{node}"'

    def one(labels: str, kind: str) -> tuple:
        return ((labels, kind, 0),)
    out = [
        Family("node_cpu_seconds_total", "counter",
               tuple((f'{ne},cpu="{c}",mode="{m}"', "counter", 0) for c in range(8) for m in CPU_MODES)),
    ]
    out += [Family(f"node_memory_{m}_bytes", "gauge", one(ne, "gauge"))
            for m in ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "Active", "Inactive",
                      "Dirty", "SwapTotal", "SwapFree")]
    mounts = ("/", "/var/lib/kubelet", "/raid")
    out += [Family(f"node_filesystem_{m}_bytes", "gauge",
                   tuple((f'{ne},mountpoint="{p}",fstype="ext4",device="/dev/md{i}"', "gauge", 0)
                         for i, p in enumerate(mounts))) for m in ("avail", "size", "free")]
    nics = ("eth0", "ib0", "ib1", "ib2")
    out += [Family(f"node_network_{d}_bytes_total", "counter",
                   tuple((f'{ne},device="{n}"', "counter", 0) for n in nics)) for d in ("receive", "transmit")]
    out += [Family(f"node_network_{d}_errs_total", "counter",
                   tuple((f'{ne},device="{n}"', "counter", 0) for n in nics)) for d in ("receive", "transmit")]
    out += [Family(f"node_load{m}", "gauge", one(ne, "gauge")) for m in (1, 5, 15)]
    out += [Family(f"node_disk_{d}_total", "counter",
                   tuple((f'{ne},device="nvme{i}n1"', "counter", 0) for i in range(2)))
            for d in ("read_bytes", "written_bytes", "io_time_seconds")]
    out += [Family(f"node_{m}", "gauge", one(ne, "gauge")) for m in ("boot_time_seconds", "time_seconds",
                                                                     "procs_running", "procs_blocked",
                                                                     "context_switches", "intr")]
    out += [Family(f"node_{m}", "gauge", one(ne, "gauge")) for m in ("entropy_available_bits", "filefd_allocated",
                                                                     "filefd_maximum", "nf_conntrack_entries",
                                                                     "sockstat_TCP_inuse", "sockstat_used",
                                                                     "uname_info", "os_info", "timex_offset_seconds",
                                                                     "vmstat_pgfault", "vmstat_oom_kill")]
    out += [Family(f, "gauge", tuple((f'{dc},gpu="{g}",UUID="GPU-{{node}}-{g}",device="nvidia{g}"', "gauge", 0)
                                     for g in range(gpus))) for f in DCGM_FIELDS]
    conditions = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
    out.append(Family("kube_node_status_condition", "gauge",
                      tuple((f'{ks},condition="{c}",status="{s}"', "gauge", 0)
                            for c in conditions for s in ("true", "false", "unknown"))))
    resources = ("cpu", "memory", "nvidia_com_gpu", "pods")
    for fam in ("kube_node_status_capacity", "kube_node_status_allocatable"):
        out.append(Family(fam, "gauge", tuple((f'{ks},resource="{r}",unit="core"', "gauge", 0) for r in resources)))
    out += [Family(f"kube_node_{m}", "gauge", one(ks, "gauge"))
            for m in ("info", "labels", "spec_taint", "spec_unschedulable", "created", "annotations", "role")]
    out.append(Family("kubelet_pod_start_duration_seconds", "histogram",
                      ((kl, "histogram", len(POD_START_BUCKETS)),), POD_START_BUCKETS))
    out.append(Family("kubelet_runtime_operations_duration_seconds", "histogram",
                      tuple((f'{kl},operation_type="{o}"', "histogram", len(LATENCY_BUCKETS)) for o in RUNTIME_OPS),
                      LATENCY_BUCKETS))
    out.append(Family("rest_client_request_duration_seconds", "histogram",
                      tuple((f'{kl},verb="{v}",host="kube-apiserver:6443"', "histogram", len(LATENCY_BUCKETS))
                            for v in CLIENT_VERBS), LATENCY_BUCKETS))
    return out


def window_for(shape: Shape, now: float) -> tuple[int, int]:
    """(first, last) sample time in s: inside the last complete 2 h block before ``now``."""
    start = (int(now) // BLOCK_S - 1) * BLOCK_S
    return start, start + (shape.points - 1) * shape.interval_s


def _templates(fam: Family, shape: Shape, start: int) -> list[str]:
    """One text per label set of the family, with MARK where the node's name goes: every point of it (a
    histogram point is all its buckets, _count and _sum at one time, as one scrape exposes them)."""
    out = []
    p, iv = shape.points, shape.interval_s
    ts = [start + k * iv for k in range(p)]
    for i, (labels, kind, _n) in enumerate(fam.series):
        share = (i + 1) / (len(fam.series) + 1)
        series = labels.replace("{node}", MARK)
        if kind == "counter":
            out.append("".join(f"{fam.name}{{{series}}} {int(1000 * share * (k + 1) * iv)} {t}\n"
                               for k, t in enumerate(ts)))
        elif kind == "gauge":
            out.append("".join(f"{fam.name}{{{series}}} {50 + 40 * math.sin(share * 7 + k / 5):.2f} {t}\n"
                               for k, t in enumerate(ts)))
        else:
            lines = []
            for k, t in enumerate(ts):
                calls = int(20 * share * (k + 1) * iv)      # observations so far
                for j, le in enumerate((*fam.buckets, math.inf)):
                    frac = 1.0 if math.isinf(le) else min(1.0, (j + 1) / (len(fam.buckets) * 0.8))
                    le_s = "+Inf" if math.isinf(le) else repr(float(le))
                    lines.append(f'{fam.name}_bucket{{{series},le="{le_s}"}} {int(calls * frac)} {t}\n')
                lines.append(f"{fam.name}_count{{{series}}} {calls} {t}\n")
                lines.append(f"{fam.name}_sum{{{series}}} {calls * 0.3 * share:.3f} {t}\n")
            out.append("".join(lines))
    return out


def node_names(n: int) -> list[str]:
    """The history's node names: gpu-node-<shard>-<index in the shard> (see ``build``)."""
    return [f"gpu-node-{i // SHARD_NODES:02d}-{i % SHARD_NODES:03d}" for i in range(n)]


def openmetrics(shape: Shape, start: int, nodes: list[str]) -> Iterator[str]:
    """The history of ``nodes`` as OpenMetrics text, in chunks (a family's samples stay together)."""
    for fam in families(shape.gpus):
        yield f"# TYPE {fam.name.removesuffix('_total') if fam.kind == 'counter' else fam.name} {fam.kind}\n"
        for body in _templates(fam, shape, start):
            # One chunk per label set: every node's copy of it, each node's points together.
            yield "".join(body.replace(MARK, node) for node in nodes)
    yield "# EOF\n"


@dataclass
class History:
    """A built history: where its blocks are and what they hold."""
    shape: Shape
    directory: Path
    start: int            # first sample, unix seconds
    end: int              # last sample
    series: int
    bucket_series: int
    samples: int
    build_s: float        # what generating + promtool took when it was built
    cached: bool          # this run found it in the cache

    def blocks(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if p.is_dir() and (p / "meta.json").exists())


def cache_dir(shape: Shape) -> Path:
    return toolchain.cache_root() / "prometheus" / "history" / shape.key


def build(shape: Shape, progress: Callable[[str], None] = say, now: float | None = None,
          parallel: int = 2) -> History:
    """The history of ``shape``: from the cache, or generated and backfilled (then cached).

    Built in shards of ``SHARD_NODES`` nodes, ``parallel`` promtool processes at a time: one
    promtool holds every series of its input in memory (~5 KB each), so a 7,500-node history in
    one piece would need ~15 GB. The shards' blocks overlap in time; the embedded Prometheus
    reads them as they are (``--no-storage.tsdb.allow-overlapping-compaction``).
    """
    target = cache_dir(shape)
    cached = _cached(shape, target)
    if cached is not None:
        return cached
    with filelock.held(target.parent / f".{shape.key}.lock",
                       f"waiting for another process's build of the {shape.nodes:,}-node history", progress):
        return _cached(shape, target) or _build(shape, target, progress, now, parallel)


def _cached(shape: Shape, target: Path) -> History | None:
    info = target / "history.json"
    if not info.exists():
        return None
    d = json.loads(info.read_text())
    return History(shape, target, d["start"], d["end"], d["series"], d["bucket_series"], d["samples"],
                   d["build_s"], cached=True)


def _build(shape: Shape, target: Path, progress: Callable[[str], None], now: float | None,
           parallel: int) -> History:
    promtool = toolchain.ensure(toolchain.PROMETHEUS).path("promtool")
    start, end = window_for(shape, time.time() if now is None else now)
    progress(f"building a Prometheus history of {shape.nodes:,} nodes ({shape.series:,} series, "
             f"{shape.samples:,} samples; first run of this shape only, cached in {target})")
    t0 = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{shape.key}-", dir=target.parent))
    stage: dict = {"size": 0, "written": 0, "shards": []}

    def status() -> str:
        shards = stage["shards"]
        return (f"promtool backfilling: {sum(f.done() for f in shards)} of {len(shards)} shards done" if shards else
                f"writing the OpenMetrics text of a {stage['size']}-node shard ({stage['written'] / 1e6:.0f} MB)")
    try:
        blocks = work / "blocks"
        blocks.mkdir()
        sizes = [min(SHARD_NODES, shape.nodes - i) for i in range(0, shape.nodes, SHARD_NODES)]
        with heartbeat(f"the {shape.nodes:,}-node Prometheus history to be built", status=status):
            # Every shard's text is the same but for the shard's number in its node names: written once
            # per shard size with a placeholder, then stamped per shard.
            templates = {}
            for size in sorted(set(sizes)):
                templates[size] = work / f"template-{size}.om"
                stage["size"], stage["written"] = size, 0
                with templates[size].open("w") as fh:
                    for chunk in openmetrics(shape, start, [f"{SHARD_MARK}-{j:03d}" for j in range(size)]):
                        fh.write(chunk)
                        stage["written"] += len(chunk)
            with ThreadPoolExecutor(max(1, parallel)) as pool:
                stage["shards"] = [pool.submit(backfill_shard, promtool, templates[size], f"gpu-node-{k:02d}",
                                               work / f"shard-{k}", blocks) for k, size in enumerate(sizes)]
                for f in stage["shards"]:
                    f.result()
        build_s = time.monotonic() - t0
        (blocks / "history.json").write_text(json.dumps({
            "shape": asdict(shape), "start": start, "end": end, "series": shape.series,
            "bucket_series": shape.bucket_series, "samples": shape.samples, "build_s": round(build_s, 1),
            "shards": len(sizes)}))
        if target.exists():
            shutil.rmtree(target)   # a half-written one (no history.json): replaced
        blocks.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"built the {shape.nodes:,}-node history in {build_s:.0f} s")
    return History(shape, target, start, end, shape.series, shape.bucket_series, shape.samples, build_s, cached=False)


def backfill_shard(promtool: Path, template: Path, prefix: str, work: Path, blocks: Path) -> None:
    """One shard: its OpenMetrics text (the template, stamped with ``prefix``), promtool's blocks
    from it, the blocks moved to ``blocks``."""
    work.mkdir()
    text, out = work / "history.om", work / "blocks"
    out.mkdir()
    mark, stamp = SHARD_MARK.encode(), prefix.encode()
    with template.open("rb") as src, text.open("wb") as dst:
        while chunk := src.read(16 << 20):
            dst.write(chunk.replace(mark, stamp))
    proc = subprocess.run([str(promtool), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(text), str(out)],
                          capture_output=True, text=True, preexec_fn=die_with_parent)
    text.unlink()
    if proc.returncode != 0:
        raise HarnessError(f"promtool could not backfill the history (shard {prefix}): "
                           f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    for block in out.iterdir():
        block.rename(blocks / block.name)


def link_into(history: History, data_dir: Path) -> None:
    """Hard-link the history's blocks into a Prometheus data directory (copy across file systems)."""
    for block in history.blocks():
        dest = data_dir / block.name
        for src in block.rglob("*"):
            out = dest / src.relative_to(block)
            if src.is_dir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, out)
            except OSError:
                shutil.copy2(src, out)


def main(argv: list[str]) -> int:
    """``python -m clusterproof.prometheus.history --cp-profile nightly [--cp-set key=value ...]``: build (or find) the
    profile's history ahead of a run, e.g. before a timed nightly job."""
    import sys

    from clusterproof.config.profile import load_profile
    from clusterproof.core import exitcodes
    from clusterproof.core.errors import ArgumentParser
    ap = ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--cp-profile", "--profile", dest="profile", default="smoke")   # a run's spellings, both
    ap.add_argument("--cp-set", "--set", action="append", default=[], dest="overrides")
    args = ap.parse_args(argv)
    try:
        to_terminal()   # the build's heartbeats, timestamped, on stderr
        shape = shape_of(load_profile(args.profile, args.overrides))
    except HarnessError as e:   # a bad profile or --cp-set: 4
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        h = build(shape, progress=lambda m: print(m, flush=True))
    except HarnessError as e:   # the build failed: a set-up failure, 8
        print(f"clusterproof: {e}", file=sys.stderr)
        return exitcodes.SETUP_FAILED
    print(f"{h.shape.nodes:,}-node history: {h.series:,} series ({h.bucket_series:,} buckets), {h.samples:,} samples, "
          f"{len(h.blocks())} blocks in {h.directory} ({'cached' if h.cached else f'built in {h.build_s:.0f} s'})")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
