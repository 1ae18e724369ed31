"""A committed metadata record that cannot be applied to the image, as Kafka's "metadata
loading" fault handler treats it: fatal on a controller (the active one resigns, and the
process stops, naming the record), counted and reported on a broker-only node, which serves
what it can."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.kraft import MetadataService
from broker.metadata.records import PartitionChangeRecord, encode_record
from broker.metrics import BrokerMetrics
from broker.quorum import NotController, StateMachineFault
from broker.raft import Role

# A change to a partition of a topic the image does not hold: what an image that diverged from
# the log meets.
DIVERGED = encode_record(PartitionChangeRecord(partition_id=0, topic_id=uuid.uuid4(), leader=1))


def _service(properties: dict[str, str], fatal: list[str]) -> MetadataService:
    return MetadataService(
        BrokerConfig.from_properties(properties),
        lambda: time.time_ns() // 1_000_000,
        cluster_id="c1",
        steady_clock=lambda: time.monotonic_ns() // 1_000_000,
        fatal=fatal.append,
    )


def test_the_active_controller_resigns_and_stops_on_a_record_it_cannot_apply(
    tmp_path: Path,
) -> None:
    fatal: list[str] = []
    service = _service({"node.id": "1", "log.dirs": str(tmp_path)}, fatal)

    async def main() -> None:
        await service.start()
        try:
            assert service.driver.is_active
            offset = service.driver.end_offset
            with pytest.raises(NotController):
                await service.driver.propose([DIVERGED])
            deadline = time.monotonic() + 5
            while not fatal:
                assert time.monotonic() < deadline, "the fault was not fatal"
                await asyncio.sleep(0.01)
            [message] = fatal
            assert f"PartitionChangeRecord at offset {offset}" in message
            assert message.startswith("controller 1: ")
            assert isinstance(service.driver.failed, StateMachineFault)
            assert not service.is_active_controller
            core = service.driver._core
            assert core is not None
            assert core.role is Role.RESIGNED
            assert service.driver.applied == offset  # nothing applied past the fault
            assert service.load_error_count == 1
            with pytest.raises(NotController):
                await service.propose(lambda _: ((), None))
        finally:
            await service.close()

    asyncio.run(main())


def test_an_inactive_controller_refuses_to_go_on_either(tmp_path: Path) -> None:
    """A voter that is not the active controller could be elected and decide from the image
    that diverged: the fault is fatal there too (Kafka's standby controllers halt)."""
    service = _service(
        {
            "node.id": "2",
            "log.dirs": str(tmp_path),
            "process.roles": "controller",
            "controller.quorum.voters": "1@localhost:9990,2@localhost:9991,3@localhost:9992",
            "controller.listener.names": "CONTROLLER",
            "listeners": "CONTROLLER://localhost:9991",
        },
        [],
    )
    with pytest.raises(StateMachineFault, match="PartitionChangeRecord at offset 7"):
        service.apply(7, DIVERGED)
    assert service.load_error_count == 1


def test_a_broker_counts_a_record_it_cannot_apply_and_goes_on(tmp_path: Path) -> None:
    fatal: list[str] = []
    service = _service(
        {
            "node.id": "4",
            "log.dirs": str(tmp_path),
            "process.roles": "broker",
            "controller.quorum.voters": "1@localhost:9990",
            "controller.listener.names": "CONTROLLER",
            "listeners": "PLAINTEXT://localhost:0",
        },
        fatal,
    )
    service.apply(7, DIVERGED)
    service.apply(8, b"\x01\x63\x00")  # a record type this node does not know
    assert fatal == []
    assert service.load_error_count == 2
    assert "PartitionChangeRecord at offset 7" in service.load_failures[0]
    assert "record of type 99 at offset 8" in service.load_failures[1]
    replicas: Any = None  # the metadata families read nothing of the replicas
    metrics = BrokerMetrics(replicas, active_controller=lambda: False, metadata=service)
    values = {family.name: family.samples[0].value for family in metrics._metadata_metrics()}
    assert values == {
        "kafka_server_broker_metadata_metrics_metadata_load_error_count": 2,
        "kafka_server_broker_metadata_metrics_metadata_apply_error_count": 0,
    }
