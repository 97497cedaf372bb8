"""Burst shape: jobs of N whole-node GPU pods, created as fast as the client can, or at a rate.

A large training job arrives as hundreds of pods at once, one per 8-GPU
node; several jobs follow back to back. With ``--burst-rate R`` the same
pods come at R pods/s instead (a steady phase: create i is due at
``start + i / R``, whichever user makes it). Pod ``i`` of job ``j`` belongs to
worker ``k`` of ``W`` when ``(j * N + i) % W == k``, so locust's distributed
mode (``--master --expect-workers W`` plus W ``--worker`` processes, or
``--processes W``) splits one burst without two workers creating the same pod
(``clusterproof.burst.plan.Phase.share``). Each worker's users pull from that worker's share in
job order, and the worker quits when its share is done (the master stops when
the last worker has quit, or is lost: load/workers.py). Every pod is labelled with
its creator (``clusterproof.io/created-by: w<index>``); names are fixed by the plan, so the
harness can complete a lost worker's share without ever making a pod twice.

    locust -f load/burst.py --headless -u 32 -r 32 --host https://API:6443 \\
        --kube-token-file TOKEN --burst-namespace NS --burst-run-id RUN \\
        --burst-jobs 2 --burst-job-size 18 [--burst-rate 20] --csv out/burst

Sizes come from the profile (``clusterproof.core.locust`` maps profile keys to these
arguments); the same flags (or CLUSTERPROOF_BURST_* variables) work by hand.
"""
from __future__ import annotations

import os
import time
from collections import deque

import gevent
from gevent.event import Event
from locust import events, task
from locust.exception import StopUser

from clusterproof.burst.plan import PHASE_LABEL, Phase, rank_pod
from clusterproof.core.run import RUN_LABEL
from clusterproof.load import workers as distributed
from clusterproof.load.kube_user import KubeApiUser, finish_runner


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CLUSTERPROOF_BURST_{name.upper()}", default)


@events.init_command_line_parser.add_listener
def _burst_args(parser):
    parser.add_argument("--burst-namespace", default=_env("namespace", ""), help="namespace of the pods")
    parser.add_argument("--burst-run-id", default=_env("run_id", ""), help=f"value of label {RUN_LABEL}")
    parser.add_argument("--burst-jobs", type=int, default=int(_env("jobs", "1")), help="jobs, back to back")
    parser.add_argument("--burst-job-size", type=int, default=int(_env("job_size", "10")),
                        help="pods per job (one per node)")
    parser.add_argument("--burst-gpus", type=int, default=int(_env("gpus", "8")),
                        help="nvidia.com/gpu per pod (a whole node)")
    parser.add_argument("--burst-node-selector", default=_env("node_selector", ""),
                        help="key=value the pods select (the untainted shared pool)")
    parser.add_argument("--burst-job-prefix", default=_env("job_prefix", "burst"),
                        help=f"job name prefix; also the pods' {PHASE_LABEL} label")
    parser.add_argument("--burst-rate", type=float, default=float(_env("rate", "0")),
                        help="pods/s over all users and workers (a steady phase); 0: as fast as they can")


def pod_body(opts, job: str, index: int) -> dict:
    """One rank of ``job`` (clusterproof.burst.plan.rank_pod), labelled with this process as its creator."""
    selector = dict([opts.burst_node_selector.split("=", 1)]) if opts.burst_node_selector else None
    return rank_pod(opts.burst_job_prefix, job, index, opts.burst_run_id, opts.burst_gpus, selector, _Share.creator)


class _Share:
    """This worker's pods, in job order, the creates in flight, and the start signal (set once every user of
    the run is spawned and connected)."""
    queue: deque = deque()
    inflight = 0        # creates sent and not yet answered
    done = False        # the share is done and the master told so
    go = Event()
    rate = 0.0          # this worker's share of --burst-rate (pods/s); 0: unpaced
    t0 = 0.0            # when the first create started
    sent = 0            # creates started so far (the next one is due at t0 + sent / rate)
    creator = "local"   # CREATOR_LABEL value of this process's pods
    created = 0         # creates that succeeded (told to the master when the share is done)
    failed = 0


@events.spawning_complete.add_listener
def _go(**_kw):
    # Fired when every user of the run has been spawned (on workers: when the
    # master says so). Until then users only open their connections, so the
    # burst starts at once and TLS handshakes are not counted as create latency.
    _Share.go.set()


@events.test_start.add_listener
def _plan(environment, **_kw):
    opts, runner = environment.parsed_options, environment.runner
    if runner is None or distributed.kind(runner) == "master":
        return  # the master only aggregates statistics
    if not opts.burst_namespace or not opts.burst_run_id:
        raise RuntimeError("--burst-namespace and --burst-run-id are required")
    # Workers learn the worker count from the master's --expect-workers.
    worker = distributed.kind(runner) == "worker"
    workers = max(1, int(getattr(opts, "expect_workers", 1) or 1)) if worker else 1
    me = max(0, runner.worker_index) if worker else 0
    phase = Phase(opts.burst_job_prefix, opts.burst_jobs, opts.burst_job_size, opts.burst_rate)
    _Share.queue = deque((job, i, False) for job, i in phase.share(workers, me))
    _Share.creator, _Share.created, _Share.failed = distributed.worker_label(runner), 0, 0
    _Share.inflight, _Share.done = 0, False
    _Share.go = Event()
    _Share.rate, _Share.sent = opts.burst_rate / workers, 0


class BurstUser(KubeApiUser):
    """Creates pods from this worker's share until it is empty, then stops.

    The share is the process's, not a user's: locust's master moves users between workers when one
    joins or quits (a user may be stopped mid-create), so a create cut off is put back in the queue
    and sent again (a 409 then is that first attempt's pod), and the share is done when the queue
    is empty and no create is in flight, however many users are left.
    """

    def on_start(self):
        # Open (and authenticate) this user's connection before the burst. With GET /version, which the
        # apiserver answers from memory: a worker that quits kills its users mid-request (a user the master
        # moved to it after the other worker quit may still be here), and kube-apiserver counts a LIST
        # whose client went away as a 500 "context canceled" (kubernetes/kubernetes#139256) -- the seed's
        # API health guard then fails the run for a request locust abandoned.
        if _Share.done:
            raise StopUser()     # joined after this worker's share was done: nothing to open a connection for
        self.call("GET", "/version", "open connection")
        _Share.go.wait(timeout=60)

    @task
    def create_next_pod(self):
        if not _Share.queue:
            if _Share.inflight:      # stay until the last create is answered: one cut off comes back
                gevent.sleep(0.05)
                return
            self._finish()
        job, i, again = _Share.queue.popleft()
        answered = False
        _Share.inflight += 1
        try:
            if _Share.rate and not again:
                # A steady phase: create i is due at t0 + i / rate (t0: the first create), whichever user makes it.
                if _Share.sent == 0:
                    _Share.t0 = time.monotonic()
                due = _Share.t0 + _Share.sent / _Share.rate
                _Share.sent += 1
                gevent.sleep(max(0.0, due - time.monotonic()))
            opts = self.environment.parsed_options
            status, _ = self.call("POST", f"/api/v1/namespaces/{opts.burst_namespace}/pods", "create pod",
                                  pod_body(opts, job, i), ok=(200, 201, 409) if again else (200, 201))
            answered = True
            if status in (200, 201, 409):
                _Share.created += 1
            else:
                _Share.failed += 1
        finally:
            _Share.inflight -= 1
            if not answered:
                _Share.queue.appendleft((job, i, True))   # this user was stopped mid-create

    def _finish(self):
        if not _Share.queue and _Share.inflight == 0 and not _Share.done:
            _Share.done = True
            distributed.worker_done(self.environment, {"created": _Share.created, "failed": _Share.failed,
                                                       "creator": _Share.creator})
            finish_runner(self.environment)
        raise StopUser()
