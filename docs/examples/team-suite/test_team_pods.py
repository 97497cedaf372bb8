"""The team's checks: plain pytest functions using the harness's fixtures.

- `cluster`: the cluster under test (an embedded one the harness starts, or `--cp-kubeconfig`);
  `cluster.api` is a kubernetes ApiClient.
- `profile`: the run's profile, the team's keys included (`profile.team_pods`).
- `namespace`: a fresh namespace for this test, emptied and removed afterwards.
- `figures`: the figure recorder; what it records goes to summary.json and the report.
"""
import time

from kubernetes import client

from clusterproof.kube.pod_spec import pod_body


def test_the_team_pods_are_all_scheduled(cluster, profile, namespace, figures):
    core = client.CoreV1Api(cluster.api)
    t0 = time.monotonic()
    for i in range(profile.team_pods):
        core.create_namespaced_pod(namespace, pod_body(f"team-{i}", cluster.run_id))
    bound = 0
    while time.monotonic() - t0 < profile.team_schedule_s:
        pods = core.list_namespaced_pod(namespace).items
        bound = sum(1 for p in pods if p.spec.node_name)
        if bound == profile.team_pods:
            break
        time.sleep(0.5)
    took = time.monotonic() - t0
    figures.add("team pods scheduled", bound, "pods", threshold=profile.team_pods, op=">=", headline=True)
    figures.add("time to schedule the team pods", took, "s", threshold=profile.team_schedule_s, op="<=")
    assert bound == profile.team_pods, (
        f"{bound} of {profile.team_pods} pods got a node within {profile.team_schedule_s:g} s")


def test_every_node_is_ready(cluster, figures):
    nodes = client.CoreV1Api(cluster.api).list_node().items
    not_ready = [n.metadata.name for n in nodes
                 if not any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
    figures.add("nodes not Ready", len(not_ready), "nodes", threshold=0, op="<=")
    assert nodes and not not_ready, f"{len(not_ready)} of {len(nodes)} nodes not Ready: {not_ready[:5]}"
