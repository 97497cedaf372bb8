"""Self-tests of the figures' one route (clusterproof.core.measurement): pure, no cluster.

A figure is made once (by a check's recorder or a measurement's gather) and
read by the Allure page, summary.json, bench JSON and the baseline comparison;
these show that the typed figure survives each of those readers.
"""
from __future__ import annotations

import json
import math

import pytest

from clusterproof.core import measurement as m
from clusterproof.core.measurement import Figure, FigureRecorder, Figures
from clusterproof.report import compare


@pytest.mark.unit
def test_a_figure_states_its_direction_and_verdict_from_its_threshold():
    f = Figure.of("suites/test_x.py::test_y", "pod startup p99", 4.2, "s", 5.0)
    assert (f.op, f.direction, f.verdict) == ("<=", "lower", "within")
    assert f.key == "suites/test_x.py::test_y :: pod startup p99"
    assert f.shown() == "4.2 s (threshold <= 5 s)"
    assert Figure.of("c", "429s", 0, "", 1, ">=").verdict == "beyond"
    assert Figure.of("c", "rate", 30, "pods/s").direction == "higher"
    assert Figure.of("c", "nodes", 5, "nodes", 5, "==").direction == "none"
    unmeasured = Figure.of("c", "p99", math.inf, "s", 5.0)
    assert unmeasured.value is None and unmeasured.verdict is None and unmeasured.shown().startswith("n/a")
    assert Figure.of("c", "n", "not a number", "").value is None
    assert Figure.of("c", "spread", 1.0, "s", op=">=").op is None     # no threshold: no op


@pytest.mark.unit
def test_a_bad_direction_or_op_is_refused():
    with pytest.raises(ValueError, match="direction 'up'"):
        Figure("c", "n", 1.0, "s", direction="up")
    with pytest.raises(ValueError, match="op '=>'"):
        Figure("c", "n", 1.0, "s", 2.0, "=>")


@pytest.mark.unit
def test_the_store_keeps_one_figure_per_key_and_groups_them_by_check():
    store = Figures()
    shown = []
    a = FigureRecorder("suites/test_a.py::test_1", store, shown=shown.append)
    b = FigureRecorder("suites/test_a.py::test_2", store)
    a.add("latency", 1.0, "s", 2.0)
    a.add("latency", 1.5, "s", 2.0)     # again: replaces
    a.add("count", 3, "pods")
    b.add("latency", 9.0, "s", 2.0)
    assert len(store) == 3 and [f.value for f in shown] == [1.0, 1.5, 3.0]
    assert [f.name for f in store.for_check("suites/test_a.py::test_1")] == ["latency", "count"]
    assert [f.value for f in b.all()] == [9.0] and b.all()[0].verdict == "beyond"


@pytest.mark.unit
def test_a_measurement_is_started_gathered_and_disposed_and_its_figures_filed_under_the_check():
    class Count(m.Base):
        def __init__(self):
            self.events = []

        def start(self):
            self.events.append("start")

        def gather(self):
            return [m.figure("pods seen", 3, "pods"), m.figure("seconds", 1.25, "s")]

        def dispose(self):
            self.events.append("dispose")

    c = Count()
    store = Figures()
    with pytest.raises(RuntimeError), m.measuring(c):
        raise RuntimeError("the load failed")
    assert c.events == ["start", "dispose"]
    FigureRecorder("suites/test_b.py::test_c", store).extend(c.gather())
    assert [f.key for f in store.all()] == ["suites/test_b.py::test_c :: pods seen",
                                            "suites/test_b.py::test_c :: seconds"]


@pytest.mark.unit
def test_a_typed_result_is_read_by_attribute_and_gathers_its_measured_fields_by_name():
    from dataclasses import dataclass, field

    @dataclass
    class Phase(m.Typed):
        phase: str
        create_qps: float = m.measured("pods/s")
        startup_p99_s: float | None = m.measured("s")
        missing: list[str] = field(default_factory=list)      # data beside the figures, never gathered

    p = Phase("steady", 30.0, None, ["pod-1"])
    assert p.create_qps == 30.0
    assert [(f.name, f.value, f.unit, f.direction) for f in p.gather()] == [
        ("create_qps", 30.0, "pods/s", "higher"), ("startup_p99_s", None, "s", "lower")]
    assert p.to_dict() == {"phase": "steady", "create_qps": 30.0, "startup_p99_s": None, "missing": ["pod-1"]}
    with pytest.raises(AttributeError):
        p.create_qpps     # noqa: B018 -- a misspelt figure fails at once, never reads None


@pytest.mark.unit
def test_figures_read_back_from_summary_json_are_the_same_and_compare_by_their_direction():
    store = Figures([Figure.of("suites/t.py::a", "p99", 2.0, "s", 5.0, headline=True),
                     Figure.of("suites/t.py::a", "nodes", 10, "nodes", 10, "==")])
    data = json.loads(json.dumps(store.to_json()))
    assert data["suites/t.py::a :: p99"] == {"check": "suites/t.py::a", "name": "p99", "value": 2.0, "unit": "s",
                                             "better": "lower", "threshold": 5.0, "op": "<=", "headline": True,
                                             "verdict": "within"}
    assert Figures.from_json(data).all() == store.all()
    # An old summary (no check, name or op): the key names them.
    old = Figure.from_json({"value": 3.0, "unit": "s", "better": "lower"}, "suites/t.py::a :: p99")
    assert (old.check, old.name, old.direction) == ("suites/t.py::a", "p99", "lower")
    slower = Figures([Figure.of("suites/t.py::a", "p99", 4.0, "s", 5.0)])
    c = compare.compare({"figures": data}, {"figures": slower.to_json()}, compare.Tolerance(pct=20))
    assert [(r.key, r.verdict) for r in c.rows] == [("suites/t.py::a :: p99", "regressed"),
                                                    ("suites/t.py::a :: nodes", "gone")]


@pytest.mark.unit
def test_a_bench_writes_its_context_its_typed_figures_and_its_data(tmp_path):
    from clusterproof.bench import common
    figs = [common.figure("burst", "create_qps", 12, "pods/s"), common.figure("burst", "pod_startup_p99_s", 1.5, "s")]
    common.write(tmp_path / "b.json", {"profile": "smoke"}, figs, {"runs": [{"create_qps": 12}]})
    written = json.loads((tmp_path / "b.json").read_text())
    assert written["profile"] == "smoke" and written["data"] == {"runs": [{"create_qps": 12}]}
    assert [Figure.from_json(f) for f in written["figures"]] == figs
    assert written["figures"][1]["better"] == "lower" and written["figures"][0]["check"] == "bench burst"


def _node_calls(get_counts: tuple[int, int], patch_counts: tuple[int, int]) -> str:
    """An apiserver scrape with GET and PATCH of nodes: (calls under 0.05 s, calls under 0.1 s)."""
    lines = ["# TYPE apiserver_request_duration_seconds histogram"]
    for verb, (fast, slow) in (("GET", get_counts), ("PATCH", patch_counts)):
        labels = f'verb="{verb}",group="",resource="nodes",subresource="",scope="resource",component="apiserver"'
        for le, c in (("0.05", fast), ("0.1", fast + slow), ("+Inf", fast + slow)):
            lines.append(f'apiserver_request_duration_seconds_bucket{{{labels},le="{le}"}} {c}')
        lines.append(f"apiserver_request_duration_seconds_count{{{labels}}} {fast + slow}")
        lines.append(f"apiserver_request_duration_seconds_sum{{{labels}}} 0")
    return "\n".join(lines) + "\n"


@pytest.mark.unit
def test_the_bringup_bench_bounds_the_taint_lift_rate_by_the_node_lifecycle_workers():
    from clusterproof.bench.bringup import taint_lift_bound
    before = _node_calls((0, 0), (0, 0))
    # Every GET and PATCH in (0.05, 0.1]: medians 0.075 s each, so 8 workers reach 8 / 0.15 = 53.3 nodes/s.
    after = _node_calls((0, 100), (0, 100))
    b = taint_lift_bound(before, after)
    assert (b["get_node_median_s"], b["patch_node_median_s"], b["patch_node_calls"]) == (0.075, 0.075, 100), b
    assert b["rate_bound_nodes_per_second"] == 53.3, b
    # Negative control: no node calls in the window, no bound claimed.
    assert taint_lift_bound(before, before)["rate_bound_nodes_per_second"] is None


def _kcm(depth: float, work_s: float, items: float, get: tuple[float, float], patch: tuple[float, float]) -> str:
    """A kube-controller-manager scrape: its node lifecycle queue, and its client's GET and PATCH
    (sum, count) split over two hosts, as several API servers would give."""
    q = 'name="node_lifecycle_controller"'
    lines = ["# TYPE workqueue_depth gauge", f"workqueue_depth{{{q}}} {depth}",
             'workqueue_depth{name="ttl_controller"} 999',
             f"workqueue_work_duration_seconds_sum{{{q}}} {work_s}",
             f"workqueue_work_duration_seconds_count{{{q}}} {items}"]
    for verb, (s, n) in (("GET", get), ("PATCH", patch)):
        for host in ("a:6443", "b:6443"):
            lines += [f'rest_client_request_duration_seconds_sum{{host="{host}",verb="{verb}"}} {s / 2}',
                      f'rest_client_request_duration_seconds_count{{host="{host}",verb="{verb}"}} {n / 2}']
    return "\n".join(lines) + "\n"


@pytest.mark.unit
def test_the_bringup_bench_reads_the_node_lifecycle_controllers_own_queue():
    from clusterproof.bench.bringup import kcm_sample, node_lifecycle_queue
    samples = [(0.0, kcm_sample(_kcm(0, 0, 0, (0, 0), (0, 0)))),
               (5.0, kcm_sample(_kcm(7000, 1, 10, (1, 10), (2, 10)))),
               # 10 s with the queue full: 8 workers busy (80 s of work), 500 items of 0.16 s each;
               # the client's 500 GETs took 0.06 s each and its 500 PATCHes 0.1 s
               (15.0, kcm_sample(_kcm(6500, 81, 510, (31, 510), (52, 510)))),
               (20.0, kcm_sample(_kcm(0, 90, 7000, (40, 7000), (60, 7000))))]   # the drain: not counted
    q = node_lifecycle_queue(samples)
    assert (q["peak_queue_depth"], q["saturated_seconds"], q["busy_workers_mean"]) == (7000, 10.0, 8.0), q
    assert (q["items_per_second"], q["item_mean_s"]) == (50.0, 0.16), q
    assert (q["kcm_client_get_mean_s"], q["kcm_client_patch_mean_s"]) == (0.06, 0.1), q
    # Negative control: a queue never fuller than its workers claims no saturation and no figures.
    idle = node_lifecycle_queue([(0.0, kcm_sample(_kcm(3, 0, 0, (0, 0), (0, 0)))),
                                 (5.0, kcm_sample(_kcm(2, 1, 10, (1, 10), (2, 10))))])
    assert idle["saturated_seconds"] == 0.0 and "busy_workers_mean" not in idle, idle


@pytest.mark.unit
def test_simulated_nodes_register_with_the_labels_a_kubelet_gives_its_node():
    from clusterproof.cluster.node_plan import kubelet_labels
    from clusterproof.cluster.nodes import node_bodies
    from clusterproof.config.profile import load_profile
    body = next(node_bodies(load_profile("smoke", []), "run"))
    labels = body["metadata"]["labels"]
    assert kubelet_labels(body["metadata"]["name"]).items() <= labels.items(), labels
    # Without the beta pair kube-controller-manager adds it to every node during bring-up (a GET and a PATCH
    # in the workers that lift the not-ready taint): a real kubelet registers with both.
    assert labels["beta.kubernetes.io/os"] == labels["kubernetes.io/os"], labels
    assert labels["beta.kubernetes.io/arch"] == labels["kubernetes.io/arch"], labels


@pytest.mark.cluster
def test_the_bringup_bench_says_whether_a_window_was_cpu_bound_and_who_worked():
    from clusterproof.bench.bringup import HARNESS, MACHINE_BUSY, cpu_in_window
    s = lambda api, kwok, own, busy: {"kube-apiserver": api, "kwok-controller": kwok, HARNESS: own,  # noqa: E731
                                      MACHINE_BUSY: busy}
    samples = [(9.5, s(10, 5, 1, 100)), (10.0, s(11, 5, 1, 101)),
               (40.0, s(50, 20, 6, 160)),       # 30 s on 2 CPUs: 59 CPU-s busy, 0.98 of the machine
               (40.5, s(51, 20, 6, 161))]
    w = cpu_in_window(samples, 10.0, 40.0, 2)
    assert w["seconds"] == 30.0 and w["cpu_bound_seconds"] == 29.5 and w["machine_busy_share"] == 0.98, w
    assert w["cpu_seconds_by_process"] == {"kube-apiserver": 39.0, "kwok-controller": 15.0, HARNESS: 5.0}, w
    # The window is bracketed by the samples around it, never narrowed to the ones inside.
    assert cpu_in_window(samples, 9.8, 39.0, 2)["seconds"] == 30.5
    # Negative controls: a machine half idle is not CPU-bound; a window the sampler never covered claims nothing.
    idle = cpu_in_window([(0.0, s(0, 0, 0, 0)), (30.0, s(20, 5, 2, 30))], 0.0, 30.0, 2)
    assert idle["machine_busy_share"] == 0.5 and idle["cpu_bound_seconds"] == 15.0, idle
    assert cpu_in_window(samples, 0.0, 40.0, 2) == {} and cpu_in_window(samples, 10.0, 99.0, 2) == {}
