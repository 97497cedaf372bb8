"""Every field of every object kind the harness writes with a schema of its own, each with a verdict and why.

Why a table: the admission policies of ``clusterproof/kube/rbac.yaml`` are an allowlist -- an object of the
harness's identities is admitted only in the shape the harness's own builders make
(``clusterproof/kube/pod_spec.py`` and its peers), so a field the harness does not use is refused, and so is a
field a later Kubernetes adds, until someone adds it here on purpose. This table is that allowlist, said once
with the reason for each field:

- ``SET``: the harness's builders set it;
- ``SERVER``: the API server or its built-in admission fills it in before the policies see the object (a
  default, an allocated address, a toleration of ``DefaultTolerationSeconds``); admitted, held to the value
  named;
- ``REFUSED``: neither; a request that carries it is refused, with the reason a reviewer would give.

The policies carry the admitted keys of each type as a variable (a JSON list, ``POLICY_KEYS`` names which);
tests/test_shapes.py holds the two equal, and reads the server's own OpenAPI to fail on any field of these
types that the table does not classify -- a field new in the server under test is named there, refused by the
policies meanwhile. Pure data: no Kubernetes client.
"""
from __future__ import annotations

from dataclasses import dataclass

SET, SERVER, REFUSED = "set", "server", "refused"


@dataclass(frozen=True)
class Field:
    verdict: str
    why: str

    @property
    def admitted(self) -> bool:
        return self.verdict != REFUSED


def s(why: str) -> Field:
    return Field(SET, why)


def srv(why: str) -> Field:
    return Field(SERVER, why)


def no(why: str) -> Field:
    return Field(REFUSED, why)


CORE, META = "io.k8s.api.core.v1.", "io.k8s.apimachinery.pkg.apis.meta.v1."
NO_PATH = "the harness's pods mount nothing, listen on nothing and read nothing of the node's or a tenant's"

TYPES: dict[str, dict[str, Field]] = {
    # --- what every kind's metadata may hold ---------------------------------------------------------------
    META + "ObjectMeta": {
        "name": s("core.run.metadata: every object has a name of the harness's"),
        "namespace": s("from the request's path"),
        "labels": s("clusterproof.io/* keys (the run label among them) and Coscheduling's "
                    "scheduling.x-k8s.io/pod-group; a foreign label would let a tenant's Service or selector "
                    "take the object for its own"),
        "annotations": s("clusterproof.io/* keys only (owner host, creation time, the owner record's proof), "
                         "each value at most 256 characters"),
        "uid": srv("assigned by the API server"),
        "resourceVersion": srv("assigned by the API server; a conditional write sends the one it read"),
        "generation": srv("assigned by the API server"),
        "creationTimestamp": srv("assigned by the API server"),
        "managedFields": srv("server-side field ownership, recorded by the API server"),
        "deletionTimestamp": srv("set by the API server when the object is deleted"),
        "deletionGracePeriodSeconds": srv("set by the API server when the object is deleted"),
        "selfLink": srv("deprecated, cleared by the API server"),
        "generateName": no("the harness names every object itself"),
        "finalizers": no("a finalizer keeps a deleted object, and its namespace, until someone removes it"),
        "ownerReferences": no("the garbage collector would delete the object with its owner, or an owner "
                              "the harness does not own would claim it"),
    },
    # --- pods (and the pod of a PodTemplate) -------------------------------------------------------------
    CORE + "Pod": {
        "apiVersion": srv("the request's"), "kind": srv("the request's"),
        "metadata": s("ObjectMeta above"), "spec": s("PodSpec below"),
        "status": srv("reset by the API server on create; only the Ready condition changes later (pods/status)"),
    },
    CORE + "PodTemplate": {
        "apiVersion": srv("the request's"), "kind": srv("the request's"),
        "metadata": s("ObjectMeta above"),
        "template": s("the API-latency probe's template: a pod's spec, held to the pod's rules"),
    },
    CORE + "PodTemplateSpec": {
        "metadata": srv("empty: the probe's template has no labels or annotations (nothing instantiates it)"),
        "spec": s("PodSpec below"),
    },
    CORE + "PodSpec": {
        "containers": s("pod_spec.pod_body: one container, the pause image (a GPU checker: its image and "
                        "command)"),
        "restartPolicy": s("Never for one-shot ranks and checkers; Always by default"),
        "terminationGracePeriodSeconds": s("0: simulated pods go at once (at most 30, the default)"),
        "automountServiceAccountToken": s("false: no pod of the harness holds a credential"),
        "securityContext": s("Pod Security restricted: non-root, RuntimeDefault seccomp"),
        "schedulerName": s("the gang scheduler the profile names, or none for the default"),
        "nodeSelector": s("a pool label or a node's hostname: placed by the scheduler"),
        "affinity": s("required node affinity only: a node's hostname, or metadata.name as a DaemonSet pins"),
        "tolerations": s("exact tolerations (key, Equal, value, effect) of the taints a check names"),
        "priorityClassName": s("the profile's low_priority_class for borrowing pods (priority below 0)"),
        "schedulingGates": s("only clusterproof.io/never-scheduled: the taint suite's pods that ask the "
                             "cluster's admission about a wildcard toleration never run"),
        "workloadRef": s("native gang scheduling (Kubernetes 1.35): the pod's Workload and pod group"),
        "schedulingGroup": s("native gang scheduling (Kubernetes 1.36 and later): the pod's PodGroup"),
        "evictionResponders": no("alpha in 1.37 (EvictionRequestAPI): controllers that may hold up an eviction of "
                                 "the pod; no pod of the harness names one"),
        "dnsPolicy": srv("defaulted to ClusterFirst (the only value admitted)"),
        "serviceAccountName": srv("defaulted to the namespace's default ServiceAccount (the only one admitted)"),
        "serviceAccount": srv("the deprecated alias of serviceAccountName, filled in by the API server"),
        "priority": srv("set from the PriorityClass by the Priority admission plugin; at most 0"),
        "preemptionPolicy": srv("set from the PriorityClass by the Priority admission plugin"),
        "enableServiceLinks": srv("defaulted to true"),
        "nodeName": no("skips the scheduler and every taint, a team's and a preflight's: pods are placed by "
                       "the scheduler (pinned by node affinity on metadata.name, as a DaemonSet pins)"),
        "volumes": no(NO_PATH + ": a volume is a path to the node's files, a Secret, a ConfigMap, a claim "
                      "or a token"),
        "initContainers": no("code that runs before the container; the harness runs none"),
        "ephemeralContainers": no("debug containers in a running pod; the harness adds none"),
        "activeDeadlineSeconds": no("the harness deletes its pods itself"),
        "hostNetwork": no("the node's network namespace"),
        "hostPID": no("the node's processes"),
        "hostIPC": no("the node's IPC namespace"),
        "hostUsers": no("the user namespace setting is the cluster's default"),
        "shareProcessNamespace": no("the harness's pods have one container"),
        "imagePullSecrets": no("a tenant's registry credential"),
        "hostname": no("with subdomain, a DNS name under a tenant's headless Service"),
        "subdomain": no("a DNS name under a tenant's headless Service"),
        "setHostnameAsFQDN": no("unused"),
        "hostnameOverride": no("unused"),
        "hostAliases": no("entries in the pod's hosts file; unused"),
        "dnsConfig": no("the pod's resolver; unused"),
        "readinessGates": no("unused"),
        "runtimeClassName": no("a runtime the cluster's operators did not choose for it, and its overhead"),
        "overhead": no("set only with a runtimeClassName"),
        "topologySpreadConstraints": no("unused: placement is by node selector and affinity"),
        "os": no("unused"),
        "resourceClaims": no("a device of another claim (DRA), a tenant's among them"),
        "resources": no("pod-level resources: the harness's requests are its container's"),
    },
    CORE + "Container": {
        "name": s("'work'"),
        "image": s("the pause image (kwok runs nothing), or the profile's preflight_image for a GPU checker"),
        "command": s("the GPU checker's command"),
        "resources": s("requests = limits: 10m CPU and 16Mi, or whole-node nvidia.com/gpu"),
        "securityContext": s("no privilege escalation, every capability dropped"),
        "imagePullPolicy": srv("defaulted from the image's tag"),
        "terminationMessagePath": srv("defaulted to /dev/termination-log (the only path admitted)"),
        "terminationMessagePolicy": srv("defaulted to File"),
        "args": no("unused: the checker's arguments are its command's"),
        "workingDir": no("unused"),
        "ports": no("the harness's containers listen on nothing; a hostPort opens the node"),
        "env": no("env.valueFrom reads a tenant's Secret or ConfigMap, and a log or termination message "
                  "shows it to anyone who may read pods"),
        "envFrom": no("a whole Secret or ConfigMap in the environment"),
        "resizePolicy": no("unused"),
        "restartPolicy": no("sidecar containers; unused"),
        "restartPolicyRules": no("unused"),
        "volumeMounts": no(NO_PATH),
        "volumeDevices": no(NO_PATH),
        "livenessProbe": no("probes run commands or reach the network; unused"),
        "readinessProbe": no("probes run commands or reach the network; unused"),
        "startupProbe": no("probes run commands or reach the network; unused"),
        "lifecycle": no("hooks run commands; unused"),
        "stdin": no("unused"), "stdinOnce": no("unused"), "tty": no("unused"),
    },
    CORE + "SecurityContext": {
        "allowPrivilegeEscalation": s("false (Pod Security restricted)"),
        "capabilities": s("drop ALL, add none"),
        "privileged": no("the node itself"),
        "runAsUser": no("set for the pod, never overridden per container (0 is root)"),
        "runAsGroup": no("set for the pod, never overridden per container"),
        "runAsNonRoot": no("set for the pod, never overridden per container"),
        "seccompProfile": no("set for the pod (RuntimeDefault), never overridden per container"),
        "appArmorProfile": no("the runtime's default; Unconfined is weaker than restricted"),
        "seLinuxOptions": no("an SELinux label of the operators'"),
        "windowsOptions": no("unused"),
        "readOnlyRootFilesystem": no("unused"),
        "procMount": no("an unmasked /proc"),
    },
    CORE + "Capabilities": {
        "drop": s("['ALL']"),
        "add": no("every capability stays dropped"),
    },
    CORE + "PodSecurityContext": {
        "runAsNonRoot": s("true"), "runAsUser": s("65534 (nobody)"), "runAsGroup": s("65534"),
        "seccompProfile": s("RuntimeDefault"),
        "supplementalGroups": no("group 0 or a tenant's group"),
        "supplementalGroupsPolicy": no("unused"),
        "fsGroup": no("unused: no volumes"),
        "fsGroupChangePolicy": no("unused: no volumes"),
        "sysctls": no("kernel parameters of the pod's namespaces"),
        "seLinuxOptions": no("an SELinux label of the operators'"),
        "seLinuxChangePolicy": no("unused"),
        "windowsOptions": no("unused"),
        "appArmorProfile": no("the runtime's default; Unconfined is weaker than restricted"),
    },
    CORE + "SeccompProfile": {
        "type": s("RuntimeDefault"),
        "localhostProfile": no("a profile file of the node's"),
    },
    CORE + "ResourceRequirements": {
        "requests": s("cpu and memory, or nvidia.com/gpu"),
        "limits": s("the same as the requests"),
        "claims": no("a device of a claim (DRA)"),
    },
    CORE + "Toleration": {
        "key": s("the taint's key"), "operator": s("Equal: one taint exactly"),
        "value": s("the taint's value"), "effect": s("the taint's effect"),
        "tolerationSeconds": srv("only on the node.kubernetes.io/not-ready and unreachable tolerations of "
                                 "the DefaultTolerationSeconds admission plugin"),
    },
    CORE + "Affinity": {
        "nodeAffinity": s("required node affinity"),
        "podAffinity": no("unused"), "podAntiAffinity": no("unused"),
    },
    CORE + "NodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": s("a node's hostname or metadata.name"),
        "preferredDuringSchedulingIgnoredDuringExecution": no("unused"),
    },
    CORE + "NodeSelector": {"nodeSelectorTerms": s("one term")},
    CORE + "NodeSelectorTerm": {"matchExpressions": s("kubernetes.io/hostname In [...]"),
                                "matchFields": s("metadata.name In [node]")},
    CORE + "NodeSelectorRequirement": {"key": s("hostname or metadata.name"), "operator": s("In"),
                                       "values": s("node names")},
    CORE + "WorkloadReference": {"name": s("the gang's Workload"), "podGroup": s("'workers'"),
                                 "podGroupReplicaKey": no("unused")},
    CORE + "PodSchedulingGate": {"name": s("clusterproof.io/never-scheduled")},
    CORE + "PodSchedulingGroup": {"podGroupName": s("the gang's PodGroup")},
    # --- the other kinds with a schema of their own ------------------------------------------------------
    CORE + "Service": {
        "apiVersion": srv("the request's"), "kind": srv("the request's"),
        "metadata": s("ObjectMeta above"), "spec": s("ServiceSpec below"),
        "status": srv("the API server's"),
    },
    CORE + "ServiceSpec": {
        "selector": s("clusterproof.io/* labels of the harness's own pods"),
        "ports": s("one port"),
        "type": srv("defaulted to ClusterIP (the only type admitted)"),
        "clusterIP": srv("allocated by the API server"),
        "clusterIPs": srv("allocated by the API server"),
        "ipFamilies": srv("defaulted by the API server"),
        "ipFamilyPolicy": srv("defaulted by the API server"),
        "sessionAffinity": srv("defaulted to None (the only value admitted)"),
        "internalTrafficPolicy": srv("defaulted to Cluster (the only value admitted)"),
        "externalIPs": no("captures that address's traffic on every node (CVE-2020-8554)"),
        "externalName": no("a DNS alias to anywhere"),
        "externalTrafficPolicy": no("only for NodePort and LoadBalancer Services"),
        "healthCheckNodePort": no("a port on every node"),
        "loadBalancerIP": no("a load balancer"), "loadBalancerClass": no("a load balancer"),
        "loadBalancerSourceRanges": no("a load balancer"),
        "allocateLoadBalancerNodePorts": no("a load balancer's node ports"),
        "publishNotReadyAddresses": no("unused"),
        "sessionAffinityConfig": no("unused"),
        "trafficDistribution": no("unused"),
    },
    CORE + "ServicePort": {
        "name": s("'metrics'"), "port": s("9100"),
        "protocol": srv("defaulted to TCP"), "targetPort": srv("defaulted to the port"),
        "nodePort": no("a port open on every node"),
        "appProtocol": no("unused"),
    },
    CORE + "ServiceAccount": {
        "apiVersion": srv("the request's"), "kind": srv("the request's"),
        "metadata": s("ObjectMeta above; the name is clusterproof-load"),
        "secrets": no("a token Secret of the account"),
        "imagePullSecrets": no("a registry credential"),
        "automountServiceAccountToken": no("the load identity is never mounted into a pod"),
    },
    CORE + "ConfigMap": {
        "apiVersion": srv("the request's"), "kind": srv("the request's"),
        "metadata": s("ObjectMeta above"),
        "data": s("an owner record (home, at most 256 KiB) or the well-behaved client's counter (pool, "
                  "at most 1 KiB)"),
        "binaryData": no("unused"),
        "immutable": no("an owner record is patched while the run lives"),
    },
}

# Which policy variable (in which policy of rbac.yaml) holds the admitted keys of which type.
POLICY_KEYS: dict[tuple[str, str], str] = {
    ("clusterproof-pods", "podKeys"): CORE + "Pod",
    ("clusterproof-pods", "podTemplateKeys"): CORE + "PodTemplate",
    ("clusterproof-pods", "metaKeys"): META + "ObjectMeta",
    ("clusterproof-pods", "templateKeys"): CORE + "PodTemplateSpec",
    ("clusterproof-pods", "specKeys"): CORE + "PodSpec",
    ("clusterproof-pods", "containerKeys"): CORE + "Container",
    ("clusterproof-pods", "securityKeys"): CORE + "SecurityContext",
    ("clusterproof-pods", "capabilityKeys"): CORE + "Capabilities",
    ("clusterproof-pods", "podSecurityKeys"): CORE + "PodSecurityContext",
    ("clusterproof-pods", "seccompKeys"): CORE + "SeccompProfile",
    ("clusterproof-pods", "resourceKeys"): CORE + "ResourceRequirements",
    ("clusterproof-pods", "tolerationKeys"): CORE + "Toleration",
    ("clusterproof-pods", "affinityKeys"): CORE + "Affinity",
    ("clusterproof-pods", "nodeAffinityKeys"): CORE + "NodeAffinity",
    ("clusterproof-pods", "nodeSelectorKeys"): CORE + "NodeSelector",
    ("clusterproof-pods", "termKeys"): CORE + "NodeSelectorTerm",
    ("clusterproof-pods", "requirementKeys"): CORE + "NodeSelectorRequirement",
    ("clusterproof-pods", "workloadRefKeys"): CORE + "WorkloadReference",
    ("clusterproof-pods", "gateKeys"): CORE + "PodSchedulingGate",
    ("clusterproof-pods", "schedulingGroupKeys"): CORE + "PodSchedulingGroup",
    ("clusterproof-services", "metaKeys"): META + "ObjectMeta",
    ("clusterproof-services", "serviceKeys"): CORE + "Service",
    ("clusterproof-services", "specKeys"): CORE + "ServiceSpec",
    ("clusterproof-services", "portKeys"): CORE + "ServicePort",
    ("clusterproof-serviceaccounts", "metaKeys"): META + "ObjectMeta",
    ("clusterproof-serviceaccounts", "accountKeys"): CORE + "ServiceAccount",
    ("clusterproof-configmaps", "metaKeys"): META + "ObjectMeta",
    ("clusterproof-configmaps", "configMapKeys"): CORE + "ConfigMap",
}

# The kinds whose schema the self-test walks from the server's OpenAPI, and through which of their fields.
# A type reached through an admitted field is walked too: a new field anywhere under it is named.
ROOTS = [CORE + "Pod", CORE + "PodTemplate", CORE + "Service", CORE + "ServiceAccount", CORE + "ConfigMap"]
# Types whose fields are not walked: the API server fills them in (or they hold quantities, not fields).
LEAVES = {META + "ManagedFieldsEntry", META + "Time", "io.k8s.apimachinery.pkg.api.resource.Quantity",
          "io.k8s.apimachinery.pkg.util.intstr.IntOrString", CORE + "PodStatus", CORE + "ServiceStatus"}


def admitted(type_name: str) -> list[str]:
    """The keys of ``type_name`` the policies admit (SET and SERVER), sorted."""
    return sorted(k for k, f in TYPES[type_name].items() if f.admitted)


def unclassified(schemas: dict) -> list[str]:
    """'<type>.<field>' for every field of the OpenAPI ``schemas`` (components.schemas of /openapi/v3/api/v1)
    reachable from ``ROOTS`` through admitted fields that ``TYPES`` does not classify, and every type so
    reached that it has no table for."""
    out: list[str] = []
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in seen or name in LEAVES:
            continue
        seen.add(name)
        schema = schemas.get(name)
        if schema is None:
            continue
        table = TYPES.get(name)
        if table is None:
            out.append(f"{name} (a type no table classifies)")
            continue
        for field, prop in sorted((schema.get("properties") or {}).items()):
            verdict = table.get(field)
            if verdict is None:
                out.append(f"{name}.{field}")
            elif verdict.admitted and verdict.verdict == SET:
                todo += _refs(prop)
    return sorted(out)


def _refs(prop: dict) -> list[str]:
    """Schema names a property refers to, through arrays, maps and allOf wrappers."""
    found = []
    ref = prop.get("$ref")
    if ref:
        found.append(ref.rsplit("/", 1)[-1])
    for sub in (prop.get("items"), prop.get("additionalProperties")):
        if isinstance(sub, dict):
            found += _refs(sub)
    for sub in prop.get("allOf") or []:
        found += _refs(sub)
    return found
