"""Self-tests of the control plane's version as a profile key (pure helpers; the builds themselves
run in `make upgrade-check`, docs/baselines.md "Pre-upgrade validation").

A 1.35 profile's feature gates must not stop a 1.34 apiserver from starting,
and a version the module proxy does not serve completely must end the run
with one line naming the missing module.
"""
from __future__ import annotations

import pytest

from clusterproof.cluster.kwok import known_feature_gates, split_feature_gates
from clusterproof.config.profile import load_profile
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
    """The pinned kube-apiserver (built by make test's set-up): 1.35's alpha gates are among its own."""
    known = known_feature_gates(toolchain.ensure(toolchain.KUBERNETES).path("kube-apiserver"))
    assert len(known) > 100 and {"GenericWorkload", "GangScheduling",
                                 "MutatingAdmissionPolicy"} <= known, sorted(known)[:5]


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
    assert toolchain.kubernetes() is toolchain.KUBERNETES
    old = toolchain.kubernetes("v1.34.4")
    assert old.directory.name == "kubernetes-v1.34.4" and old.directory != toolchain.KUBERNETES.directory
    assert [c.name for c in toolchain.components("v1.34.4")] == [c.name for c in toolchain.COMPONENTS]
    assert toolchain.kubernetes("v1.34.4") in toolchain.components("v1.34.4")


@pytest.mark.parametrize("value", ["1.34.4", "v1.34", "latest"])
@pytest.mark.unit
def test_a_malformed_version_is_one_line_naming_the_key(value):
    with pytest.raises(HarnessError, match=rf"kubernetes_version {value!r} must match"):
        load_profile("smoke", [f"kubernetes_version={value}"])


@pytest.mark.cluster
def test_a_version_the_proxy_does_not_serve_ends_the_build_with_one_line(tmp_path, monkeypatch):
    """The real module proxy: k8s.io/kubernetes v1.34.99 does not exist (a download only, no build)."""
    monkeypatch.setenv("CLUSTERPROOF_CACHE", str(tmp_path))
    with pytest.raises(HarnessError) as e:
        toolchain.ensure(toolchain.kubernetes("v1.34.99"), progress=lambda m: None)
    msg = str(e.value)
    assert "k8s.io/kubernetes@v1.34.99" in msg and "the module proxy does not serve it" in msg, msg
    assert "\n" not in msg
