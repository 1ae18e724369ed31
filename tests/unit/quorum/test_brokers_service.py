"""The active controller's handling of brokers with a real single-voter quorum on disk: a
broker registers at the offset of its record, is unfenced by a heartbeat once caught up, and
is fenced by the controller's own timer when its heartbeats stop."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from broker.aio import wait_for
from broker.config import BrokerConfig
from broker.kraft import MetadataService
from broker.metadata.brokers import Heartbeat, Registration
from broker.metadata.records import BrokerEndpoint, decode_record
from broker.protocol import ErrorCode

SESSION_MS = 400


def _service(tmp_path: Path, extra: dict[str, str] | None = None) -> MetadataService:
    """A single-voter node's metadata service on `tmp_path`, with `extra` settings."""
    config = BrokerConfig.from_properties(
        {
            "node.id": "1",
            "log.dirs": str(tmp_path),
            "broker.session.timeout.ms": str(SESSION_MS),
        }
        | (extra or {})
    )
    return MetadataService(
        config,
        lambda: time.time_ns() // 1_000_000,
        cluster_id="c1",
        steady_clock=lambda: time.monotonic_ns() // 1_000_000,
    )


def _registration(broker_id: int) -> Registration:
    return Registration(broker_id, uuid.uuid4(), "c1", (BrokerEndpoint("PLAINTEXT", "h", 9092, 0),))


def _fenced(service: MetadataService, broker_id: int) -> bool:
    return service.image.brokers[broker_id].fenced


def test_a_broker_registers_is_unfenced_and_is_fenced_when_it_goes_silent(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        service = _service(tmp_path)
        await service.start()
        try:
            registered = await service.register(_registration(2))
            assert registered.error == ErrorCode.none
            # Its epoch is the offset of its registration record in the committed log.
            core = service.driver._core
            assert core is not None
            record = decode_record(core.log[registered.broker_epoch].payload)
            assert getattr(record, "broker_id", None) == 2
            assert _fenced(service, 2)
            offset = service.driver.applied - 1
            answer = await service.heartbeat(Heartbeat(2, registered.broker_epoch, offset))
            assert (answer.error, answer.is_fenced) == (ErrorCode.none, False)
            assert not _fenced(service, 2)
            # Silent for longer than its session: the controller fences it by itself.
            deadline = time.monotonic() + 5
            while not _fenced(service, 2):
                assert time.monotonic() < deadline, "never fenced"
                await asyncio.sleep(0.05)
            # A registration from another cluster is refused by name.
            other = Registration(3, uuid.uuid4(), "c2", ())
            refused = await service.register(other)
            assert refused.error == ErrorCode.inconsistent_cluster_id
        finally:
            await service.close()

    asyncio.run(main())


def test_a_heartbeat_that_changes_nothing_never_waits_behind_another_request(
    tmp_path: Path,
) -> None:
    """While another request's records wait to commit (the controller's lock held, as by a
    CreateTopics of ten thousand partitions), a heartbeat that writes nothing is answered at
    once: a broker whose heartbeats go unanswered for its session is fenced."""

    async def main() -> None:
        service = _service(tmp_path)
        await service.start()
        try:
            registered = await service.register(_registration(2))
            offset = service.driver.applied - 1
            await service.heartbeat(Heartbeat(2, registered.broker_epoch, offset))
            assert not _fenced(service, 2)
            async with service._lock:  # another request is committing
                answer = await wait_for(
                    service.heartbeat(Heartbeat(2, registered.broker_epoch, offset)), 1
                )
            assert (answer.error, answer.is_fenced) == (ErrorCode.none, False)
        finally:
            await service.close()

    asyncio.run(main())
