"""The profile model assembled from key groups: the domains', and a team's (pure, no cluster)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
import yaml
from pydantic import Field

from clusterproof.config import profile as prof
from clusterproof.core.errors import HarnessError
from clusterproof.core.keygroup import KeyGroup

pytestmark = pytest.mark.unit


class TeamKeys(KeyGroup):
    team_pods: Annotated[int, Field(ge=1)] = 3
    team_schedule_s: Annotated[float, Field(gt=0)] = 60.0

    @staticmethod
    def rules(p) -> None:
        if p.team_pods > p.nodes:
            raise ValueError(f"team_pods ({p.team_pods}) must not exceed nodes ({p.nodes})")


def test_every_domain_with_keys_contributes_its_group_and_the_cluster_group_comes_first():
    groups = prof.shipped_groups()
    domains = [g.__module__.split(".")[1] for g in groups]
    assert domains[0] == "cluster"
    assert sorted(domains) == sorted(d.parent.name for d in Path(prof.PACKAGE_DIR).glob("*/keys.py")
                                     if d.parent.name != "config")


def test_base_yaml_gives_every_shipped_key_its_default_and_names_no_other():
    keys = set(prof.profile_model().model_fields)
    base = set(yaml.safe_load(prof.BASE.read_text()))
    assert base == keys, f"only in base.yaml: {sorted(base - keys)}; without a default: {sorted(keys - base)}"


def test_a_team_group_adds_keys_with_their_defaults_set_and_validated_like_any_other(tmp_path):
    p = prof.load_profile("smoke", [], groups=[TeamKeys])
    assert (p.team_pods, p.team_schedule_s, p.nodes) == (3, 60.0, 100)
    p = prof.load_profile("smoke", ["team_pods=7", "team_schedule_s=5"], groups=[TeamKeys])
    assert (p.team_pods, p.team_schedule_s) == (7, 5.0)
    mine = tmp_path / "team.yaml"
    mine.write_text("team_pods: 4\n")
    assert prof.load_profile(str(mine), [], groups=[TeamKeys]).team_pods == 4
    with pytest.raises(HarnessError, match=r"^--cp-set team_pod=7: unknown key 'team_pod'; the keys are listed in "):
        prof.load_profile("smoke", ["team_pod=7"], groups=[TeamKeys])
    with pytest.raises(HarnessError, match=r"^--cp-set team_pods=0: team_pods must be >= 1, got 0$"):
        prof.load_profile("smoke", ["team_pods=0"], groups=[TeamKeys])
    with pytest.raises(HarnessError, match=r"team_pods \(101\) must not exceed nodes \(100\)"):
        prof.load_profile("smoke", ["team_pods=101"], groups=[TeamKeys])
    with pytest.raises(HarnessError, match=r"team_schedule_s must be float \(like 60.0\), got 'soon'"):
        prof.load_profile("smoke", ["team_schedule_s=soon"], groups=[TeamKeys])


def test_without_the_team_group_its_keys_are_unknown(tmp_path):
    mine = tmp_path / "team.yaml"
    mine.write_text("team_pods: 4\n")
    with pytest.raises(HarnessError, match=rf"^{mine}: unknown key 'team_pods'; the keys are listed in "):
        prof.load_profile(str(mine), [])


def test_a_group_cannot_shadow_a_shipped_key_and_hooks_must_return_groups():
    class Shadow(KeyGroup):
        nodes: int = 5

    with pytest.raises(HarnessError, match=r"profile key 'nodes' is declared by both clusterproof.cluster.keys"):
        prof.profile_model([Shadow])
    with pytest.raises(HarnessError, match=r"is not a subclass of clusterproof.core.keygroup.KeyGroup"):
        prof.flatten_groups([dict])
    assert prof.flatten_groups([None, TeamKeys, [TeamKeys]]) == (TeamKeys, TeamKeys)
    assert prof.profile_model([TeamKeys, TeamKeys]) is prof.profile_model([TeamKeys])


def test_each_components_go_runtime_is_set_in_its_environment_and_a_bad_setting_is_one_line():
    """component_go_env as written in YAML (GOGC: 400 and GOGC: off are a number and a boolean there) becomes
    kwokctl componentsPatches extraEnvs and one line of the report's environment; a component, variable or
    value Go would not take is refused naming it."""
    from clusterproof.cluster.kwok import describe_go_env, go_env_patches
    p = prof.load_profile("smoke", ["component_go_env={kube-apiserver: {GOGC: 400, GOMEMLIMIT: 6GiB}, "
                                    "etcd: {GOGC: off}}"])
    assert p.component_go_env == {"kube-apiserver": {"GOGC": "400", "GOMEMLIMIT": "6GiB"}, "etcd": {"GOGC": "off"}}
    assert go_env_patches(p.component_go_env) == [
        {"name": "etcd", "extraEnvs": [{"name": "GOGC", "value": "off"}]},
        {"name": "kube-apiserver", "extraEnvs": [{"name": "GOGC", "value": "400"},
                                                 {"name": "GOMEMLIMIT", "value": "6GiB"}]}]
    assert describe_go_env(p.component_go_env) == "etcd GOGC=off; kube-apiserver GOGC=400 GOMEMLIMIT=6GiB"
    assert describe_go_env({}) == "Go's defaults (GOGC=100, no GOMEMLIMIT)" and go_env_patches({}) == []
    for bad, said in [("{kube-apisrv: {GOGC: 400}}", "got 'kube-apisrv'"),
                      ("{etcd: {GOGC: 10MiB}}", "GOGC '10MiB' is a percentage"),
                      ("{etcd: {GOMAXPROCS: 1}}", "got 'GOMAXPROCS'"),
                      ("{etcd: {GOMEMLIMIT: off}}", "GOMEMLIMIT 'off' is a size")]:
        with pytest.raises(HarnessError, match=said):
            prof.load_profile("smoke", [f"component_go_env={bad}"])
