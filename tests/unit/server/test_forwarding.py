"""The dispatcher's forwarding hook: a request of a forwarded API is answered with what the
forwarder returns, untouched; any other request, one the forwarder declines (None), or one
already forwarded (`forward=False`) is handled here."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from broker.handlers.api_versions import Handler as ApiVersions
from broker.protocol import (
    ApiKey,
    RequestHeader,
    build,
    encode_request,
    request_type,
    response_module,
)
from broker.server import Dispatcher, RequestContext


def _frame(api_key: ApiKey, version: int, body: Any) -> bytes:
    return encode_request(RequestHeader(api_key, version, 7, "t"), body)[4:]


HANDLED: list[int] = []


def _dispatcher(forwarded: list[bytes], answer: bytes | None) -> Dispatcher:
    async def create_topics(context: RequestContext, request: Any) -> Any:
        HANDLED.append(context.header.api_key)
        schema = response_module(ApiKey.CREATE_TOPICS, 7)
        return build(schema.CreateTopicsResponse, throttle_time=timedelta(0), topics=())

    dispatcher = Dispatcher({ApiKey.CREATE_TOPICS: create_topics})
    dispatcher.register({ApiKey.API_VERSIONS: ApiVersions(lambda: dispatcher.handled_api_keys)})

    async def forwarder(frame: bytes, client: str) -> bytes | None:
        forwarded.append(frame)
        return answer

    dispatcher.forwarder = forwarder
    dispatcher.forwarded_apis = frozenset({ApiKey.CREATE_TOPICS})
    return dispatcher


CREATE = _frame(
    ApiKey.CREATE_TOPICS,
    7,
    build(
        request_type(ApiKey.CREATE_TOPICS, 7),
        topics=(),
        timeout=timedelta(seconds=1),
        validate_only=False,
    ),
)
VERSIONS = _frame(
    ApiKey.API_VERSIONS,
    3,
    build(
        request_type(ApiKey.API_VERSIONS, 3), client_software_name="t", client_software_version="1"
    ),
)


def test_a_forwarded_api_is_answered_by_the_forwarder_untouched() -> None:
    forwarded: list[bytes] = []
    dispatcher = _dispatcher(forwarded, b"\x00\x00\x00\x03abc")
    HANDLED.clear()
    answer = asyncio.run(dispatcher.dispatch(CREATE, "PLAINTEXT", "1.2.3.4:5"))
    assert answer == b"\x00\x00\x00\x03abc"
    assert forwarded == [CREATE]
    assert HANDLED == []


def test_other_apis_declined_ones_and_forwarded_ones_are_handled_here() -> None:
    forwarded: list[bytes] = []
    dispatcher = _dispatcher(forwarded, None)
    assert asyncio.run(dispatcher.dispatch(VERSIONS, "PLAINTEXT", "c")) is not None
    assert forwarded == []  # ApiVersions is never offered
    # Declined (this node is the active controller): the handler here answers.
    assert asyncio.run(dispatcher.dispatch(CREATE, "PLAINTEXT", "c")) is not None
    assert forwarded == [CREATE]
    # Already forwarded once: never offered again.
    HANDLED.clear()
    asyncio.run(dispatcher.dispatch(CREATE, "envelope", "c", forward=False))
    assert forwarded == [CREATE]
    assert HANDLED == [ApiKey.CREATE_TOPICS]
