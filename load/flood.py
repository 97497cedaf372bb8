"""Flood shape: one identity far past its priority level's seats, with mixed verbs, two kinds of client.

For ``--flood-seconds`` every user sends pod creates, LISTs and GETs back to
back (no think time) from the flood identity; the flood's share of pods
(``--flood-pods``, fixed names) must be created in the end whatever the
rejections -- the creates go on after the noise stops until every pod exists
or a create has used ``--flood-max-attempts``. Two kinds of client share
the flood side by side:

- ``HonouringUser`` waits the ``Retry-After`` of every 429 before its next
  request (as client-go does), plus up to ``--flood-retry-jitter`` seconds:
  every user starts at the same moment, and clients that wait exactly the
  same Retry-After (APF's is per priority level, up to 32 s) would come back
  as one herd, round after round -- measured here, 157 s for 112 creates
  after a 30 s flood;
- ``ImpatientUser`` (``--flood-impatient-fraction`` of the users) retries at
  once, ignoring it.

Their pods are named ``honouring-NNNN`` / ``impatient-NNNN`` and carry
``schedulerName: clusterproof-unscheduled`` (no such scheduler): they stay
API objects, so the flood loads the apiserver, not the scheduler or kwok.

Every response's APF headers are compared with the expected FlowSchema and
PriorityLevel UIDs (``--flood-fs-uid``/``--flood-pl-uid``), every 429's
``Retry-After`` is recorded, and at the end ``<csv prefix>_flood.json`` holds
the per-kind counts.

Distributed mode (``--master --expect-workers W`` and W workers,
``clusterproof load-worker --locustfile flood``): worker ``k`` creates the pods
``i % W == k`` of each kind, and its first users (in the flood's proportion,
at least one of each kind) are the impatient ones, so every worker has a client
of each kind for its share. Each worker sends its counts to the master when its
share is done (load/workers.py); the master writes ``_flood.json`` from them,
with the workers it lost and the pods their shares left uncreated.

    locust -f load/flood.py --headless -u 48 -r 48 --host https://API:6443 \\
        --kube-token-file TOKEN --flood-namespace NS --flood-run-id RUN --flood-pods 200 \\
        --flood-seconds 30 --csv out/flood
"""
from __future__ import annotations

import json
import random
import time
from collections import Counter, deque

import gevent
from locust import events, task
from locust.exception import StopUser

from clusterproof.apf.flood_plan import KIND_LABEL, KINDS, NO_SCHEDULER, pod_names, split
from clusterproof.kube.pod_spec import pod_body
from clusterproof.load import workers as distributed
from clusterproof.load.kube_user import KubeApiUser, finish_runner, locust_environment

# clusterproof.kube.flowcontrol's names (locust does not import the client)
FS_UID_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
PL_UID_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"


@events.init_command_line_parser.add_listener
def _flood_args(parser):
    parser.add_argument("--flood-namespace", default="", help="namespace of the flood's pods")
    parser.add_argument("--flood-run-id", default="", help="value of label clusterproof.io/run")
    parser.add_argument("--flood-pods", type=int, default=100, help="pods the flood must create (all kinds)")
    parser.add_argument("--flood-seconds", type=float, default=30, help="how long LISTs and GETs go on")
    parser.add_argument("--flood-impatient-fraction", type=float, default=0.25,
                        help="share of users (and pods) whose client ignores Retry-After")
    parser.add_argument("--flood-max-attempts", type=int, default=1000, help="attempts per create")
    parser.add_argument("--flood-retry-jitter", type=float, default=2.0,
                        help="seconds (uniform 0..this) added to each Retry-After wait of an honouring client")
    parser.add_argument("--flood-fs-uid", default="", help="expected X-Kubernetes-PF-FlowSchema-UID")
    parser.add_argument("--flood-pl-uid", default="", help="expected X-Kubernetes-PF-PriorityLevel-UID")


class _Plan:
    """This process's flood: pods left to create per kind, what happened, when the noise ends."""
    queue: dict[str, deque] = {}
    created: dict[str, list] = {}
    noise_until = 0.0
    stats: dict[str, Counter] = {}
    retry_after: dict[str, Counter] = {}
    gave_up: dict[str, list] = {}
    last_created: dict[str, float] = {}      # seconds after the start when the kind's last create succeeded
    started = 0.0
    other_classification: Counter = Counter()
    inflight: dict[str, int] = {}
    reading = 0                              # reads (list/get pods) in flight, any kind
    done = False
    spawned = 0
    impatient_users = 0      # this process's first users that are impatient


def impatient_users(users: int, fraction: float) -> int:
    """Of ``users`` local users, how many ignore Retry-After: the flood's proportion, at least one of each kind
    when there are two users or more (each kind has pods to create)."""
    if fraction <= 0 or users <= 0:
        return 0
    return min(max(1, users - 1), max(1, round(users * fraction)))


@events.test_start.add_listener
def _plan(environment, **_kw):
    """This process's share (on a worker: after the master's arguments arrived)."""
    opts, runner = environment.parsed_options, environment.runner
    if opts is None or not opts.flood_namespace or distributed.kind(runner) == "master":
        return
    worker = distributed.kind(runner) == "worker"
    workers = max(1, int(getattr(opts, "expect_workers", 1) or 1)) if worker else 1
    me = max(0, runner.worker_index) if worker else 0
    counts = split(opts.flood_pods, opts.flood_impatient_fraction)
    _Plan.queue = {k: deque(n for i, n in enumerate(pod_names(k, counts[k])) if i % workers == me) for k in KINDS}
    _Plan.created = {k: [] for k in KINDS}
    _Plan.stats = {k: Counter() for k in KINDS}
    _Plan.retry_after = {k: Counter() for k in KINDS}
    _Plan.gave_up = {k: [] for k in KINDS}
    _Plan.last_created, _Plan.other_classification = {}, Counter()
    _Plan.inflight, _Plan.done, _Plan.spawned, _Plan.reading = {k: 0 for k in KINDS}, False, 0, 0
    _Plan.started = time.monotonic()
    _Plan.noise_until = _Plan.started + opts.flood_seconds


def summary() -> dict:
    """This process's counts per kind."""
    out = {k: {"planned": len(_Plan.created.get(k, [])) + len(_Plan.queue.get(k, [])) + len(_Plan.gave_up.get(k, [])),
               "created": len(_Plan.created.get(k, [])), "not_attempted": len(_Plan.queue.get(k, [])),
               "gave_up": _Plan.gave_up.get(k, []), "responses": dict(_Plan.stats.get(k, {})),
               "retry_after_s": {str(s): n for s, n in sorted(_Plan.retry_after.get(k, {}).items())},
               "last_create_s": round(_Plan.last_created.get(k, 0.0), 1)}
           for k in KINDS}
    out["other_classification"] = dict(_Plan.other_classification.most_common(5))
    return out


def merged(opts, parts: list[dict], lost: list[str], lost_indices: tuple[int, ...] = (), workers: int = 1) -> dict:
    """The master's summary from its workers' (pure): counts summed, and what lost workers' shares left.
    ``lost_share`` names, per kind, the pods that belonged to lost workers (index ``i % workers`` among
    ``lost_indices``): whether those exist is not the cluster's doing, so the check leaves them unjudged."""
    planned = split(opts.flood_pods, opts.flood_impatient_fraction)
    out: dict = {}
    for k in KINDS:
        ps = [p[k] for p in parts if k in p]
        created, gave_up = sum(p["created"] for p in ps), [n for p in ps for n in p["gave_up"]]
        responses, retry = Counter(), Counter()
        for p in ps:
            responses.update(p["responses"])
            retry.update(p["retry_after_s"])
        out[k] = {"planned": planned[k], "created": created, "not_attempted": planned[k] - created - len(gave_up),
                  "gave_up": gave_up, "responses": dict(responses),
                  "retry_after_s": dict(sorted(retry.items(), key=lambda kv: float(kv[0]) if kv[0] != "none" else 0)),
                  "last_create_s": max((p["last_create_s"] for p in ps), default=0.0),
                  "lost_share": [n for i, n in enumerate(pod_names(k, planned[k]))
                                 if i % max(1, workers) in set(lost_indices)]}
    other = Counter()
    for p in parts:
        other.update(p.get("other_classification", {}))
    out["other_classification"] = dict(other.most_common(5))
    out["workers"] = len(parts) + len(lost)
    out["lost_workers"] = lost
    return out


@events.quit.add_listener
def _summary(exit_code, **_kw):
    env = locust_environment()
    prefix = getattr(env.parsed_options, "csv_prefix", None) if env and env.parsed_options else None
    if not prefix or distributed.kind(env.runner) == "worker" or not env.parsed_options.flood_namespace:
        return
    if distributed.kind(env.runner) == "master":
        ws = distributed.record()
        gone = [w for w in ws if w["state"] != "done"]
        out = merged(env.parsed_options, [w["summary"] for w in ws if w["state"] == "done"],
                     [w["name"] for w in gone], tuple(w["index"] for w in gone), len(ws))
    else:
        out = summary()
    with open(f"{prefix}_flood.json", "w") as f:
        json.dump(out, f, indent=2)


class FloodUser(KubeApiUser):
    """One flood client: impatient (ignores Retry-After) if among this process's first
    ``impatient_users`` users, else honouring."""
    kind = "honouring"
    honour = True

    def on_start(self):
        if _Plan.spawned == 0:
            users = int(getattr(self.environment.runner, "target_user_count", 0) or 0)
            _Plan.impatient_users = impatient_users(users, self.environment.parsed_options.flood_impatient_fraction)
        impatient = _Plan.spawned < _Plan.impatient_users
        _Plan.spawned += 1
        self.kind, self.honour = ("impatient", False) if impatient else ("honouring", True)
        opts = self.environment.parsed_options
        self.pods = f"/api/v1/namespaces/{opts.flood_namespace}/pods"
        self.retry_jitter_s = opts.flood_retry_jitter

    def observe(self, resp) -> None:
        """Count every response by status and by whether APF classified it as expected."""
        opts, st = self.environment.parsed_options, _Plan.stats[self.kind]
        status = resp.status_code or 0
        st[f"status {status}" if status else "no response"] += 1
        if status == 0:
            return
        fs, pl = resp.headers.get(FS_UID_HEADER, ""), resp.headers.get(PL_UID_HEADER, "")
        if not fs or not pl:
            st["without APF headers"] += 1
        elif (opts.flood_fs_uid and fs != opts.flood_fs_uid) or (opts.flood_pl_uid and pl != opts.flood_pl_uid):
            st["classified elsewhere"] += 1
            _Plan.other_classification[f"{fs}/{pl}"] += 1
        if status == 429:
            ra = resp.headers.get("Retry-After", "")
            _Plan.retry_after[self.kind][ra or "none"] += 1

    @task
    def step(self):
        noisy = time.monotonic() < _Plan.noise_until
        queue = _Plan.queue[self.kind]
        if not noisy and not queue:
            # Stay until the kind's last create is answered (one cut off comes back) and no read is in flight.
            if _Plan.inflight[self.kind] or _Plan.reading:
                gevent.sleep(0.05)
                return
            self._finish()
        action = random.choices(("create", "list", "get"), (2, 1, 2))[0] if noisy else "create"
        if action == "create" and queue:
            self._create(queue.popleft())
            return
        # A read in flight holds the process's end too: quitting kills every user mid-request, and
        # kube-apiserver counts an abandoned LIST as a 500 "context canceled" (kubernetes/kubernetes#139256).
        _Plan.reading += 1
        try:
            if action == "list" or action == "create":
                self.call("GET", self.pods, f"list pods ({self.kind})", attempts=1, honour_retry_after=self.honour)
            else:
                done = _Plan.created[self.kind] or ["nothing-yet"]
                self.call("GET", f"{self.pods}/{random.choice(done)}", f"get pod ({self.kind})", ok=(200, 404),
                          attempts=1, honour_retry_after=self.honour)
        finally:
            _Plan.reading -= 1

    def _create(self, name: str) -> None:
        opts = self.environment.parsed_options
        body = pod_body(name, opts.flood_run_id, scheduler=NO_SCHEDULER, labels={KIND_LABEL: self.kind})
        # locust's master moves users between workers when one joins or quits: a user stopped mid-create puts
        # its pod back (sent again, a 409 is that first attempt's pod).
        answered = False
        _Plan.inflight[self.kind] += 1
        try:
            status, _ = self.call("POST", self.pods, f"create pod ({self.kind})", body, ok=(201, 409),
                                  attempts=opts.flood_max_attempts, honour_retry_after=self.honour)
            answered = True
        finally:
            _Plan.inflight[self.kind] -= 1
            if not answered:
                _Plan.queue[self.kind].appendleft(name)
        if status in (201, 409):       # 409: an earlier attempt did create it (its answer was lost)
            _Plan.created[self.kind].append(name)
            _Plan.last_created[self.kind] = time.monotonic() - _Plan.started
        else:
            _Plan.gave_up[self.kind].append(name)

    def _finish(self):
        """This user is done; the process, once no kind has a pod left to create or a create in flight."""
        if (not _Plan.done and not any(_Plan.queue.values()) and not any(_Plan.inflight.values())
                and not _Plan.reading):
            _Plan.done = True
            distributed.worker_done(self.environment, summary())
            finish_runner(self.environment)
        raise StopUser()
