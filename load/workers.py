"""Locust's distributed mode as the harness runs it: worker names, what stays local to a worker, lost workers.

The harness runs the master (``clusterproof.core.locust.run_locust`` with a ``Master``); workers on
other hosts join it (``clusterproof load-worker``). What locust leaves to the locustfile:

- **Names.** Every worker says who it is (``--cp-worker-name``, default its host name) and from
  which address it reaches the master, in a ``cp_hello`` message. The master keeps
  ``<csv prefix>_workers.json`` current (joined, done, lost, what each reported), so a run whose
  workers did not all join fails with one line naming the missing ones (the harness reads it).
- **What is local to a worker.** At the start the master forwards every custom argument (locust
  does), its API server URL and token/CA *paths* included, which mean nothing on another host. A
  worker keeps its own ``--kube-server``, ``--kube-token-file``, ``--kube-ca-file`` and
  ``--kube-tls-server-name`` when it was given them; otherwise it uses the *contents* of the
  master's token and CA, which the master forwards (``kube_token_value``, ``kube_ca_pem``): a worker
  needs nothing but the master's address. So the master's port must be reachable by your workers
  only (docs/distributed-load.md): whoever joins it gets the run's token (short-lived, one namespace).
- **Lost workers.** Locust marks a worker that stops sending heartbeats as missing and says
  nothing else; here it is recorded as lost (when, what it had reported), and once every worker
  has finished or is lost the master quits (locust alone would wait for ``--run-time``). What a
  lost worker left undone is the harness's to complete (``clusterproof.burst.measure``).
"""
from __future__ import annotations

import json
import os
import socket
import time

import gevent
from locust import events, runners

LOCAL_OPTIONS = ("kube_server", "kube_token_file", "kube_ca_file", "kube_tls_server_name", "cp_worker_name")
POLL_S = 0.5
# Heartbeats (one a second) a worker may miss before the master counts it lost: locust's own 3 flagged two
# healthy workers lost, and stopped the test, when they spawned their users on a machine whose two cores ran
# 14 runnable processes (the self-tests beside them). A worker really killed is still lost within this many
# seconds.
HEARTBEAT_LIVENESS = 10


@events.init_command_line_parser.add_listener
def _worker_args(parser):
    parser.add_argument("--cp-worker-name", default=os.environ.get("CLUSTERPROOF_WORKER_NAME", ""),
                        help="this worker's name, as the master's expected names say it (default: the host name)")
    parser.add_argument("--cp-expect-worker-names", default="",
                        help="master: comma-separated names of the workers it waits for (for the one line naming "
                             "the missing ones)")


def kind(runner) -> str:
    """``master``, ``worker`` or ``local`` (one process, or none yet)."""
    name = type(runner).__name__
    return {"MasterRunner": "master", "WorkerRunner": "worker"}.get(name, "local")


def worker_label(runner) -> str:
    """The value of the pods' worker label for this process: ``w<index>`` on a worker, ``local`` otherwise."""
    return f"w{runner.worker_index}" if kind(runner) == "worker" else "local"


class _Local:
    """A worker's own values of LOCAL_OPTIONS (restored after the master's arguments arrive)."""
    values: dict = {}


class _Master:
    """The master's record of its workers, by locust client id."""
    workers: dict[str, dict] = {}
    prefix = ""
    started = 0.0
    test_started = False
    initial: set = set()      # the workers the test started with (they got shares)
    quitting = False


def _source_address(host: str, port: int) -> str:
    """The address this host reaches ``host`` from (a UDP "connect" sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port or 9))
            return s.getsockname()[0]
    except OSError:
        return ""


@events.init.add_listener
def _init(environment, runner=None, **_kw):
    opts = environment.parsed_options
    if runner is None or opts is None:
        return
    if kind(runner) == "worker":
        _Local.values = {k: getattr(opts, k, "") for k in LOCAL_OPTIONS if getattr(opts, k, "")}
        runner.send_message("cp_hello", _hello(opts))
    elif kind(runner) == "master":
        # locust reads its module constant each time a worker joins or beats; it has no option for it.
        runners.HEARTBEAT_LIVENESS = max(runners.HEARTBEAT_LIVENESS, HEARTBEAT_LIVENESS)
        _Master.prefix, _Master.started = getattr(opts, "csv_prefix", "") or "", time.monotonic()
        _forward_credentials(opts)
        runner.register_message("cp_hello", _on_hello)
        runner.register_message("cp_done", _on_done)
        gevent.spawn(_watch, environment)


def _hello(opts) -> dict:
    return {"name": getattr(opts, "cp_worker_name", "") or socket.gethostname(), "host": socket.gethostname(),
            "address": _source_address(opts.master_host, opts.master_port), "pid": os.getpid()}


def _forward_credentials(opts) -> None:
    """The master reads its token and CA once; locust forwards them to every worker with the other arguments."""
    for path_key, value_key in (("kube_token_file", "kube_token_value"), ("kube_ca_file", "kube_ca_pem")):
        path = getattr(opts, path_key, "")
        if path and os.path.exists(path):
            with open(path) as f:
                setattr(opts, value_key, f.read().strip() if value_key == "kube_token_value" else f.read())


@events.test_start.add_listener
def _restore_local(environment, **_kw):
    """On a worker, after locust applied the master's arguments: this host's own values win again; the
    master's paths, which name files on its host, are dropped where the master forwarded their contents."""
    opts, runner = environment.parsed_options, environment.runner
    if kind(runner) == "master":
        _Master.test_started, _Master.initial = True, set(runner.clients)
        return
    if kind(runner) != "worker" or opts is None:
        return
    restore_local(environment)
    runner.send_message("cp_hello", _hello(opts))     # again: a master that started after us missed the first


def restore_local(environment) -> None:
    """On a worker: its own LOCAL_OPTIONS win over the master's again. Locust applies the master's arguments
    at every spawn message -- the first, and again whenever the master moves users because a worker joined
    or quit -- so this runs at the test's start and again as each user is made (``KubeApiUser``). Found
    when the users a rebalance moved onto a worker in another network namespace dialled the master's own
    API server URL (127.0.0.1 there: "Connection refused")."""
    opts = environment.parsed_options
    if kind(environment.runner) != "worker" or opts is None:
        return
    for k in LOCAL_OPTIONS:
        setattr(opts, k, _Local.values.get(k, getattr(opts, k, "") if k == "cp_worker_name" else ""))


def worker_done(environment, summary: dict | None = None) -> None:
    """A worker's last word before it quits: its share is done (and what it did, for the master's record)."""
    runner = environment.runner
    if kind(runner) == "worker":
        runner.send_message("cp_done", summary or {})


def _entry(environment, client_id: str) -> dict:
    w = _Master.workers.get(client_id)
    if w is None:
        runner = environment.runner
        w = _Master.workers[client_id] = {
            "client_id": client_id, "name": client_id.rsplit("_", 1)[0], "host": "", "address": "",
            "index": runner.get_worker_index(client_id), "state": "joined",
            "joined_s": round(time.monotonic() - _Master.started, 2), "lost_s": None,
            "reported": {}, "summary": {}}
    return w


def _on_hello(environment, msg, **_kw):
    w = _entry(environment, msg.node_id)
    w.update({k: msg.data.get(k, "") for k in ("name", "host", "address")})
    _write()


def _on_done(environment, msg, **_kw):
    w = _entry(environment, msg.node_id)
    w["state"], w["summary"] = "done", msg.data or {}
    w["done_s"] = round(time.monotonic() - _Master.started, 2)
    _write()


@events.worker_report.add_listener
def _on_report(client_id, data, **_kw):
    env = _ENV.get("environment")
    if env is None or kind(env.runner) != "master":
        return
    w = _entry(env, client_id)
    for s in data.get("stats", []):
        r = w["reported"].setdefault(s["name"], {"requests": 0, "failures": 0})
        r["requests"] += s.get("num_requests", 0)
        r["failures"] += s.get("num_failures", 0)


_ENV: dict = {}


@events.init.add_listener
def _remember(environment, **_kw):
    _ENV["environment"] = environment


def _watch(environment) -> None:
    """Every POLL_S: workers that went missing or vanished without saying done are lost; when every
    worker of a started test is done or lost, the master quits (its final statistics are written then)."""
    runner = environment.runner
    while not _Master.quitting:
        gevent.sleep(POLL_S)
        changed = False
        for cid in list(runner.clients):
            if cid not in _Master.workers:
                w = _entry(environment, cid)
                changed = True
                if _Master.test_started and cid not in _Master.initial:
                    # Shares were handed out at the start: a worker joining later (a restarted pod) has none
                    # and no users; it is not waited for (telling it to quit would make locust re-dispatch
                    # the users of the ones still working).
                    w["state"] = "late"
        for cid, w in _Master.workers.items():
            if cid in runner.clients and w["state"] == "late" and runner.clients[cid].state != "missing":
                continue
            node = runner.clients.get(cid) if cid in runner.clients else None
            gone = node is None or node.state == "missing"
            if gone and w["state"] == "joined":
                w["state"], w["lost_s"] = "lost", round(time.monotonic() - _Master.started, 2)
                changed = True
        if changed:
            _write()
        states = [w["state"] for cid, w in _Master.workers.items() if cid in _Master.initial]
        others = [w["state"] for cid, w in _Master.workers.items() if cid not in _Master.initial]
        if _Master.test_started and states and "joined" not in states and ("lost" in states or others):
            # locust quits by itself when the last worker quits normally; not when one was lost, nor while a
            # late joiner idles.
            _Master.quitting = True
            _write()
            gevent.spawn_later(0.5, runner.quit)


def record() -> list[dict]:
    """The master's record of its workers, in joining order."""
    return sorted(_Master.workers.values(), key=lambda w: w["index"])


def _write() -> None:
    if not _Master.prefix:
        return
    tmp = f"{_Master.prefix}_workers.json.tmp"
    with open(tmp, "w") as f:
        json.dump({"workers": record(),
                   "seconds": round(time.monotonic() - _Master.started, 2)}, f, indent=2)
    os.replace(tmp, f"{_Master.prefix}_workers.json")


@events.quit.add_listener
def _final(**_kw):
    _Master.quitting = True
    _write()
