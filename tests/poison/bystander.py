"""A module that runs after a poisoning one (for tests/test_supervision.py; not collected by itself).

It needs a working scheduler: a pod must be bound.
"""
import pytest

from clusterproof.gang.gangs import wait_pods_bound
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import create_pods


@pytest.mark.cluster
def test_a_pod_is_bound(cluster, namespace, run_id):
    create_pods(cluster.api, namespace, [pod_body("bystander", run_id)])
    wait_pods_bound(cluster.api, namespace, ["bystander"], 90, "the bystander pod bound")
