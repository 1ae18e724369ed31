"""A handler whose answer is big (Metadata or DescribeLogDirs of thousands of partitions)
returns `BuiltOffLoop`: the answer is built and encoded on a codec thread while the event loop
serves everyone else, over a real loopback socket; if building it fails, or encoding any
answer does, the client gets the API's error response, as for a handler that failed."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from broker.aio import wait_for
from broker.handlers.context import NO_THROTTLE
from broker.handlers.errors import error_response
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.protocol.messages import decode_response
from broker.server import BuiltOffLoop, Dispatcher, RequestContext
from broker.server.connection import Connection
from tests.support.wire import api_versions_frame


def _answer() -> ResponseBody:
    schema = response_module(ApiKey.API_VERSIONS, 3)
    body: ResponseBody = build(
        schema.ApiVersionsResponse,
        error_code=ErrorCode.none,
        api_keys=(),
        throttle_time=NO_THROTTLE,
    )
    return body


async def _serve(dispatcher: Dispatcher) -> tuple[asyncio.Server, int]:
    registry: set[Connection] = set()
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(dispatcher, "PLAINTEXT", 1 << 20, registry), "127.0.0.1", 0
    )
    return server, server.sockets[0].getsockname()[1]


async def _call(port: int, client_id: str) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(api_versions_frame(1, client_id))
        size = int.from_bytes(await reader.readexactly(4), "big")
        _, body = decode_response(ApiKey.API_VERSIONS, 3, await reader.readexactly(size))
        return body
    finally:
        writer.close()


def _answered_with_error(handler: Any, caplog: pytest.LogCaptureFixture) -> ErrorCode:
    """The error code ApiVersions is answered with when `handler` serves it, behind a
    dispatcher that answers failures with each API's error response; errors are captured."""

    async def scenario() -> ErrorCode:
        dispatcher = Dispatcher({ApiKey.API_VERSIONS: handler}, fallback=error_response)
        server, port = await _serve(dispatcher)
        async with server:
            answered = await wait_for(_call(port, "any"), 5)
        return ErrorCode(answered.error_code)

    with caplog.at_level(logging.ERROR, logger="broker.server.dispatcher"):
        return asyncio.run(wait_for(scenario(), 30))


def test_a_big_answer_is_built_on_a_thread_while_the_loop_serves_others() -> None:
    """The big answer's build waits until another client has been answered: built on the
    event loop, it would hold the loop, the other client would never be answered, and the
    build would give up waiting."""
    started = threading.Event()
    others_answered = threading.Event()
    built_on: list[int] = []

    def build_big() -> ResponseBody:
        built_on.append(threading.get_ident())
        started.set()
        assert others_answered.wait(10), "no other client was answered while this was built"
        return _answer()

    async def handler(context: RequestContext, request: Any) -> ResponseBody | BuiltOffLoop:
        return BuiltOffLoop(build_big) if context.header.client_id == "big" else _answer()

    async def scenario() -> None:
        server, port = await _serve(Dispatcher({ApiKey.API_VERSIONS: handler}))
        async with server:
            big = asyncio.create_task(_call(port, "big"))
            while not started.is_set():
                await asyncio.sleep(0.01)
            small = await wait_for(_call(port, "small"), 5)
            assert small.error_code == ErrorCode.none
            others_answered.set()
            answered = await wait_for(big, 15)
            assert answered.error_code == ErrorCode.none
        assert built_on
        assert built_on[0] != threading.get_ident(), "built on the event loop's thread"

    asyncio.run(wait_for(scenario(), 30))


def test_a_big_answer_that_fails_to_build_is_the_apis_error_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> ResponseBody:
        raise RuntimeError("a bug in building")

    async def handler(context: RequestContext, request: Any) -> BuiltOffLoop:
        return BuiltOffLoop(broken)

    assert _answered_with_error(handler, caplog) == ErrorCode.unknown_server_error
    assert "building or encoding the answer failed for ApiVersionsRequest v3" in caplog.text
    assert "a bug in building" in caplog.text


def test_an_answer_that_cannot_be_encoded_is_the_apis_error_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Encoding on the loop fails as building off it may: the client is answered the API's
    error response, and the connection goes on."""

    async def handler(context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.API_VERSIONS, 3)
        body: ResponseBody = build(
            schema.ApiVersionsResponse, error_code=ErrorCode.none, api_keys=(), throttle_time=0
        )
        return body  # an int where the codec wants a duration: a bug of ours

    assert _answered_with_error(handler, caplog) == ErrorCode.unknown_server_error
    assert "building or encoding the answer failed for ApiVersionsRequest v3" in caplog.text
