"""The team's own profile keys, declared to the clusterproof harness (installed: `pip install clusterproof`).

The hook below adds a key group to the run's profile: `--cp-set team_pods=8` and a profile YAML of
the team's that names `team_pods` are accepted, and a misspelt key is still refused.
"""
from typing import Annotated

from pydantic import Field

from clusterproof.core.keygroup import KeyGroup


class TeamKeys(KeyGroup):
    team_pods: Annotated[int, Field(ge=1, le=500)] = 3            # pods the team's check creates
    team_schedule_s: Annotated[float, Field(gt=0)] = 60.0         # all of them bound to a node within this


def pytest_clusterproof_profile_keys(config):
    return TeamKeys
