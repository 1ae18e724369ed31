"""Configs applied to running brokers: what is set or deleted on which broker, and which
broker still runs with what the spec dropped (`live_configs`), and how the plan carries it."""

from __future__ import annotations

import dataclasses

from gregor_operator.live_configs import LIVE_PER_BROKER_CONFIGS, live_changes, live_part
from gregor_operator.observed import LiveConfig
from tests.unit.operator.test_planner import (
    CURRENT,
    HEALTHY,
    condition,
    example,
    planned,
    restarted,
    running,
)

HOUR = "3600000"
WEEK = "604800000"


def test_only_what_a_running_broker_takes_is_live() -> None:
    assert {"log.retention.ms", "log.segment.bytes", "max.connections"} <= LIVE_PER_BROKER_CONFIGS
    # The controller weighs these by every broker's value: one broker's would mislead it.
    assert "min.insync.replicas" not in LIVE_PER_BROKER_CONFIGS
    assert "unclean.leader.election.enable" not in LIVE_PER_BROKER_CONFIGS
    assert "num.network.threads" not in LIVE_PER_BROKER_CONFIGS  # dynamic in Kafka, not here
    assert live_part({"log.retention.ms": HOUR, "num.partitions": "3"}) == {
        "log.retention.ms": HOUR
    }


def test_a_changed_value_is_set_on_each_broker_that_runs_with_another() -> None:
    configs = {
        0: {"log.retention.ms": LiveConfig(WEEK, static=WEEK)},
        1: {"log.retention.ms": LiveConfig(HOUR, dynamic=HOUR, static=WEEK)},  # set already
        2: {"log.retention.ms": LiveConfig(HOUR, static=HOUR)},  # restarted with it
    }
    found = live_changes({"log.retention.ms": HOUR}, configs)
    assert found.updates == {0: {"log.retention.ms": HOUR}}
    assert found.stale == {}


def test_a_per_broker_value_the_file_now_holds_is_deleted() -> None:
    configs = {0: {"log.retention.ms": LiveConfig(HOUR, dynamic=HOUR, static=HOUR)}}
    assert live_changes({"log.retention.ms": HOUR}, configs).updates == {
        0: {"log.retention.ms": None}
    }


def test_a_value_the_spec_dropped_is_deleted_and_a_broker_started_with_it_restarts() -> None:
    configs = {
        0: {"log.retention.ms": LiveConfig(HOUR, dynamic=HOUR, static=WEEK)},
        1: {"log.retention.ms": LiveConfig(HOUR, static=HOUR)},
        2: {"log.retention.ms": LiveConfig(None)},
    }
    found = live_changes({}, configs)
    assert found.updates == {0: {"log.retention.ms": None}}
    assert found.stale == {0: ("log.retention.ms",), 1: ("log.retention.ms",)}


def test_the_plan_sets_a_live_change_on_the_brokers_and_restarts_none() -> None:
    resource = example()
    resource["spec"]["config"]["log.retention.ms"] = int(HOUR)
    said = {n: {"log.retention.ms": LiveConfig(WEEK)} for n in (0, 1, 2)}
    found = planned(resource, running(CURRENT), dataclasses.replace(HEALTHY, configs=said))
    assert found.config_updates == {n: {"log.retention.ms": HOUR} for n in (0, 1, 2)}
    assert found.restarts == ()
    ready = condition(found, "Ready")
    assert (ready.status, ready.reason) == ("False", "ConfigUpdating")
    assert ready.message == (
        "setting without a restart: log.retention.ms=3600000 on broker(s) 0, 1, 2"
    )
    assert ("Normal", "ConfigUpdated") in {(kind, reason) for kind, reason, _ in found.events}
    applied = {n: {"log.retention.ms": LiveConfig(HOUR, dynamic=HOUR)} for n in (0, 1, 2)}
    done = planned(resource, running(CURRENT), dataclasses.replace(HEALTHY, configs=applied))
    assert done.config_updates == {}
    assert condition(done, "Ready").status == "True"


def test_a_broker_that_runs_with_a_dropped_config_is_rolled() -> None:
    said = {
        0: {"log.retention.ms": LiveConfig(WEEK)},
        1: {"log.retention.ms": LiveConfig(HOUR, static=HOUR)},
        2: {"log.retention.ms": LiveConfig(WEEK)},
    }
    found = planned(example(), running(CURRENT), dataclasses.replace(HEALTHY, configs=said))
    assert restarted(found) == "gregor-broker-1"
    assert found.restart is not None
    assert found.restart.reason == "it runs with log.retention.ms from its file, no longer set"
