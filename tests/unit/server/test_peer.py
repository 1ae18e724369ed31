"""Connections between nodes (`broker.peer`) on real local sockets: a request that times out
drops its connection, so the next one connects anew. A peer whose pod was replaced leaves a
connection that looks open and answers nothing (its IP is gone); before this, a broker kept
sending its heartbeats into such a connection for minutes and stayed fenced."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any

import pytest

from broker.aio import wait_for
from broker.peer import PeerConnection, PeerUnavailable
from broker.protocol import (
    ApiKey,
    ErrorCode,
    FrameReader,
    RequestHeader,
    build,
    encode_response,
    request_type,
    response_module,
)


def _api_versions_answer(correlation_id: int) -> bytes:
    schema = response_module(ApiKey.API_VERSIONS, 0)
    body = build(schema.ApiVersionsResponse, error_code=ErrorCode.none, api_keys=())
    return encode_response(RequestHeader(ApiKey.API_VERSIONS, 0, correlation_id, "test"), body)


async def _peer_that_answers_from_connection(
    answering_from: int,
) -> tuple[asyncio.Server, list[int]]:
    """A node that reads every request; on its first `answering_from - 1` connections it never
    answers (as a vanished address swallows packets), on later ones it does."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections) + 1)
        answers = len(connections) >= answering_from
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                frames.receive_data(data)
                while (frame := frames.next_frame()) is not None:
                    if answers:
                        (correlation_id,) = struct.unpack_from(">i", frame, 4)
                        writer.write(_api_versions_answer(correlation_id))
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, connections


def test_a_request_that_times_out_drops_the_connection_and_the_next_one_reconnects() -> None:
    async def scenario() -> None:
        server, connections = await _peer_that_answers_from_connection(2)
        port = server.sockets[0].getsockname()[1]
        peer = PeerConnection(9, "127.0.0.1", port, client_id="test")
        request = build(request_type(ApiKey.API_VERSIONS, 0))
        try:
            in_flight = asyncio.ensure_future(
                peer.request(ApiKey.API_VERSIONS, 0, request, timeout_s=5)
            )
            await asyncio.sleep(0.05)
            with pytest.raises(TimeoutError):
                await peer.request(ApiKey.API_VERSIONS, 0, request, timeout_s=0.2)
            # The other request on that connection fails at once rather than waiting it out.
            with pytest.raises(PeerUnavailable):
                await wait_for(in_flight, 1)
            answer: Any = await peer.request(ApiKey.API_VERSIONS, 0, request, timeout_s=5)
            assert answer.error_code == ErrorCode.none
            assert connections == [1, 2]
        finally:
            await peer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_a_connect_that_never_completes_gives_up_within_the_request_timeout() -> None:
    """A listener whose accept queue is full drops SYNs, as an address that no pod holds any
    more does: the request gives up within its timeout instead of waiting out TCP's retries
    (two minutes), and the next one tries again after the reconnect backoff."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(address)
        fillers.append(filler)

    async def scenario() -> None:
        peer = PeerConnection(9, *address, client_id="test")
        request = build(request_type(ApiKey.API_VERSIONS, 0))
        try:
            with pytest.raises(PeerUnavailable, match="no connection within 300 ms"):
                await peer.request(ApiKey.API_VERSIONS, 0, request, timeout_s=0.3)
        finally:
            await peer.close()

    try:
        asyncio.run(wait_for(scenario(), 30))  # before: TCP's SYN retries, 2 minutes
    finally:
        for sock in (*fillers, listener):
            sock.close()
