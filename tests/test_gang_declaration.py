"""Self-tests of how a gang is declared in each native API version a server may serve
(clusterproof/gang/gangs.py ``declaration`` and ``membership``; pure, no cluster): a 1.35 Workload holds its pod
groups and pods name it; from 1.36 the Workload is a template, the PodGroup made from it is what pods name, and
its reference to the template is spelled as that version spells it (k8s.io/api scheduling/v1alpha2 against
v1alpha3/v1beta1)."""
from __future__ import annotations

import pytest

from clusterproof.core.kubeversions import NATIVE_GANG_APIS
from clusterproof.gang.gangs import declaration, membership


def _pod() -> dict:
    return {"metadata": {"name": "p", "labels": {}}, "spec": {"containers": []}}


@pytest.mark.unit
def test_a_135_gang_is_one_workload_of_one_gang_pod_group_that_pods_reference():
    [(path, body)] = declaration("native", "scheduling.k8s.io/v1alpha1", "ns", "g", 4, "run")
    assert path == "/apis/scheduling.k8s.io/v1alpha1/namespaces/ns/workloads" and body["kind"] == "Workload"
    assert body["spec"] == {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 4}}}]}
    assert membership("native", "scheduling.k8s.io/v1alpha1", _pod(), "g")["spec"]["workloadRef"] == {
        "name": "g", "podGroup": "workers"}


@pytest.mark.parametrize("api,ref", [
    ("scheduling.k8s.io/v1alpha2", {"podGroupTemplateRef": {"workload": {"workloadName": "g",
                                                                         "podGroupTemplateName": "workers"}}}),
    ("scheduling.k8s.io/v1alpha3", {"workloadRef": {"workloadName": "g", "templateName": "workers"}}),
    ("scheduling.k8s.io/v1beta1", {"workloadRef": {"workloadName": "g", "templateName": "workers"}}),
])
@pytest.mark.unit
def test_from_136_a_gang_is_a_workload_template_and_the_pod_group_made_from_it_that_pods_name(api, ref):
    (wpath, workload), (gpath, group) = declaration("native", api, "ns", "g", 4, "run")
    assert wpath == f"/apis/{api}/namespaces/ns/workloads" and gpath == f"/apis/{api}/namespaces/ns/podgroups"
    assert workload["spec"] == {"podGroupTemplates": [{"name": "workers",
                                                       "schedulingPolicy": {"gang": {"minCount": 4}}}]}
    assert group["kind"] == "PodGroup" and group["spec"] == {**ref, "schedulingPolicy": {"gang": {"minCount": 4}}}
    assert group["metadata"]["labels"]["clusterproof.io/run"] == "run"
    pod = membership("native", api, _pod(), "g")
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "g"} and "workloadRef" not in pod["spec"]


@pytest.mark.unit
def test_every_native_api_is_declared_and_coscheduling_is_one_pod_group_with_its_label():
    assert {declaration("native", api, "ns", "g", 2, "r")[0][1]["apiVersion"] for api in NATIVE_GANG_APIS} == \
        set(NATIVE_GANG_APIS)
    [(path, body)] = declaration("coscheduling", "", "ns", "g", 2, "r", timeout_s=15)
    assert body["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 15} and "scheduling.x-k8s.io" in path
    assert membership("coscheduling", "", _pod(), "g")["metadata"]["labels"] == {
        "scheduling.x-k8s.io/pod-group": "g"}


@pytest.mark.unit
def test_a_gang_required_in_one_rack_says_so_on_its_template_and_its_pod_group():
    (_, workload), (_, group) = declaration("native", "scheduling.k8s.io/v1beta1", "ns", "g", 2, "r",
                                            topology="example.com/rack")
    want = {"topology": [{"key": "example.com/rack"}]}
    assert workload["spec"]["podGroupTemplates"][0]["schedulingConstraints"] == want
    assert group["spec"]["schedulingConstraints"] == want
    assert "schedulingConstraints" not in declaration("native", "scheduling.k8s.io/v1beta1", "ns", "g", 2, "r")[1][1][
        "spec"]


@pytest.mark.parametrize("how,scheduling", [("indexed", None),
                                            ("spec.scheduling", {"schedulingPolicy": {"gang": {}}})])
@pytest.mark.unit
def test_a_gang_job_asks_for_its_gang_as_its_version_reads_it(how, scheduling):
    from clusterproof.gang.gangs import Backend, Placement
    from clusterproof.gang.jobs import gang_job
    job = gang_job("j", "r", 4, Backend("native", "default-scheduler", "", 300), Placement({"a": "b"}), 8, how)
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (4, 4, "Indexed")
    assert spec.get("scheduling") == scheduling
    assert spec["template"]["spec"]["restartPolicy"] == "Never" and \
        spec["template"]["metadata"]["labels"]["clusterproof.io/gang"] == "j"
