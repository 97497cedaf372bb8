"""The embedded Prometheus: started by the harness on loopback, owned like a cluster component.

Why the harness starts it itself (not kwokctl's ``--prometheus-port``): the
suite needs its own query limits (``--query.timeout``,
``--query.max-samples``, ``--query.max-concurrency``, GOMAXPROCS from the
profile), a backfilled history in its data directory before it starts, and
restarts for the WAL-replay benchmark.

What it scrapes: on the embedded cluster, every component kwokctl declares a
metrics endpoint for in the cluster's own ``kwok.yaml`` (kube-apiserver,
kube-controller-manager, kube-scheduler, etcd, the kwok controller), with
the client certificate kwokctl made (``pki/admin.crt``); on an existing
cluster (``--cp-kubeconfig``), its API server's ``/metrics`` with the
kubeconfig's credentials. Plus itself.

Ownership, as ``clusterproof.core.processes`` defines it: the process gets a process
group of its own and dies with the harness (``PR_SET_PDEATHSIG``); its
command line names its directory and its pid file sits in that directory,
so ``owned_process`` can tell it from any other Prometheus. The directory
lives inside the embedded cluster's (removed with the cluster, also by the
sweeper after a killed run) or, for an existing cluster, under
``$CLUSTERPROOF_CACHE/prometheus/runs/`` with an owner record that a later
run sweeps once its owner is gone.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import psutil
import yaml

from clusterproof.core import progress
from clusterproof.core.errors import HarnessError
from clusterproof.core.ports import free_port
from clusterproof.core.processes import (
    OWNER_FILE,
    claim_directory,
    elsewhere_note,
    last_words,
    own_session_dying_with_parent,
    owned_process,
    owner_alive,
    owner_elsewhere,
    stop_group,
)
from clusterproof.core.waiting import wait_for
from clusterproof.prometheus.client import Prom
from clusterproof.provision import toolchain

PID_FILE = "prometheus.pid"
# History blocks keep their original time: retention must never delete them.
RETENTION = "10y"


@dataclass(frozen=True)
class Limits:
    """The query limits a Prometheus runs with (profile keys ``prometheus_*``)."""
    query_timeout: str          # --query.timeout, a Prometheus duration
    max_samples: int            # --query.max-samples
    max_concurrency: int        # --query.max-concurrency
    gomaxprocs: int = 0         # GOMAXPROCS (0: Go's default, every core)

    @classmethod
    def of(cls, profile) -> "Limits":
        """The limits the profile requires of the Prometheus under test."""
        return cls(profile.prometheus_query_timeout, profile.prometheus_max_samples,
                   profile.prometheus_max_concurrency, profile.prometheus_gomaxprocs)

    @classmethod
    def embedded(cls, profile) -> "Limits":
        """The flags the embedded Prometheus runs with: the required limits, unless
        ``prometheus_embedded_query_timeout`` misconfigures its timeout (a negative control)."""
        return replace(cls.of(profile), query_timeout=profile.prometheus_embedded_query_timeout
                       or profile.prometheus_query_timeout)

    def flags(self) -> list[str]:
        return [f"--query.timeout={self.query_timeout}", f"--query.max-samples={self.max_samples}",
                f"--query.max-concurrency={self.max_concurrency}"]


def scrape_jobs_from_kwok(cluster_dir: Path) -> list[dict]:
    """Scrape configs for every component of an embedded cluster that declares a metrics endpoint."""
    jobs = []
    for doc in yaml.safe_load_all((cluster_dir / "kwok.yaml").read_text()):
        if not isinstance(doc, dict) or doc.get("kind") != "KwokctlConfiguration":
            continue
        for comp in doc.get("components") or []:
            m = comp.get("metric")
            if not m or not m.get("host"):
                continue
            job = {"job_name": comp["name"], "scheme": m.get("scheme", "http"),
                   "metrics_path": m.get("path", "/metrics"), "static_configs": [{"targets": [m["host"]]}]}
            if job["scheme"] == "https":
                tls = {"insecure_skip_verify": bool(m.get("insecureSkipVerify", False))}
                if m.get("certPath"):
                    tls.update(cert_file=m["certPath"], key_file=m["keyPath"])
                job["tls_config"] = tls
            jobs.append(job)
    if not jobs:
        raise HarnessError(f"{cluster_dir / 'kwok.yaml'} declares no component metrics endpoint to scrape")
    return jobs


def scrape_job_from_api(api, directory: Path) -> list[dict]:
    """A scrape config for an existing cluster's API server, with the kubeconfig's credentials
    (a bearer token goes to a 0600 file in the run's own directory, never into the config)."""
    cfg = api.configuration
    scheme, _, hostport = cfg.host.partition("://")
    path_prefix = ""
    if "/" in hostport:
        hostport, _, rest = hostport.partition("/")
        path_prefix = "/" + rest
    job = {"job_name": "kube-apiserver", "scheme": scheme, "metrics_path": f"{path_prefix}/metrics",
           "static_configs": [{"targets": [hostport]}]}
    tls = {"insecure_skip_verify": not cfg.verify_ssl}
    if cfg.ssl_ca_cert:
        tls["ca_file"] = cfg.ssl_ca_cert
    if cfg.cert_file:
        tls.update(cert_file=cfg.cert_file, key_file=cfg.key_file)
    job["tls_config"] = tls
    auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if auth:
        token = directory / "apiserver.token"
        token.touch(mode=0o600)
        token.write_text(auth.split(" ", 1)[-1])
        job["authorization"] = {"credentials_file": str(token)}
    return [job]


@dataclass
class PromServer:
    """One embedded Prometheus: its directory (config, data, log, pid file) and its process."""
    directory: Path
    limits: Limits
    scrape_jobs: list[dict]
    scrape_interval_s: float
    port: int = 0
    proc: subprocess.Popen | None = None
    extra_flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "prometheus.log"

    def write_config(self) -> Path:
        iv = f"{self.scrape_interval_s:g}s"
        doc = {"global": {"scrape_interval": iv, "scrape_timeout": iv, "evaluation_interval": "1m"},
               "scrape_configs": [{"job_name": "prometheus",
                                   "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]},
                                  *self.scrape_jobs],
               "storage": {"tsdb": {"retention": {"time": RETENTION}}}}
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def command(self) -> list[str]:
        return [str(toolchain.PROMETHEUS.path("prometheus")),
                f"--config.file={self.directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *self.limits.flags(),
                # The history is several blocks over the same time (built in shards): leave
                # them as they are instead of merging them while the suite measures.
                "--no-storage.tsdb.allow-overlapping-compaction",
                *self.extra_flags]

    def start(self, timeout: float = 300) -> "PromServer":
        toolchain.ensure(toolchain.PROMETHEUS)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        if not self.port:
            self.port = free_port()
        self.write_config()
        env = {**os.environ, **self.env}
        if self.limits.gomaxprocs:
            env["GOMAXPROCS"] = str(self.limits.gomaxprocs)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=own_session_dying_with_parent)
        (self.directory / PID_FILE).write_text(str(self.proc.pid))
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /-/ready answers 200 (after WAL replay); names the log if it never does."""
        t0 = time.monotonic()
        prom = Prom(self.url)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise HarnessError(f"Prometheus exited with {self.proc.returncode} while starting: "
                                   f"{last_words(self.log, 300)} (log: {self.log})")
            try:
                return prom.session.get(f"{self.url}/-/ready", timeout=2).status_code == 200
            except Exception:
                return False
        wait_for(ready, timeout=timeout, interval=0.2, what=f"Prometheus ready at {self.url} (log: {self.log})")
        return time.monotonic() - t0

    def stop(self, grace_s: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc, grace_s)
        self.proc = None
        # A Prometheus of this directory that this object did not start (an earlier process
        # of the same run): its pid file says which, its command line proves it.
        proc = owned_process(self.directory / PID_FILE, self.directory)
        if proc is not None:
            proc.kill()

    def remove(self) -> None:
        """Stop it and delete its directory (data included); safe to call twice."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def process(self) -> psutil.Process | None:
        return owned_process(self.directory / PID_FILE, self.directory)

    def rss_bytes(self) -> int | None:
        p = self.process()
        try:
            return p.memory_info().rss if p is not None else None
        except psutil.Error:
            return None

    def client(self) -> Prom:
        return Prom(self.url)


def runs_root() -> Path:
    return toolchain.cache_root() / "prometheus" / "runs"


def own_directory(run_id: str) -> Path:
    """A run's Prometheus directory when there is no embedded cluster to hold it; claimed for this process."""
    return claim_directory(runs_root() / f"cp-{run_id}")


def sweep_runs(say: Callable[[str], None] | None = None) -> list[str]:
    """Remove Prometheus directories (and processes) of runs on this machine whose process is gone --
    with them the copy of the API server's token (``apiserver.token``) a killed run could not remove.
    Every run sweeps them at its start, whichever suites it runs (``sweep_abandoned``, which the cluster
    fixture hands to ``clusterproof.cluster.backends``).
    A directory whose run was recorded on another host is left alone (``say`` is told)."""
    swept = []
    root = runs_root()
    if not root.exists():
        return swept
    for d in sorted(root.iterdir()):
        try:
            owner = json.loads((d / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = {}
        host = owner_elsewhere(owner)
        if host:
            (say or progress.say)(f"sweep: {elsewhere_note(f'Prometheus directory {d}', host)}")
            continue
        if owner_alive(owner):
            continue
        proc = owned_process(d / PID_FILE, d)
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)
        swept.append(d.name)
    return swept


def sweep_abandoned(progress: Callable[[str], None]) -> None:
    """``sweep_runs``, said in one line: a local sweep for ``clusterproof.cluster.backends`` (``local_sweeps``)."""
    swept = sweep_runs(say=progress)
    if swept:
        progress(f"swept {len(swept)} abandoned Prometheus director(ies) (with any token copy): "
                 f"{', '.join(swept)}")


class PeakRss:
    """RSS of a Prometheus sampled while something runs: from its process (psutil, every
    ``interval_s``) and from its own ``process_resident_memory_bytes`` (its /metrics)."""

    def __init__(self, server: PromServer | None, prom: Prom, interval_s: float = 0.1):
        self.server, self.prom, self.interval_s = server, prom, interval_s
        self.process_peak = 0
        self.metric_peak = 0.0
        self.samples: list[tuple[float, int | None, float | None]] = []   # (t, process, metric)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "PeakRss":
        self.t0 = time.monotonic()
        if self.server is not None:
            self._threads.append(threading.Thread(target=self._process_loop, daemon=True))
        self._threads.append(threading.Thread(target=self._metric_loop, daemon=True))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def _process_loop(self) -> None:
        while not self._stop.is_set():
            rss = self.server.rss_bytes()
            if rss:
                self.process_peak = max(self.process_peak, rss)
                self.samples.append((time.monotonic() - self.t0, rss, None))
            self._stop.wait(self.interval_s)

    def _metric_loop(self) -> None:
        # The server's own figure is refreshed per scrape of /metrics: a slower loop.
        while not self._stop.is_set():
            try:
                v = self.prom.own_metric("process_resident_memory_bytes", wait_s=5)
            except Exception:
                v = None
            if v:
                self.metric_peak = max(self.metric_peak, v)
                self.samples.append((time.monotonic() - self.t0, None, v))
            self._stop.wait(max(self.interval_s, 0.5))

    @property
    def peak(self) -> float:
        return max(self.process_peak, self.metric_peak)
