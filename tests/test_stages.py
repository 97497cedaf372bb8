"""clusterproof.cluster.stages: kwokctl's default Stages, built as kwokctl builds them, but for one selector term."""
from __future__ import annotations

import pytest
import yaml

from clusterproof.cluster import stages
from clusterproof.core.errors import HarnessError

pytestmark = pytest.mark.unit


def _stage(name: str, **spec) -> dict:
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def module(tmp_path):
    """A kwok module's stage presets, as few fields as the code reads."""
    files = {
        "node/fast/node-initialize.yaml": _stage("node-initialize"),
        "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml": _stage(
            "node-heartbeat-with-lease", delay={"durationMilliseconds": 600000, "jitterDurationMilliseconds": 610000}),
        "node/heartbeat/node-heartbeat.yaml": _stage(
            "node-heartbeat", delay={"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000}),
        "pod/fast/pod-ready.yaml": _stage("pod-ready"),
        "pod/fast/pod-complete.yaml": _stage("pod-complete", selector={"matchExpressions": [
            {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}]}),
        "pod/fast/pod-delete.yaml": _stage("pod-delete"),
    }
    for rel, body in files.items():
        path = tmp_path / stages.PRESETS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(body))
    return tmp_path


def test_the_defaults_in_kwokctls_order_with_a_pod_that_runs_until_deleted(module):
    out = stages.stages(module, heartbeat_factor=5, node_lease_duration_s=40)
    assert [s["metadata"]["name"] for s in out] == ["node-initialize", "node-heartbeat-with-lease", "pod-ready",
                                                     "pod-complete", "pod-delete"]
    complete = out[3]["spec"]["selector"]["matchExpressions"]
    assert complete[0]["values"] == ["Job"]
    assert complete[-1] == {"key": f'.metadata.annotations["{stages.RUNS_UNTIL_DELETED}"]', "operator": "DoesNotExist"}
    # 10 s x 5 = 50 s of status update frequency is below the preset's 600 s: the delay stays as shipped
    assert out[1]["spec"]["delay"] == {"durationMilliseconds": 600000, "jitterDurationMilliseconds": 610000}


def test_the_heartbeat_is_never_sooner_than_the_status_update_frequency(module):
    out = stages.stages(module, heartbeat_factor=100, node_lease_duration_s=40)    # 1,000 s of update frequency
    assert out[1]["spec"]["delay"] == {"durationMilliseconds": 1_000_000, "jitterDurationMilliseconds": 1_100_000}


def test_without_node_leases_the_plain_heartbeat(module):
    out = stages.stages(module, heartbeat_factor=1, node_lease_duration_s=0)
    assert out[1]["metadata"]["name"] == "node-heartbeat"
    assert out[1]["spec"]["delay"] == {"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000}


def test_a_module_without_the_presets_is_named(tmp_path):
    with pytest.raises(HarnessError, match="stage preset .* is missing"):
        stages.stages(tmp_path, 5, 40)
