"""File regions reach the peer intact over real loopback sockets: when the socket takes them at
once, when it fills up and the rest must wait for the reader, after the file is deleted, and
with the transport's own buffer still holding bytes that must go first. A region that cannot be
sent whole (its file is short, its client went away) is an `OSError`, on which the connection
aborts."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.aio import wait_for
from broker.server.sendfile import RegionTruncated, send_region
from broker.storage import FileSlice, PinnedSlice


def in_loop(test: Callable[[Path], Coroutine[Any, Any, None]]) -> Callable[[Path], None]:
    @functools.wraps(test)
    def run(tmp_path: Path) -> None:
        asyncio.run(wait_for(test(tmp_path), 60))

    return run


class _Keep(asyncio.Protocol):
    def __init__(self, into: asyncio.Future[asyncio.Transport]) -> None:
        self._into = into

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._into.set_result(transport)


@asynccontextmanager
async def connected(
    send_buffer: int | None = None,
) -> AsyncIterator[tuple[asyncio.Transport, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A server-side transport (what the broker writes to), and the client's reader and writer."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()
    server = await loop.create_server(lambda: _Keep(accepted), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    transport = await accepted
    if send_buffer is not None:
        # Both ends small, so that what the test sends cannot all sit in kernel buffers
        # (receive buffers autotune up to net.ipv4.tcp_rmem's maximum otherwise).
        transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer
        )
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer)
    try:
        yield transport, reader, writer
    finally:
        transport.close()
        writer.close()
        server.close()
        await server.wait_closed()


def pinned(tmp_path: Path, size: int, start: int, length: int) -> tuple[PinnedSlice, bytes]:
    """A segment-like file of `size` random bytes and a pinned slice of it; the file's own
    descriptor is closed, as a segment's may be while the slice waits to be sent."""
    content = os.urandom(size)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    region = FileSlice(fd, start, length).pin()
    os.close(fd)
    return region, content


@in_loop
async def test_a_region_is_sent_whole(tmp_path: Path) -> None:
    region, content = pinned(tmp_path, 64 * 1024, 1000, 30_000)
    async with connected() as (transport, reader, _):
        await send_region(transport, region)
        assert await reader.readexactly(30_000) == content[1000:31_000]
    region.close()


@in_loop
async def test_a_region_larger_than_the_socket_buffer_waits_for_the_reader(
    tmp_path: Path,
) -> None:
    size = 8 * 1024 * 1024
    region, content = pinned(tmp_path, size, 0, size)
    async with connected(send_buffer=128 * 1024) as (transport, reader, _):
        sending = asyncio.ensure_future(send_region(transport, region))
        # Checked once 1 MiB has arrived, not after a wait: the region is under way, and with
        # 7 MiB unread (beyond the kernel's and the reader's buffers) it can only be done if
        # something holds the rest in memory.
        first = await reader.readexactly(1024 * 1024)
        assert not sending.done(), "8 MiB cannot fit in the socket buffers unread"
        received = first + await reader.readexactly(size - len(first))
        await sending
    region.close()
    assert received == content


@in_loop
async def test_buffered_bytes_go_before_the_region(tmp_path: Path) -> None:
    size = 4 * 1024 * 1024
    region, content = pinned(tmp_path, size, 0, size)
    header = os.urandom(4 * 1024 * 1024)
    async with connected(send_buffer=128 * 1024) as (transport, reader, _):
        transport.write(header)
        assert transport.get_write_buffer_size() > 0
        sending = asyncio.ensure_future(send_region(transport, region))
        received = await reader.readexactly(len(header) + len(content))
        await sending
    region.close()
    assert received == header + content


@in_loop
async def test_a_pinned_region_outlives_its_file(tmp_path: Path) -> None:
    """Retention or compaction may delete a segment while its bytes wait for the socket."""
    region, content = pinned(tmp_path, 100_000, 10, 50_000)
    (tmp_path / "00000000000000000000.log").unlink()
    async with connected() as (transport, reader, _):
        await send_region(transport, region)
        assert await reader.readexactly(50_000) == content[10:50_010]
    region.close()


@in_loop
async def test_a_file_shorter_than_its_region_is_an_error(tmp_path: Path) -> None:
    region, _ = pinned(tmp_path, 1000, 0, 5000)
    async with connected() as (transport, _, _):
        with pytest.raises(RegionTruncated, match="4000 bytes before"):
            await send_region(transport, region)
    region.close()


@in_loop
async def test_a_file_shorter_than_its_region_is_an_error_when_the_region_waits(
    tmp_path: Path,
) -> None:
    """Behind buffered bytes the region goes through `loop.sendfile`, which would stop quietly
    at the end of the file and leave the client a frame shorter than its size prefix."""
    region, _ = pinned(tmp_path, 1000, 0, 5000)
    header = os.urandom(4 * 1024 * 1024)
    async with connected(send_buffer=128 * 1024) as (transport, reader, _):
        transport.write(header)
        sending = asyncio.ensure_future(send_region(transport, region))
        await reader.readexactly(len(header))
        with pytest.raises(RegionTruncated, match="4000 bytes before"):
            await sending
    region.close()


@in_loop
async def test_a_client_that_goes_away_while_a_region_waits_is_an_os_error(
    tmp_path: Path,
) -> None:
    """The connection aborts on `OSError`; the peer resetting before any byte of the waiting
    region moved must be one too (asyncio reports it as a `RuntimeError`)."""
    region, _ = pinned(tmp_path, 1024 * 1024, 0, 1024 * 1024)
    async with connected(send_buffer=64 * 1024) as (transport, _, client):
        out = transport.get_extra_info("socket").fileno()
        for _ in range(3):  # fill both ends' kernel buffers until nothing moves
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(out, bytes(64 * 1024))
            await asyncio.sleep(0.1)
        sending = asyncio.ensure_future(send_region(transport, region))
        await asyncio.sleep(0.1)
        # A precondition, not the check: the client reads nothing and both ends' buffers are
        # full, so the region cannot finish however long this waits; if it could (held in
        # memory), the ConnectionError expected below would not come.
        assert not sending.done()
        client.transport.abort()
        with pytest.raises(ConnectionError):
            await sending
    region.close()
