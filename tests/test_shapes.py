"""The allowlist of the harness's shapes: one table (clusterproof/kube/shapes.py), the policies that enforce it, the
server's own schema.

- Each policy's key lists are the table's admitted keys, and the Role policy's rules are the load identity's.
- Every policy of both manifests holds the same identities, and the permission check has a request for each.
- Every field of the pod schema the server under test serves (its OpenAPI) is classified, allowed with a reason or
  refused: a field a later Kubernetes adds is named here, and refused by the policies until someone adds it.
Negative controls: a schema with a field the table does not know, and a type it has no table for, are named.
"""
from __future__ import annotations

import ast
import base64
import copy
import json

import pytest

from clusterproof.kube import access, shapes
from clusterproof.kube.client import raw_request
from clusterproof.kube.tokens import LOAD_RULES


def _policies(destructive: bool = True) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in access.manifest_docs(destructive)
            if d["kind"] == "ValidatingAdmissionPolicy"}


def _variable(policy: dict, name: str) -> str:
    return next(v["expression"] for v in policy["spec"].get("variables") or [] if v["name"] == name)


@pytest.mark.parametrize("policy,variable", [pytest.param(p, v, id=f"{p}.{v}") for p, v in shapes.POLICY_KEYS])
@pytest.mark.unit
def test_each_key_list_of_the_policies_is_the_tables(policy, variable):
    listed = json.loads(_variable(_policies()[policy], variable))
    wanted = shapes.admitted(shapes.POLICY_KEYS[(policy, variable)])
    assert sorted(listed) == wanted, f"{policy} {variable}: {sorted(set(listed) ^ set(wanted))} differ"


@pytest.mark.unit
def test_every_policy_holds_object_metadata_to_the_tables_keys():
    wanted = shapes.admitted(shapes.META + "ObjectMeta")
    with_meta = {n: json.loads(_variable(p, "metaKeys")) for n, p in _policies().items()
                 if any(v["name"] == "metaKeys" for v in p["spec"].get("variables") or [])}
    assert len(with_meta) >= 9, sorted(with_meta)
    assert all(sorted(keys) == wanted for keys in with_meta.values()), with_meta


@pytest.mark.unit
def test_the_role_policy_admits_exactly_the_load_identitys_rules():
    rules = ast.literal_eval(" ".join(_variable(_policies()["clusterproof-roles"], "loadRules").split()))
    assert rules == LOAD_RULES


@pytest.mark.unit
def test_every_policy_of_both_manifests_holds_the_same_identities():
    """One definition of who the harness is: every ServiceAccount of its home and pool namespaces."""
    conditions = {n: p["spec"]["matchConditions"] for n, p in _policies().items()}
    assert len({json.dumps(c, sort_keys=True) for c in conditions.values()}) == 1, conditions
    expression = next(iter(conditions.values()))[0]["expression"]
    assert f"system:serviceaccount:{access.HOME}:" in expression and \
        f"system:serviceaccount:{access.POOL_PREFIX}" in expression


@pytest.mark.unit
def test_the_permission_check_sends_a_request_each_policy_must_refuse():
    node = {"metadata": {"name": "n1", "resourceVersion": "1"}, "spec": {}}
    probed = {p.policy for p in access.probes("clusterproof-0", "n1", True, node, frozenset({"podgroups"}))
              if not p.admit}
    assert probed == set(_policies()), sorted(set(_policies()) ^ probed)


@pytest.mark.unit
def test_a_token_says_its_audiences_and_nothing_else_is_read():
    payload = base64.urlsafe_b64encode(json.dumps({"aud": ["https://a", "https://b"], "sub": "x"}).encode()).decode()
    assert access.token_audiences(f"h.{payload.rstrip('=')}.sig") == ["https://a", "https://b"]
    assert access.token_audiences("not-a-jwt") == [] and access.token_audiences("a.!!!.c") == []


@pytest.mark.unit
def test_the_pool_quota_fits_the_nightly_profiles_largest_check():
    from clusterproof.config.profile import load_profile
    hard = next(d for d in access.manifest_docs(False) if d["kind"] == "ResourceQuota"
                and d["metadata"]["namespace"] == "clusterproof-0")["spec"]["hard"]
    needs = access.pool_needs(load_profile("nightly", []))
    assert needs["pods"][0] <= int(hard["pods"]) and needs["requests.nvidia.com/gpu"][0] <= int(
        hard["requests.nvidia.com/gpu"]), (needs, hard)
    bigger = access.pool_needs(load_profile("nightly", ["watch_sizes=9000"]))
    assert bigger["pods"] == (9000, "watch_sizes")


@pytest.fixture(scope="module")
def pod_schemas(cluster) -> dict:
    return json.loads(raw_request(cluster.api, "GET", "/openapi/v3/api/v1").data)["components"]["schemas"]


@pytest.mark.cluster
def test_every_field_of_the_servers_pod_schema_is_allowed_with_a_reason_or_refused(pod_schemas):
    missing = shapes.unclassified(pod_schemas)
    assert not missing, "fields of the server's schema that clusterproof/kube/shapes.py does not classify (the " \
                        "policies refuse them meanwhile; add each, allowed with a reason or refused): " + \
                        ", ".join(missing)


@pytest.mark.cluster
def test_a_field_the_table_does_not_know_is_named(pod_schemas):
    """Negative control: the schema of a later Kubernetes, with one more field in the pod's spec, in a container's
    security context and in the pod's metadata, and a type the table has never seen under an admitted field."""
    later = copy.deepcopy(pod_schemas)
    later[shapes.CORE + "PodSpec"]["properties"]["placementHint"] = {"type": "object"}
    later[shapes.CORE + "SecurityContext"]["properties"]["userNamespace"] = {"type": "string"}
    later[shapes.META + "ObjectMeta"]["properties"]["owner"] = {"type": "string"}
    later[shapes.CORE + "Toleration"]["properties"]["window"] = {
        "allOf": [{"$ref": "#/components/schemas/" + shapes.CORE + "TolerationWindow"}]}
    later[shapes.CORE + "TolerationWindow"] = {"properties": {"from": {"type": "string"}}}
    named = shapes.unclassified(later)
    assert named == sorted([f"{shapes.CORE}PodSpec.placementHint", f"{shapes.CORE}SecurityContext.userNamespace",
                            f"{shapes.META}ObjectMeta.owner", f"{shapes.CORE}Toleration.window"]), named
    later[shapes.CORE + "Toleration"]["properties"].pop("window")
    with_type = copy.deepcopy(later)
    with_type[shapes.CORE + "Container"]["properties"]["securityContext"] = {
        "allOf": [{"$ref": "#/components/schemas/" + shapes.CORE + "NewSecurityContext"}]}
    with_type[shapes.CORE + "NewSecurityContext"] = {"properties": {"x": {"type": "string"}}}
    assert f"{shapes.CORE}NewSecurityContext (a type no table classifies)" in shapes.unclassified(with_type)


# --- every field the table refuses, refused by the policy -----------------------------------------------------

C = shapes.CORE
VOLUME = {"name": "v", "emptyDir": {}}
# A value for each refused field: valid enough to reach admission (where the API server's own validation refuses
# the field first, EARLIER says why).
SAMPLES: dict[str, dict[str, object]] = {
    C + "PodSpec": {
        "nodeName": "n1", "volumes": [VOLUME], "activeDeadlineSeconds": 60, "hostNetwork": True, "hostPID": True,
        "hostIPC": True, "hostUsers": False, "shareProcessNamespace": True, "imagePullSecrets": [{"name": "s"}],
        "hostname": "h", "subdomain": "s", "setHostnameAsFQDN": True, "hostnameOverride": "h",
        "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["a"]}], "dnsConfig": {"nameservers": ["10.0.0.1"]},
        "readinessGates": [{"conditionType": "example.com/ready"}], "runtimeClassName": "kata",
        "overhead": {"cpu": "1"}, "os": {"name": "linux"},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
        "resourceClaims": [{"name": "c", "resourceClaimName": "claim"}],
        "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "10m"}},
        "initContainers": "(a second container named 'first')", "ephemeralContainers": [
            {"name": "debug", "image": "busybox"}], "evictionResponders": [{"name": "example.com/responder"}]},
    C + "Container": {
        "args": ["x"], "workingDir": "/tmp", "ports": [{"containerPort": 80}], "env": [{"name": "A", "value": "b"}],
        "envFrom": [{"configMapRef": {"name": "c"}}], "resizePolicy": [{"resourceName": "cpu",
                                                                        "restartPolicy": "NotRequired"}],
        "restartPolicy": "Always", "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In",
                                                                                             "values": [42]}}],
        "volumeMounts": [{"name": "v", "mountPath": "/v"}], "volumeDevices": [{"name": "v", "devicePath": "/dev/x"}],
        "livenessProbe": {"exec": {"command": ["true"]}}, "readinessProbe": {"exec": {"command": ["true"]}},
        "startupProbe": {"exec": {"command": ["true"]}}, "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
        "stdin": True, "stdinOnce": True, "tty": True},
    C + "SecurityContext": {
        "privileged": True, "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"}, "appArmorProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"level": "s0"}, "windowsOptions": {"runAsUserName": "x"}, "readOnlyRootFilesystem": True,
        "procMount": "Default"},
    C + "PodSecurityContext": {
        "supplementalGroups": [1000], "supplementalGroupsPolicy": "Merge", "fsGroup": 1000,
        "fsGroupChangePolicy": "Always", "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "0"}],
        "seLinuxOptions": {"level": "s0"}, "seLinuxChangePolicy": "Recursive", "windowsOptions": {"runAsUserName": "x"},
        "appArmorProfile": {"type": "RuntimeDefault"}},
    C + "Capabilities": {"add": ["NET_BIND_SERVICE"]},
    C + "SeccompProfile": {"localhostProfile": "p.json"},
    C + "ResourceRequirements": {"claims": [{"name": "c"}]},
    C + "Affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                         {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {}}}]},
                     "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                         {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {}}}]}},
    C + "NodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
        "matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]},
    C + "WorkloadReference": {"podGroupReplicaKey": "0"},
    shapes.META + "ObjectMeta": {"generateName": "g-", "finalizers": ["example.com/keep"],
                                 "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "1"}]},
}
# Refused before the policies see them, by the API server itself (the pod never reaches admission).
EARLIER = {C + "PodSpec.ephemeralContainers": "set only through pods/ephemeralcontainers, never on create",
           C + "SecurityContext.privileged": "the embedded API server runs with --allow-privileged=false",
           C + "PodSpec.runtimeClassName": "no such RuntimeClass: the RuntimeClass plugin refuses it first",
           C + "PodSpec.overhead": "without a RuntimeClass that defines it the RuntimeClass plugin refuses it first"}


def _with(type_name: str, field: str, value) -> dict:
    """The harness's own pod, with ``field`` of ``type_name`` set to ``value``."""
    from clusterproof.kube.pod_spec import pod_body
    pod = pod_body("shape-probe", "shape-probe")
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    target = {C + "PodSpec": spec, C + "Container": c, C + "SecurityContext": c["securityContext"],
              C + "PodSecurityContext": spec["securityContext"],
              C + "Capabilities": c["securityContext"]["capabilities"],
              C + "SeccompProfile": spec["securityContext"]["seccompProfile"],
              C + "ResourceRequirements": c["resources"], shapes.META + "ObjectMeta": pod["metadata"]}
    if type_name == C + "Affinity":
        spec["affinity"] = {field: value}
    elif type_name == C + "NodeAffinity":
        spec["affinity"] = {"nodeAffinity": {field: value}}
    elif type_name == C + "WorkloadReference":
        spec["workloadRef"] = {"name": "g", "podGroup": "workers", field: value}
    elif field == "initContainers":
        spec["initContainers"] = [{**copy.deepcopy(c), "name": "first"}]
    else:
        target[type_name][field] = value
    if field == "localhostProfile":
        target[type_name]["type"] = "Localhost"
    if field == "volumeMounts":
        spec["volumes"] = [VOLUME]
    if field == "volumeDevices":
        spec["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": "block"}}]
    if field == "restartPolicyRules":
        c["restartPolicy"] = "Never"
    if field == "claims":
        spec["resourceClaims"] = [{"name": "c", "resourceClaimName": "claim"}]
    return pod


@pytest.mark.unit
def test_every_field_the_table_refuses_has_a_sample():
    refused = {f"{t}.{k}" for t, table in shapes.TYPES.items() if t in SAMPLES or t.endswith(("PodSpec", "Container"))
               for k, f in table.items() if not f.admitted}
    sampled = {f"{t}.{k}" for t, fields in SAMPLES.items() for k in fields}
    assert refused - sampled == set(), f"refused fields without a sample here: {sorted(refused - sampled)}"


@pytest.fixture(scope="module")
def guest_pods(cluster, run_id, tmp_path_factory):
    """The ServiceAccount's client and a namespace of its own pods that enforces no Pod Security (as a team's)."""
    from clusterproof.kube.client import load_client
    from tests import guest
    ns = f"shapes-{run_id[-4:]}"
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            *access.team_bindings([ns])]
    with guest.applied(cluster.api, docs):
        yield load_client(guest.kubeconfig_for(cluster.api, tmp_path_factory.mktemp("shapes"))[0]), ns


@pytest.mark.cluster
def test_the_policy_refuses_every_field_the_table_refuses(guest_pods):
    """Each refused field of a pod, on the harness's own pod, sent as the ServiceAccount (a server-side dry run) in
    a namespace without Pod Security: refused by clusterproof-pods (or before it, where EARLIER says), or admitted
    only because this server does not serve the field (its feature gate is off: the pod comes back without it)."""
    from kubernetes import client as k8s

    from clusterproof.kube.client import api_message
    api, ns = guest_pods
    wrong = []
    for type_name, fields in SAMPLES.items():
        for field, value in fields.items():
            pod = _with(type_name, field, value)
            try:
                back = json.loads(raw_request(api, "POST", f"/api/v1/namespaces/{ns}/pods", {"dryRun": "All"},
                                              body=pod).data)
                if json.dumps(back).count(f'"{field}"') > json.dumps(_with(type_name, field, None)).count(
                        f'"{field}"'):
                    wrong.append(f"{type_name}.{field}: admitted")
            except k8s.ApiException as e:
                message = api_message(e)
                if "ValidatingAdmissionPolicy 'clusterproof-pods'" not in message and \
                        f"{type_name}.{field}" not in EARLIER:
                    wrong.append(f"{type_name}.{field}: refused ({e.status}), but not by clusterproof-pods: "
                                 f"{message[:200]}")
    assert not wrong, "\n".join(wrong)


SERVICE_SAMPLES: dict[str, dict[str, object]] = {
    C + "ServiceSpec": {"externalIPs": ["192.0.2.1"], "publishNotReadyAddresses": True,
                        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                        "trafficDistribution": "PreferClose", "loadBalancerSourceRanges": ["10.0.0.0/8"],
                        "externalName": "example.com", "externalTrafficPolicy": "Local", "healthCheckNodePort": 30001,
                        "loadBalancerIP": "192.0.2.2", "loadBalancerClass": "example.com/lb",
                        "allocateLoadBalancerNodePorts": True},
    C + "ServicePort": {"nodePort": 30002, "appProtocol": "http"},
}
# What only a NodePort, LoadBalancer or ExternalName Service may carry: sent with that type (refused for the type).
SERVICE_TYPES = {"externalName": "ExternalName", "externalTrafficPolicy": "NodePort", "healthCheckNodePort":
                 "LoadBalancer", "loadBalancerIP": "LoadBalancer", "loadBalancerClass": "LoadBalancer",
                 "allocateLoadBalancerNodePorts": "LoadBalancer", "loadBalancerSourceRanges": "LoadBalancer",
                 "nodePort": "NodePort"}


@pytest.mark.cluster
def test_every_field_the_table_refuses_of_a_service_has_a_sample_and_is_refused(guest_pods, cluster):
    """The same for the harness's Service (the watch suite's per-node one): each refused field, with the type it
    needs where it needs one, is refused by clusterproof-services."""
    from kubernetes import client as k8s

    from clusterproof.core.run import metadata
    from clusterproof.kube.client import api_message
    refused = {f"{t}.{k}" for t in SERVICE_SAMPLES for k, f in shapes.TYPES[t].items() if not f.admitted}
    assert refused == {f"{t}.{k}" for t, fields in SERVICE_SAMPLES.items() for k in fields}, refused
    api, _ns = guest_pods
    pool = access.pool_namespaces(cluster.api)[0]
    wrong = []
    for type_name, fields in SERVICE_SAMPLES.items():
        for field, value in fields.items():
            spec = {"selector": {"clusterproof.io/watch-endpoints": "x"},
                    "ports": [{"name": "metrics", "port": 9100}]}
            if field in SERVICE_TYPES:
                spec["type"] = SERVICE_TYPES[field]
            if field == "sessionAffinityConfig":
                spec["sessionAffinity"] = "ClientIP"
            if field == "healthCheckNodePort":
                spec["externalTrafficPolicy"] = "Local"
            (spec["ports"][0] if type_name.endswith("ServicePort") else spec)[field] = value
            body = {"apiVersion": "v1", "kind": "Service", "metadata": metadata("shape-probe", "shape-probe"),
                    "spec": spec}
            try:
                raw_request(api, "POST", f"/api/v1/namespaces/{pool}/services", {"dryRun": "All"}, body=body).data
                wrong.append(f"{type_name}.{field}: admitted")
            except k8s.ApiException as e:
                if "ValidatingAdmissionPolicy 'clusterproof-services'" not in api_message(e):
                    wrong.append(f"{type_name}.{field}: refused, not by clusterproof-services: {api_message(e)[:200]}")
    assert not wrong, "\n".join(wrong)
