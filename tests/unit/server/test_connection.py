"""A connection over a real loopback socket, with handlers written for the test: a request parked
in a wait (a long-poll Fetch) is cancelled when its client goes away, while a request doing
work is left to finish; a client pipelining many requests gets one per turn of the loop, so
another client's request is answered between two of them; a large request is read in place."""

from __future__ import annotations

import asyncio
import gc
import logging
import mmap
import socket
import struct
import time
import weakref
from typing import Any

import pytest

from broker.aio import wait_for
from broker.protocol import ApiKey
from broker.server import Dispatcher, RequestContext, parked
from broker.server.connection import Connection
from tests.support.wire import api_versions_frame, produce_frame


async def _busy_then_gone(handler: Any, events: list[str], expected: str, goes: str) -> None:
    """One request to `handler`; once it is being processed, the client goes away ("closes" or
    "resets"); then `events` must become [expected] and the connection must be dropped."""
    server, registry, port = await _serve(handler)
    async with server:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(api_versions_frame())
        await writer.drain()
        while not registry or not next(iter(registry)).busy:
            await asyncio.sleep(0.01)
        _vanish(writer, reset=goes == "resets")
        await wait_for(_until(lambda: events == [expected]), 5)
        await wait_for(_until(lambda: not registry), 5)


async def _serve(handler: Any) -> tuple[asyncio.Server, set[Connection], int]:
    dispatcher = Dispatcher({ApiKey.API_VERSIONS: handler})
    registry: set[Connection] = set()
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(dispatcher, "PLAINTEXT", 1 << 20, registry), "127.0.0.1", 0
    )
    return server, registry, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("goes", ["closes", "resets"])
def test_a_parked_request_is_cancelled_when_its_client_goes_away(goes: str) -> None:
    events: list[str] = []

    async def long_poll(context: RequestContext, request: Any) -> None:
        try:
            with parked():
                await asyncio.sleep(3600)  # a Fetch asking to wait an hour
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    asyncio.run(wait_for(_busy_then_gone(long_poll, events, "cancelled", goes), 30))


class _Held:
    """What a parked request holds (a long-poll Fetch: its thousands of partitions)."""


def test_a_parked_request_and_its_connection_are_freed_without_the_collector() -> None:
    """A node freezes what lives through a full collection (broker/heap.py), so a dead cycle
    among a parked request's objects stays until the frozen objects are put back, minutes
    later: a connection whose client vanished must be freed by reference counting alone,
    with everything its parked request held."""
    freed: list[weakref.ref[Any]] = []

    async def long_poll(context: RequestContext, request: Any) -> None:
        held = _Held()
        freed.append(weakref.ref(held))
        with parked():
            await asyncio.sleep(3600)

    async def client_goes(goes: str) -> None:
        server, registry, port = await _serve(long_poll)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(api_versions_frame())
            await writer.drain()
            await wait_for(_until(lambda: len(freed) == 1), 5)
            freed.append(weakref.ref(next(iter(registry))))
            _vanish(writer, reset=goes == "resets")
            del writer
            await wait_for(_until(lambda: not registry), 5)
            for _ in range(100):
                await asyncio.sleep(0.01)  # the turns in which the loop lets go of them
            kept = [type(ref()).__name__ for ref in freed if ref() is not None]
            assert not kept, f"after the client {goes}, only the collector frees {kept}"
        freed.clear()

    async def scenario() -> None:
        for goes in ("closes", "resets"):
            await client_goes(goes)

    gc.disable()
    try:
        asyncio.run(wait_for(scenario(), 30))
    finally:
        gc.enable()


class _BrokenDispatcher:
    """A fake, for a failure the real dispatcher never lets through (it answers every
    handler's, builder's and encoder's failure with the API's error response): serving the
    connection itself fails."""

    async def dispatch(self, frame: Any, listener: str, peer: str) -> None:
        raise RuntimeError("a bug in serving")


def test_a_connection_whose_serving_fails_is_closed_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        registry: set[Connection] = set()
        broken: Any = _BrokenDispatcher()
        server = await asyncio.get_running_loop().create_server(
            lambda: Connection(broken, "PLAINTEXT", 1 << 20, registry), "127.0.0.1", 0
        )
        async with server:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(api_versions_frame())
            await writer.drain()
            assert await wait_for(reader.read(), 5) == b"", "the connection was left open"
            await wait_for(_until(lambda: not registry), 5)
            writer.close()

    with caplog.at_level(logging.ERROR, logger="broker.server.connection"):
        asyncio.run(wait_for(scenario(), 30))
    assert "serving the connection from 127.0.0.1" in caplog.text
    assert "a bug in serving" in caplog.text


def test_work_in_progress_is_left_to_finish_when_its_client_goes_away() -> None:
    events: list[str] = []

    async def working(context: RequestContext, request: Any) -> None:
        await asyncio.sleep(0.3)  # not parked: e.g. an append being made durable
        events.append("finished")

    asyncio.run(wait_for(_busy_then_gone(working, events, "finished", "resets"), 30))


def test_a_pipelining_client_gets_one_request_per_turn_of_the_loop() -> None:
    order: list[str] = []

    async def record(context: RequestContext, request: Any) -> None:
        order.append(context.header.client_id or "?")
        if context.header.client_id == "busy":
            time.sleep(0.005)  # work that holds the loop, as a large produce does

    async def scenario() -> None:
        server, _, port = await _serve(record)
        async with server:
            _, busy = await asyncio.open_connection("127.0.0.1", port)
            _, other = await asyncio.open_connection("127.0.0.1", port)
            busy.write(b"".join(api_versions_frame(i, "busy") for i in range(50)))
            await busy.drain()
            # Once the first is processed the broker has read ahead of it (the 50 frames came
            # in one segment): an event, so the other request cannot arrive before the 16
            # and be answered early by accident, however slow the machine.
            await wait_for(_until(lambda: "busy" in order), 5)
            other.write(api_versions_frame(99, "unit"))
            await other.drain()
            await wait_for(_until(lambda: "unit" in order), 5)
            busy.close()
            other.close()

    asyncio.run(wait_for(scenario(), 30))
    # Sent once the pipeliner's first requests were being worked through, the other client's
    # request is answered within a turn or two, not after the 16 read ahead of it.
    assert order.index("unit") < 16, order


def test_a_large_request_is_read_in_place_and_its_memory_given_back_once_answered() -> None:
    """A 2 MiB Produce reaches its handler with its records as a read-only view of a buffer of
    the frame's own (no copy was made on the way), and that buffer is unmapped once the
    request has been handled."""
    seen: list[Any] = []

    async def produce(context: RequestContext, request: Any) -> None:
        records = request.topic_data[0].partition_data[0].records
        seen.append((type(records), records.readonly, records.obj, len(records)))

    async def scenario() -> None:
        dispatcher = Dispatcher({ApiKey.PRODUCE: produce})
        registry: set[Connection] = set()
        server = await asyncio.get_running_loop().create_server(
            lambda: Connection(dispatcher, "PLAINTEXT", 4 << 20, registry), "127.0.0.1", 0
        )
        async with server:
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(produce_frame("t", 2 << 20))
            await writer.drain()
            await wait_for(_until(lambda: bool(seen)), 10)
            await wait_for(_until(lambda: seen[0][2].closed), 10)
            writer.close()

    asyncio.run(wait_for(scenario(), 30))
    kind, readonly, buffer, size = seen[0]
    assert kind is memoryview
    assert readonly
    assert isinstance(buffer, mmap.mmap)
    assert size > 2_000_000


def _vanish(writer: asyncio.StreamWriter, *, reset: bool) -> None:
    """The client goes away: a close (FIN), or a reset (RST, as a killed process's socket)."""
    if reset:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)
