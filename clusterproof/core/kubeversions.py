"""The Kubernetes versions the harness builds, starts and judges, and what differs between them: data, one
row a minor, each fact with the source line or release note that says why. Nothing else in the harness
asks which version it runs: the embedded control plane takes its gates and runtime-config from here, the
build takes its Go toolchain from here, and the suites read the server's own discovery for the APIs they
speak (``clusterproof.kube.client.serving``), naming this table only in a skip line that says what would turn
an API on.

Adding the next version: a row with the tag the Go module proxy serves (``go list -m`` cannot list
k8s.io/kubernetes here: try ``go mod download -json k8s.io/kubernetes@vX.Y.Z``), the ``go`` line of its
go.mod, and its gates and APIs read from its pkg/features/kube_features.go and pkg/apis/; then
``make upgrade-check FROM=<pinned> TO=<new>`` (docs/versions.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from clusterproof.core.errors import HarnessError

# The version the nightly and ./proof test run, and the default of profile key kubernetes_version.
PINNED = "v1.37.2"
# A release tag or pre-release tag: v1.37.2, v1.38.0-beta.0, v1.38.0-rc.1.
TAG = re.compile(r"^v1\.(\d+)\.(\d+)(-(alpha|beta|rc)\.\d+)?$")


@dataclass(frozen=True)
class Minor:
    """What one minor needs from the harness; every entry says why."""
    minor: str                    # "1.37"
    tested: str                   # the tag built and judged here: the newest patch the module proxy serves
    stage: str                    # "supported" or "pre-release"
    # GOTOOLCHAIN for its build: "local" (this machine's Go 1.26) or the newer Go its go.mod's `go` line asks
    # for, which the go command fetches from the module proxy (golang.org/toolchain).
    go: str
    gates: dict[str, str] = field(default_factory=dict)           # feature gate turned on -> why
    runtime_config: dict[str, str] = field(default_factory=dict)  # group/version turned on -> why
    # Alpha gates of native gang features the gang suite judges when the profile turns them on
    # (``kube_alpha_gates``): gate -> what it adds, and where.
    alpha_gates: dict[str, str] = field(default_factory=dict)
    # How a Job asks the Job controller for a gang (WorkloadWithJob): "indexed" (1.36: an Indexed Job whose
    # completions equal its parallelism > 1 is one, pkg/controller/job/util/utils.go IsGangSchedulingCandidate);
    # "spec.scheduling" (1.37: spec.scheduling.schedulingPolicy.gang, minCount defaulting to parallelism,
    # pkg/api/job/util.go defaultMinCountForJob); "" (no such controller).
    job_gang: str = ""
    workload_api: str = ""        # the scheduling.k8s.io version that declares native gangs
    gang: str = ""                # how its native gang is declared (pods' field), for the report
    # The real nodes' kubelet when it cannot be the control plane's own version (empty: the same), and why.
    kubelet: str = ""
    kubelet_why: str = ""


# The native gang's API versions, newest first: v1alpha1 (1.35: Workload.spec.podGroups, pods' spec.workloadRef)
# was removed in 1.36 for v1alpha2 (the Workload a template, PodGroup a runtime object, pods'
# spec.schedulingGroup), which 1.37 replaced with v1alpha3 and v1beta1 (PodGroup.spec.workloadRef instead of
# podGroupTemplateRef). Which one a server serves is read from its discovery, never from its version.
NATIVE_GANG_APIS = ("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3", "scheduling.k8s.io/v1alpha2",
                    "scheduling.k8s.io/v1alpha1")
LEGACY_NATIVE_GANG_API = NATIVE_GANG_APIS[-1]    # the one whose pods name a Workload, not a PodGroup (1.35)
MAP_GATE = "MutatingAdmissionPolicy"
WORKLOAD_GATE = "GenericWorkload"
JOB_GATE = "WorkloadWithJob"
TOPOLOGY_GATE = "TopologyAwareWorkloadScheduling"
# Alpha from 1.36 (pkg/features/kube_features.go of v1.36.3 and v1.37.2; TopologyAwareWorkloadScheduling beta,
# still off by default, in v1.38.0-beta.0), both depending on GenericWorkload.
GANG_ALPHA_GATES = {
    JOB_GATE: "alpha since 1.36, off: the Job controller makes a gang Job's Workload and PodGroup itself "
              "(pkg/controller/job/job_scheduling_manager.go)",
    TOPOLOGY_GATE: "alpha since 1.36, off: a PodGroup's schedulingConstraints.topology places the whole group "
                   "in one domain (pkg/scheduler/schedule_one_podgroup.go)"}

MINORS = {m.minor: m for m in (
    Minor("1.35", "v1.35.4", "supported", "local",
          gates={WORKLOAD_GATE: "alpha, off (pkg/features/kube_features.go): the Workload API",
                 "GangScheduling": "alpha, off: adds the scheduler's GangScheduling plugin "
                                   "(pkg/scheduler/apis/config/v1/default_plugins.go)",
                 MAP_GATE: "beta, off since 1.34: the taint suite's toleration injection"},
          runtime_config={"scheduling.k8s.io/v1alpha1": "Workload (alpha APIs are off by default)",
                          "admissionregistration.k8s.io/v1beta1": "MutatingAdmissionPolicy (beta APIs are off "
                                                                  "by default since 1.24, KEP-3136)"},
          workload_api="scheduling.k8s.io/v1alpha1", gang="Workload.spec.podGroups, pods' spec.workloadRef"),
    Minor("1.36", "v1.36.3", "supported", "local",
          gates={WORKLOAD_GATE: "alpha, off: Workload and PodGroup",
                 "GangScheduling": "alpha, off: adds the GangScheduling plugin (default_plugins.go)"},
          runtime_config={"scheduling.k8s.io/v1alpha2": "Workload and PodGroup (v1alpha1 removed in 1.36)"},
          alpha_gates=GANG_ALPHA_GATES, job_gang="indexed",
          workload_api="scheduling.k8s.io/v1alpha2",
          gang="PodGroup (spec.podGroupTemplateRef), pods' spec.schedulingGroup.podGroupName"),
    Minor("1.37", "v1.37.2", "supported", "local",
          gates={WORKLOAD_GATE: "beta, still off by default; its GangScheduling gate is gone and the plugin "
                                "comes with GenericWorkload (default_plugins.go)"},
          runtime_config={"scheduling.k8s.io/v1beta1": "Workload and PodGroup (beta APIs are off by default; "
                                                       "v1alpha3 is served too, v1alpha2 removed)"},
          alpha_gates=GANG_ALPHA_GATES, job_gang="spec.scheduling",
          workload_api="scheduling.k8s.io/v1beta1",
          gang="PodGroup (spec.workloadRef), pods' spec.schedulingGroup.podGroupName"),
    Minor("1.38", "v1.38.0-beta.0", "pre-release", "go1.27.3",
          gates={WORKLOAD_GATE: "beta, off by default, as in 1.37"},
          runtime_config={"scheduling.k8s.io/v1beta1": "Workload and PodGroup, as in 1.37"},
          alpha_gates=GANG_ALPHA_GATES, job_gang="spec.scheduling",
          workload_api="scheduling.k8s.io/v1beta1",
          gang="PodGroup (spec.workloadRef), pods' spec.schedulingGroup.podGroupName",
          kubelet="v1.37.2",
          kubelet_why="v1.38.0-beta.0's kubelet needs sigs.k8s.io/iptables-wrappers@v1.0.0, which the module "
                      "proxy does not serve (measured 2026-12-07); the version-skew policy lets a kubelet be up "
                      "to three minors older than its API server"),
)}
# MutatingAdmissionPolicy is GA from 1.36 (admissionregistration.k8s.io/v1, on by default): nothing to turn on.


def known() -> str:
    """The versions the harness knows, for a refusal: 'v1.35.4, v1.36.3, v1.37.2 (pinned), v1.38.0-beta.0 ...'."""
    return ", ".join(f"{m.tested}{' (pinned)' if m.tested == PINNED else ''}"
                     f"{' (' + m.stage + ')' if m.stage != 'supported' else ''}" for m in MINORS.values())


def supported() -> list[str]:
    """The tested tag of every supported minor, oldest first (``./proof versions``' default)."""
    return [m.tested for m in MINORS.values() if m.stage == "supported"]


def minor_of(version: str) -> str:
    m = TAG.match(version)
    if not m:
        raise HarnessError(f"kubernetes_version {version!r} is not a release tag like {PINNED} or "
                           f"v1.38.0-beta.0 (known: {known()})")
    return f"1.{m[1]}"


def release(version: str) -> Minor:
    """The row of ``version``'s minor; a minor the harness does not know is one line naming the known ones.
    Any patch of a known minor is accepted (its gates and APIs are the minor's); ``tested`` says which was."""
    m = MINORS.get(minor_of(version))
    if m is None:
        raise HarnessError(f"kubernetes_version {version} is not a version this harness knows how to run and "
                           f"judge (known: {known()}); add its row to clusterproof/core/kubeversions.py "
                           "(docs/versions.md)")
    return m


def written_for(workload_api: str) -> str:
    """Which Kubernetes a native gang manifest in ``workload_api`` was written for: 'Kubernetes 1.35'."""
    minors = [m.minor for m in MINORS.values() if m.workload_api == workload_api]
    return f"Kubernetes {', '.join(minors)}" if minors else "another Kubernetes"


def kubelet_version(version: str) -> str:
    """The real nodes' kubelet for a control plane at ``version``: the same, unless its row names another."""
    return release(version).kubelet or version


def server_minor(git_version: str) -> Minor | None:
    """The row of a running server's minor, from its /version gitVersion (``v1.37.2``,
    ``v1.36.3-eks-...``), or None for a minor the table lacks (an existing cluster may be any)."""
    m = re.match(r"^v1\.(\d+)\.", git_version or "")
    return MINORS.get(f"1.{m[1]}") if m else None


def gates(version: str, extra: str = "", alpha: bool = False) -> str:
    """``--kube-feature-gates`` for ``version``: its row's gates (with ``alpha`` its alpha gang gates too), then
    the profile's own ``extra`` (``A=true,B=false``; a gate named in both takes the profile's value)."""
    row = release(version)
    return _merged({**row.gates, **(row.alpha_gates if alpha else {})}, extra)


def runtime_config(version: str, extra: str = "") -> str:
    """``--kube-runtime-config`` for ``version``: its row's APIs, then the profile's ``extra``."""
    return _merged(release(version).runtime_config, extra)


def _merged(turned_on, extra: str) -> str:
    """``name=true`` for each of ``turned_on``, then ``extra``'s ``name=value`` items over them, in one flag."""
    merged = {name: "true" for name in turned_on}
    for item in filter(None, (x.strip() for x in extra.split(","))):
        name, _, value = item.partition("=")
        merged[name.strip()] = value.strip() or "true"
    return ",".join(f"{k}={v}" for k, v in merged.items())


def enable_hint(git_version: str, what: str) -> str:
    """What turns ``what`` ('the Workload API', 'MutatingAdmissionPolicy') on for a server of ``git_version``:
    its row's gates and runtime-config, or the table's newest supported row as an example."""
    m = server_minor(git_version)
    row = m or release(supported()[-1])
    workload = "Workload" in what
    gs = [g for g in row.gates if g in ((WORKLOAD_GATE, "GangScheduling") if workload else (MAP_GATE,))]
    apis = [gv for gv in row.runtime_config if gv.startswith("scheduling" if workload else "admission")]
    where = (f"Kubernetes {row.minor}" if m else
             f"e.g. Kubernetes {row.minor} (this server's {git_version or 'version'} is not in the harness's table)")
    if not gs and not apis:
        return f"{what} is on by default on {where}: this server has it turned off"
    on = " and ".join(filter(None, [f"feature gate{'s' * (len(gs) > 1)} {','.join(gs)}" if gs else "",
                                    f"--runtime-config {','.join(a + '=true' for a in apis)}" if apis else ""]))
    return (f"{what} on {where} needs {on} on the control plane (profile keys kube_feature_gates and "
            "kube_runtime_config add to the embedded cluster's)")
