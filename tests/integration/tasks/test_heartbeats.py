"""Flows the demo and the tests run in their own process go without Prefect's flow-run heartbeat."""

from draftsync.tasks.context import flows_without_heartbeats
from prefect import flow
from prefect.settings import get_current_settings


@flow
def _heartbeat_setting() -> int | None:
    return get_current_settings().flows.heartbeat_frequency


def test_a_flow_inside_runs_without_a_heartbeat_and_the_setting_comes_back(prefect_harness):
    with flows_without_heartbeats():
        assert _heartbeat_setting() is None  # so the flow engine starts no heartbeat thread
        with flows_without_heartbeats():  # nested: as the demo's own flows inside the test harness
            assert _heartbeat_setting() is None
    default = type(get_current_settings().flows)().heartbeat_frequency
    assert default is not None, "Prefect's default is a heartbeat: the helper is what turns it off"
