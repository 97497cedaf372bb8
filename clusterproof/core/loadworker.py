"""``clusterproof load-worker``: a locust worker with the project's locustfiles, joining a master the harness runs.

    clusterproof load-worker --master HOST:PORT --locustfile burst|flood [--name NAME] [--runs N]
        [--kube-server URL] [--kube-token-file F] [--kube-ca-file F] [--kube-tls-server-name NAME]

The master (a suite's run: profile keys ``burst_locust_workers`` / ``apf_flood_locust_workers``,
``load_master_bind``/``load_master_port``) sends the load's arguments when the run starts, and
its token and CA too (load/workers.py): a worker needs only the master's address, and
``--kube-server`` when the API server URL the master uses is not this host's way to it (a pod in
the cluster: ``https://kubernetes.default.svc``).

One run of a suite is several locust runs, each with its own master on the same address (the
burst suite: its steady phase, then its burst), and a locust worker quits with its master; so
this command starts a worker again after each run it served -- once that run's master is gone
(its port closed), so that it never joins the run it has just served: ``--runs N`` runs, or (0,
the default) until no master comes for locust's own join bound (5 min). The worker dies with this
process. Exit 0 when it served a run; bad arguments: one line, exit 4.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time

from clusterproof.core import exitcodes
from clusterproof.core.errors import ArgumentParser, HarnessError, one_line_main
from clusterproof.core.locust import LOCUST, ROOT, locustfile_path
from clusterproof.core.processes import die_with_parent

LOCUSTFILES = ("burst", "flood")


def parse_master(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address) -> (host, port); one line when it is not one."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise HarnessError(f"--master {value!r} is not HOST:PORT (e.g. 10.0.0.5:5557, the master's "
                           "load_master_port)")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, int(port))
        except OSError:
            raise HarnessError(f"--master {value!r}: cannot resolve {host!r}") from None
    return host, int(port)


def command(master: str, locustfile: str, name: str = "", kube_server: str = "", token_file: str = "",
            ca_file: str = "", tls_server_name: str = "") -> list[str]:
    """The locust worker's command line (no secret: files by their path)."""
    if locustfile not in LOCUSTFILES:
        raise HarnessError(f"--locustfile {locustfile!r}: one of {', '.join(LOCUSTFILES)}")
    host, port = parse_master(master)
    for flag, path in (("--kube-token-file", token_file), ("--kube-ca-file", ca_file)):
        if path and not os.path.isfile(path):
            raise HarnessError(f"{flag} {path}: no such file")
    if kube_server and not kube_server.startswith(("https://", "http://")):
        raise HarnessError(f"--kube-server {kube_server!r} is not a URL (e.g. https://kubernetes.default.svc)")
    cmd = [str(LOCUST), "-f", str(locustfile_path(f"load/{locustfile}.py")), "--worker",
           "--master-host", host, "--master-port", str(port), "--loglevel", "INFO", "--exit-code-on-error", "0",
           "--cp-worker-name", name or socket.gethostname()]
    for flag, value in (("--kube-server", kube_server), ("--kube-token-file", token_file),
                        ("--kube-ca-file", ca_file), ("--kube-tls-server-name", tls_server_name)):
        if value:
            cmd += [flag, value]
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="clusterproof load-worker",
                        description="A locust worker with the project's locustfiles, joining the master a "
                                    "clusterproof run starts (docs/distributed-load.md).")
    ap.add_argument("--master", required=True, help="HOST:PORT of the master (the run's load_master_port)")
    ap.add_argument("--locustfile", required=True, choices=LOCUSTFILES, help="the load: burst or flood")
    ap.add_argument("--name", default="", help="this worker's name, as the profile's expected names list it "
                                               "(default: the host name)")
    ap.add_argument("--kube-server", default="", help="the API server's URL from this host (default: the "
                                                      "master's)")
    ap.add_argument("--kube-token-file", default="", help="a token of this worker's own (default: the master's "
                                                          "run token, forwarded when the run starts)")
    ap.add_argument("--kube-ca-file", default="", help="the API server's CA (default: the master's)")
    ap.add_argument("--runs", type=int, default=0,
                    help="master runs to serve, then exit (the burst suite is two: steady, burst); 0: until no "
                         "master comes for 5 min")
    ap.add_argument("--kube-tls-server-name", default="",
                    help="verify the API server's certificate for this name, when --kube-server's host is not in "
                         "it (e.g. kubernetes)")
    a = ap.parse_args(argv)

    def body() -> int:
        cmd = command(a.master, a.locustfile, a.name, a.kube_server, a.kube_token_file, a.kube_ca_file,
                      a.kube_tls_server_name)
        if a.runs < 0:
            raise HarnessError(f"--runs {a.runs}: a count of master runs (0: until none comes)")
        if not LOCUST.exists():
            raise HarnessError(f"locust is not installed next to {sys.executable}: install requirements.txt")
        return serve(cmd, a.runs, *parse_master(a.master))
    return one_line_main(body, exitcodes.USAGE)


def serve(cmd: list[str], runs: int, host: str, port: int) -> int:
    """The worker, again after each run it served (its exit 0), ``runs`` times or until one cannot join."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    served = 0
    while not runs or served < runs:
        sys.stdout.flush()
        rc = subprocess.call(cmd, cwd=ROOT, env=env, preexec_fn=die_with_parent)
        if rc != 0:      # no master came within locust's join bound, or the worker failed
            print(f"clusterproof load-worker: the locust worker exited {rc} after {served} run(s)", file=sys.stderr)
            return 0 if served else rc
        served += 1
        if not runs or served < runs:
            master_gone(host, port)
    return 0


def master_gone(host: str, port: int, bound_s: float = 60.0) -> bool:
    """Wait until nothing listens on the master's port (the run just served is over). Bounded: a next master
    that took the port at once is waiting for its workers, so joining it after the bound is right."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                pass
        except OSError:
            return True
        time.sleep(0.1)       # polling a port: there is nothing to wait on
    return False


if __name__ == "__main__":
    sys.exit(main())
