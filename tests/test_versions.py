"""Self-tests of the control plane's version as a profile key and the version table
(clusterproof/core/kubeversions.py; pure helpers; the builds themselves run in `make upgrade-check`,
docs/versions.md).

A version the harness does not know is one line naming the known ones; each known one gets its own
gates, APIs and Go toolchain from its row; a gate of the profile's own that a version does not know must
not stop its apiserver from starting; a version the module proxy does not serve completely must end the
run with one line naming the missing module.
"""
from __future__ import annotations

import pytest

from clusterproof.cluster.kwok import known_feature_gates, split_feature_gates
from clusterproof.config.profile import load_profile
from clusterproof.core import kubeversions
from clusterproof.core.errors import HarnessError
from clusterproof.provision import toolchain


@pytest.mark.unit
def test_gates_a_version_does_not_know_are_left_out_and_named():
    known = {"MutatingAdmissionPolicy", "AllAlpha"}
    kept, dropped = split_feature_gates("GenericWorkload=true, GangScheduling=true,MutatingAdmissionPolicy=true", known)
    assert kept == "MutatingAdmissionPolicy=true" and dropped == ["GenericWorkload", "GangScheduling"]
    assert split_feature_gates("", known) == ("", [])


@pytest.mark.cluster
def test_the_gates_a_version_knows_are_read_from_its_own_apiserver():
    """The pinned kube-apiserver (built by make test's set-up) knows every gate its row turns on."""
    known = known_feature_gates(toolchain.ensure(toolchain.KUBERNETES).path("kube-apiserver"))
    wanted = set(kubeversions.release(toolchain.KUBERNETES_VERSION).gates)
    assert len(known) > 100 and wanted and wanted <= known, sorted(wanted - known)


@pytest.mark.parametrize("output,module", [
    ("go: k8s.io/kubernetes/cmd/kube-apiserver@v1.34.7 requires\n\tk8s.io/dynamic-resource-allocation@v0.34.7: "
     "reading https://proxy.golang.org/k8s.io/dynamic-resource-allocation/@v/v0.34.7.mod: 403 Forbidden",
     "k8s.io/dynamic-resource-allocation@v0.34.7"),
    ("go: k8s.io/csi-translation-lib@v0.34.7: invalid version: unknown revision v0.34.7",
     "k8s.io/csi-translation-lib@v0.34.7"),
    ("go: downloading k8s.io/api v0.35.4\n# k8s.io/kubernetes/cmd/kube-apiserver\nsyntax error", None),
], ids=["403", "unknown-revision", "a-compile-error-is-not-a-missing-module"])
@pytest.mark.unit
def test_the_module_the_proxy_does_not_serve_is_named(output, module):
    assert toolchain.missing_module(output) == module


@pytest.mark.unit
def test_each_version_has_its_own_cache_directory_and_the_pinned_one_is_the_default():
    assert toolchain.kubernetes() is toolchain.KUBERNETES and toolchain.KUBERNETES_VERSION == "v1.37.2"
    old = toolchain.kubernetes("v1.36.3")
    assert old.directory.name == "kubernetes-v1.36.3" and old.directory != toolchain.KUBERNETES.directory
    assert [c.name for c in toolchain.components("v1.36.3")] == [c.name for c in toolchain.COMPONENTS]
    assert toolchain.kubernetes("v1.36.3") in toolchain.components("v1.36.3")


@pytest.mark.parametrize("value", ["v1.34.4", "v1.39.0", "v1.30.2"])
@pytest.mark.unit
def test_a_version_the_harness_does_not_know_is_one_line_naming_the_known_ones(value):
    with pytest.raises(HarnessError) as e:
        load_profile("smoke", [f"kubernetes_version={value}"])
    msg = str(e.value)
    assert f"kubernetes_version {value} is not a version this harness knows" in msg and "\n" not in msg
    assert "v1.35.4, v1.36.3, v1.37.2 (pinned), v1.38.0-beta.0 (pre-release)" in msg, msg
    with pytest.raises(HarnessError, match="known: v1.35.4"):
        toolchain.kubernetes(value)


@pytest.mark.parametrize("version,gates,apis,go", [
    ("v1.35.4", "GenericWorkload=true,GangScheduling=true,MutatingAdmissionPolicy=true",
     "scheduling.k8s.io/v1alpha1=true,admissionregistration.k8s.io/v1beta1=true", "local"),
    ("v1.36.3", "GenericWorkload=true,GangScheduling=true", "scheduling.k8s.io/v1alpha2=true", "local"),
    ("v1.37.2", "GenericWorkload=true", "scheduling.k8s.io/v1beta1=true", "local"),
    ("v1.37.9", "GenericWorkload=true", "scheduling.k8s.io/v1beta1=true", "local"),
    ("v1.38.0-beta.0", "GenericWorkload=true", "scheduling.k8s.io/v1beta1=true", "go1.27.3"),
])
@pytest.mark.unit
def test_each_version_gets_its_rows_gates_apis_and_go_toolchain(version, gates, apis, go):
    assert kubeversions.gates(version) == gates
    assert kubeversions.runtime_config(version) == apis
    assert toolchain.kubernetes_go(version) == go
    assert load_profile("smoke", [f"kubernetes_version={version}"]).kubernetes_version == version


@pytest.mark.unit
def test_the_profiles_own_gates_and_apis_are_added_and_win_over_the_rows():
    assert kubeversions.gates("v1.37.2", "GenericWorkload=false, Foo=true") == "GenericWorkload=false,Foo=true"
    assert kubeversions.runtime_config("v1.36.3", "batch/v2=true") == "scheduling.k8s.io/v1alpha2=true,batch/v2=true"


@pytest.mark.parametrize("server,needs", [
    ("v1.35.4", "feature gates GenericWorkload,GangScheduling and --runtime-config scheduling.k8s.io/v1alpha1=true"),
    ("v1.37.2-gke.100", "feature gate GenericWorkload and --runtime-config scheduling.k8s.io/v1beta1=true"),
    ("v1.33.1", "e.g. Kubernetes 1.37 (this server's v1.33.1 is not in the harness's table)"),
])
@pytest.mark.unit
def test_a_missing_api_is_named_with_what_would_turn_it_on_for_that_servers_version(server, needs):
    assert needs in kubeversions.enable_hint(server, "the Workload API")
    assert kubeversions.enable_hint("v1.37.2", "MutatingAdmissionPolicy") == (
        "MutatingAdmissionPolicy is on by default on Kubernetes 1.37: this server has it turned off")


@pytest.mark.parametrize("value", ["1.34.4", "v1.34", "latest", "v1.38.0-beta"])
@pytest.mark.unit
def test_a_malformed_version_is_one_line_naming_the_key(value):
    with pytest.raises(HarnessError, match=rf"kubernetes_version {value!r} must match"):
        load_profile("smoke", [f"kubernetes_version={value}"])


@pytest.mark.cluster
def test_a_version_the_proxy_does_not_serve_ends_the_build_with_one_line(tmp_path, monkeypatch):
    """The real module proxy: k8s.io/kubernetes v1.37.99 (a known minor, a patch that does not exist; a download
    only, no build)."""
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path))
    with pytest.raises(HarnessError) as e:
        toolchain.ensure(toolchain.kubernetes("v1.37.99"), progress=lambda m: None)
    msg = str(e.value)
    assert "k8s.io/kubernetes@v1.37.99" in msg and "the module proxy does not serve it" in msg, msg
    assert "\n" not in msg


@pytest.mark.unit
def test_the_alpha_gang_gates_come_only_when_the_profile_asks_and_only_where_the_version_has_them():
    assert kubeversions.gates("v1.35.4", alpha=True) == kubeversions.gates("v1.35.4")
    assert kubeversions.gates("v1.37.2", alpha=True) == \
        "GenericWorkload=true,WorkloadWithJob=true,TopologyAwareWorkloadScheduling=true"
    assert kubeversions.gates("v1.36.3", "WorkloadWithJob=false", alpha=True).endswith(
        "WorkloadWithJob=false,TopologyAwareWorkloadScheduling=true")
    assert [kubeversions.release(v).job_gang for v in ("v1.35.4", "v1.36.3", "v1.37.2", "v1.38.0-beta.0")] == \
        ["", "indexed", "spec.scheduling", "spec.scheduling"]


@pytest.mark.unit
def test_the_gates_a_server_runs_are_read_from_its_own_metrics(monkeypatch):
    from clusterproof.kube import apimetrics
    text = ('# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement\n'
            '# TYPE kubernetes_feature_enabled gauge\n'
            'kubernetes_feature_enabled{name="WorkloadWithJob",stage="ALPHA"} 1\n'
            'kubernetes_feature_enabled{name="TopologyAwareWorkloadScheduling",stage="ALPHA"} 0\n')
    monkeypatch.setattr(apimetrics, "scrape", lambda api, prefixes: text)
    assert apimetrics.features(None) == {"WorkloadWithJob": True, "TopologyAwareWorkloadScheduling": False}
