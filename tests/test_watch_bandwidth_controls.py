"""Negative controls, bad input, read-only mode and cleanup for suites/test_watch_bandwidth.py.

The suite runs as a user would run it (a pytest subprocess; ``--cp-kubeconfig``
on this session's embedded cluster, except where the control needs a cluster
configured differently, which the suite then starts itself):

- no healthy run of its own: the gate runs the suite whole on smoke beside the
  self-tests, and as a guest (tests/test_permissions.py); the agreement
  control below asserts the other checks pass beside it, with their plots;
- kube-controller-manager with ``--max-endpoints-per-slice=1000``
  (``--cp-set watch_kcm_max_endpoints_per_slice=1000``, the suite's own embedded
  cluster): the slice-size and budget checks fail, naming the slice size and
  the bytes per change;
- the kube-proxy-like watchers fed the ``Endpoints`` object
  (``watch_slice_resource=endpoints``): the budget check fails;
- the byte count compared with the other API's apiserver metric
  (``watch_metric_resource=other``): the agreement check fails, and only it;
- read-only mode on an existing Service that something else churns: the
  checks pass and the run creates nothing;
- bad input is one line (exit 4); Ctrl-C in the middle of the churn leaves
  nothing of the run.
"""
from __future__ import annotations

import os

import pytest

from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_raw
from tests import guest
from tests.harness import (
    allure_figures,
    allure_results,
    assert_one_line,
    background_pytest,
    ended_early,
    interrupt,
    run_leftovers,
    run_pytest,
)

pytestmark = pytest.mark.control
SUITE = "suites/test_watch_bandwidth.py"
T = "[per-node-service]"
PER_EVENT = "test_each_slice_event_carries_one_slice_within_the_endpoint_limit" + T
ONLY_CHANGED = "test_only_the_slices_that_changed_are_sent" + T
EVERY = "test_every_watcher_receives_every_change" + T
BUDGET = "test_slice_bytes_per_change_stay_within_the_budget" + T
AGREE = "test_harness_byte_count_agrees_with_the_apiserver_metrics" + T
TRUNCATED = "test_endpoints_are_truncated_at_1000_addresses_with_the_over_capacity_annotation" + T
WARNING = "test_endpoints_api_answers_with_a_deprecation_warning" + T
CAPPED = "test_endpoints_cost_per_change_stops_growing_at_the_truncation" + T
ALL = {PER_EVENT, ONLY_CHANGED, EVERY, BUDGET, AGREE, TRUNCATED, WARNING, CAPPED}


def _rid(tag: str) -> str:
    return f"watch{tag}-{os.urandom(2).hex()}"


def _run(cluster, profile, tmp_path, *sets, existing=True, timeout=900):
    rid = _rid("c")
    args = [SUITE, "--cp-profile", profile.name, "--cp-run-id", rid, *[f"--cp-set={s}" for s in sets]]
    if existing:
        args += ["--cp-kubeconfig", str(cluster.kubeconfig)]
    return rid, run_pytest(args, tmp_path, timeout=timeout)


def _assert_nothing_left(cluster, rid):
    wait_for(lambda: run_leftovers(cluster.api, rid), until=lambda left: not left, timeout=180, interval=1,
             what=f"nothing of run {rid} left")


# --- negative controls ---------------------------------------------------------------------------

def test_slices_of_1000_endpoints_fail_the_slice_checks(cluster, profile, tmp_path):
    """kube-controller-manager --max-endpoints-per-slice=1000: every change resends up to 1,000 endpoints."""
    rid, run = _run(cluster, profile, tmp_path, "watch_kcm_max_endpoints_per_slice=1000", "watch_sizes=100,400",
                    existing=False)
    assert run.returncode == 1, run.output[-4000:]
    assert set(run.failures) == {PER_EVENT, BUDGET}, run.output[-4000:]
    msg = run.failures[PER_EVENT]
    assert "at 400 endpoints a protobuf slice event carried 400 endpoints, more than the 100 of " \
           "max-endpoints-per-slice" in msg, msg
    assert "the Service's slices hold [400]" in msg, msg
    msg = run.failures[BUDGET]
    assert "at 400 endpoints each protobuf slice watcher received" in msg and "per endpoint change" in msg, msg
    assert "budget 1 x one full slice of 100 endpoints" in msg and "the largest event carried 400 endpoints" in msg
    assert "at 100 endpoints" not in msg, msg     # a 100-endpoint Service is one slice either way
    assert "Traceback" not in run.output


def test_watchers_fed_the_endpoints_object_fail_the_slice_budget(cluster, profile, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "watch_slice_resource=endpoints", "watch_sizes=100,400")
    assert run.returncode == 1, run.output[-4000:]
    msg = run.failures.get(BUDGET, "")
    assert "at 400 endpoints each json slice watcher received" in msg, run.output[-4000:]
    assert "the largest event carried 400 endpoints" in msg, msg
    assert "at 400 endpoints a protobuf slice event carried 400 endpoints" in run.failures.get(PER_EVENT, "")
    _assert_nothing_left(cluster, rid)


def test_byte_count_against_the_other_apis_metric_fails_the_agreement(cluster, profile, tmp_path):
    """Only the agreement check fails; the others pass beside it, with their plots and figures (the gate runs the
    suite whole on smoke beside the self-tests, and every suite as a guest: no healthy run of its own here)."""
    rid, run = _run(cluster, profile, tmp_path, "watch_metric_resource=other", "watch_sizes=100")
    assert run.returncode == 1, run.output[-4000:]
    assert set(run.failures) == {AGREE}, run.output[-4000:]
    msg = run.failures[AGREE]
    assert "apiserver_watch_events_sizes for endpoints says" in msg and "on 50 endpointslices watchers" in msg, msg
    assert "(tolerance 2%)" in msg, msg
    assert {CAPPED, BUDGET, EVERY} <= set(run.passed), run.output[-3000:]
    res = allure_results(tmp_path)
    atts = {a["name"] for a in res[CAPPED].get("attachments", [])}
    assert any(n.startswith("Watch egress of a per-node Service") for n in atts), atts
    figs = allure_figures(tmp_path, res[BUDGET])
    assert any(f.startswith("bytes per endpoint change per watcher, protobuf") for f in figs), figs
    _assert_nothing_left(cluster, rid)


# --- read-only mode ------------------------------------------------------------------------------

@pytest.fixture
def churned_service(cluster, profile, run_id):
    """A per-node Service of 150 endpoints that something else churns (tests/guest.py)."""
    with guest.churned_service(cluster.api, profile, run_id) as found:
        yield found


@pytest.fixture
def least_privilege(cluster, tmp_path):
    """A kubeconfig with the token of the shipped ServiceAccount (clusterproof/kube/rbac.yaml, read-only roles)."""
    return guest.kubeconfig_for(cluster.api, tmp_path)


def test_read_only_mode_measures_an_existing_service_and_creates_nothing(cluster, profile, churned_service,
                                                                        least_privilege, tmp_path):
    """As an SRE runs it on a real cluster: a token identity with the shipped read-only role (the watch
    streams authenticate with the token), an existing Service that something else churns."""
    name, svc = churned_service
    kubeconfig, token = least_privilege
    pods_before = {p["metadata"]["name"]
                   for p in list_raw(cluster.api, f"/api/v1/namespaces/{svc.namespace}/pods")["items"]}
    rid = _rid("r")
    run = run_pytest([SUITE, "--cp-kubeconfig", str(kubeconfig), "--cp-as-real-cluster", "--cp-profile", profile.name,
                      "--cp-run-id", rid, f"--cp-set=watch_service={name}", "--cp-set=watch_window_s=15"], tmp_path,
                     timeout=600)
    assert token not in run.output
    assert run.returncode == 0, run.output[-4000:]
    ro = {t.replace(T, "[existing-service]") for t in ALL}
    assert set(run.passed) == ro - {AGREE.replace(T, "[existing-service]")}, run.output[-3000:]
    assert "read-only mode" in run.output or "1 skipped" in run.output, run.output[-2000:]
    made = [n["metadata"]["name"] for n in list_raw(cluster.api, "/api/v1/namespaces",
                                                    {"labelSelector": f"{RUN_LABEL}={rid}"})["items"]]
    assert made in ([], [f"cp-run-{rid}"]), f"the read-only run created namespaces {made} (besides its Lease's)"
    pods_after = {p["metadata"]["name"]
                  for p in list_raw(cluster.api, f"/api/v1/namespaces/{svc.namespace}/pods")["items"]}
    assert pods_after == pods_before, "the read-only run changed the existing Service's pods"
    _assert_nothing_left(cluster, rid)


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("setting,expected", [
    pytest.param("watch_sizes=400,100", "watch_sizes [400, 100] must be one or more endpoint counts, strictly rising",
                 id="sizes-not-rising"),
    pytest.param("watch_pool=ghost", "watch_pool 'ghost' is not a pool of the plan", id="unknown-pool"),
    pytest.param("watch_service=just-a-name", "watch_service 'just-a-name' must be <namespace>/<service>",
                 id="service-without-namespace"),
    pytest.param("node_pod_cidr=10.0.0.0/28", "node_pod_cidr 10.0.0.0/28 must be an IPv4 range holding one /24 "
                 "per node", id="pod-range-too-small"),
    pytest.param("watch_max_endpoints_per_slice=0", "watch_max_endpoints_per_slice must be >= 1, got 0",
                 id="slice-limit-zero"),
    pytest.param("watch_churn_kinds=replace,explode", "watch_churn_kinds", id="unknown-churn-kind"),
])
def test_bad_watch_profile_values_end_the_run_with_one_line(setting, expected, tmp_path):
    assert_one_line(run_pytest([SUITE, "--cp-profile", "smoke", f"--cp-set={setting}"], tmp_path, timeout=120),
                    expected)


@pytest.mark.parametrize("setting,expected", [
    pytest.param("watch_kcm_max_endpoints_per_slice=1000", "watch_kcm_max_endpoints_per_slice configures the "
                 "embedded cluster's kube-controller-manager", id="kcm-flag-on-existing-cluster"),
    pytest.param("watch_service=nowhere/nothing", "watch_service nowhere/nothing: no such Service",
                 id="no-such-service"),
    pytest.param("watch_sizes=20000", "watch_sizes asks for 20000 endpoints, more than the 100 nodes of the cluster "
                 "hold at node_max_pods=110", id="more-endpoints-than-the-nodes-hold"),
])
def test_settings_the_cluster_cannot_honour_are_one_line(cluster, profile, setting, expected, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, setting, timeout=180)
    assert_one_line(run, expected)
    _assert_nothing_left(cluster, rid)


# --- nothing is left behind ------------------------------------------------------------------------

def test_interrupted_run_leaves_nothing(cluster, profile, tmp_path, api_guard):
    """Ctrl-C while the per-node Service is being grown and churned: its pods and namespace still go."""
    rid = _rid("i")
    args = [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name, "--cp-run-id", rid]
    with background_pytest(args, tmp_path) as proc:
        def pods_up():
            ended_early(proc)
            return len(list_raw(cluster.api, "/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={rid}"})["items"])
        wait_for(pods_up, until=lambda n: n >= 100, timeout=180, interval=0.5, what=f"run {rid} created its pods")
        interrupt(proc, api_guard)
    _assert_nothing_left(cluster, rid)
