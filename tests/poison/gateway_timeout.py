"""One deterministic 5xx: etcd stopped (SIGSTOP) while a write with a 1 s timeout waits for it, so the
apiserver answers 504; etcd is continued at once (two seconds of stall, well inside every lease)."""
import os
import signal

from kubernetes import client

from clusterproof.core.run import metadata
from clusterproof.kube.client import raw_request


def gateway_timeout(cluster, namespace: str) -> int:
    etcd = cluster.kwok.pids()["etcd"]
    os.kill(etcd, signal.SIGSTOP)
    try:
        raw_request(cluster.api, "POST", f"/api/v1/namespaces/{namespace}/configmaps", {"timeout": "1s"},
                    body={"metadata": metadata("stalled", "poison")}, timeout=30).data
        return 201
    except client.ApiException as e:
        return e.status
    finally:
        os.kill(etcd, signal.SIGCONT)
