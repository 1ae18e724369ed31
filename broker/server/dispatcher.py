"""From a request frame to a response frame: decode, route to the API's handler, encode.

Blame decides the outcome, as in Kafka: a frame the peer got wrong (malformed, or a version
it should not have sent) closes its connection — except ApiVersions at an unknown version,
which is answered (KIP-511); a handler that raises is our bug, logged once with the request
that caused it, and answered with that API's error response (UNKNOWN_SERVER_ERROR, or what
`classify` makes of the exception: KAFKA_STORAGE_ERROR for a failed disk); only Produce with
acks=0, which expects no answer, closes the connection. Either way every other connection
keeps being served.

A request frame of `OFF_LOOP_BYTES` or more is decoded, and its answer encoded, on a thread of
the codec's own (`CODEC_THREADS`, so that it never queues behind appends or a cleaning round
on asyncio's default executor), and the event loop serves others meanwhile: the codec holds
the GIL, but the `gregor` process has Python hand it back every millisecond (`broker.cli`). A
CreateTopics of 1000 topics (22 KB) took 14 ms of the loop to check, decode, handle and
answer; 6 ms once checked, decoded and encoded on a thread. Produce is left out: its bulk is
record bytes the codec takes as they are. A small request with a big answer (Metadata or
DescribeLogDirs of ten thousand partitions) has its handler return `BuiltOffLoop`: what it
took from the node's state on the loop, and a function that builds the answer from it, which
runs on the same threads with the encoding. Built and encoded on the loop, such an answer held
it 470 ms at a time with 10,000 partitions on a busy node, long enough for a few requests in a
row to cost the quorum its leader.

An `observer` (the metrics) sees every decoded request once it is answered: the request, the
response body (None when nothing is sent) and the nanoseconds from decode to encoded response.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from broker.protocol import (
    ApiKey,
    ErrorCode,
    MalformedInput,
    Request,
    RequestBody,
    RequestHeader,
    ResponseBody,
    UnsupportedVersion,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    unsupported_version_answer,
)
from broker.protocol.fetch import FetchResponse, Region, encode_fetch_response

__all__ = [
    "BUILT_OFF_LOOP_ENTRIES",
    "Answer",
    "BuiltOffLoop",
    "CloseConnection",
    "Dispatcher",
    "ForwardCheck",
    "Forwarder",
    "Frame",
    "Handler",
    "RequestContext",
    "RequestObserver",
    "SendOn",
]

log = logging.getLogger(__name__)

OFF_LOOP_BYTES = 16 * 1024
"""Requests this large (but Produce) are decoded and answered on a thread."""
_PRODUCE_KEY = struct.pack(">h", ApiKey.PRODUCE)
CODEC_THREADS = 2
"""Threads that decode and encode large requests, shared by every connection of the process
(the codec holds the GIL, so more would not run at once)."""
_codec = ThreadPoolExecutor(CODEC_THREADS, thread_name_prefix="codec")


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who sent a request, and through which listener."""

    header: RequestHeader
    listener: str
    client_address: str
    from_broker: bool = False
    """Sent by a broker of this cluster on its own behalf (forwarded in an Envelope by the
    broker itself, not a client's request): it may create internal topics."""
    forwarded: bool = False
    """Forwarded here by the broker the client sent it to, which made the checks that are
    that broker's (see `ForwardCheck`)."""


@dataclass(frozen=True, slots=True)
class BuiltOffLoop:
    """An answer to build on a codec thread, and encode there: `build` must read only what the
    handler took from the node's state for it (immutable, or copied on the loop), never the
    state itself, which the loop goes on changing meanwhile."""

    build: Callable[[], ResponseBody]


BUILT_OFF_LOOP_ENTRIES = 1000
"""How many entries (partitions, say) an answer has before its handler builds it off the loop.
Metadata of one topic took 10 ms to build and encode at 1,000 partitions, 100 ms at 10,000
(quiet machine, 2026-11-27); smaller answers stay on the loop, without the hop to a thread."""


Body = ResponseBody | FetchResponse
"""A response body: the generic codec's, or Fetch's own (records as file regions)."""
Answer = Body | BuiltOffLoop
"""What a handler returns: a response body, or one to build on a codec thread."""
Frame = bytes | list[bytes | Region]
"""An encoded response: one buffer, or buffers with file regions between them (Fetch)."""
Handler = Callable[[RequestContext, Any], Awaitable[Answer | None]]
"""An API's handler: the decoded body in, the response body out (None: send nothing, as for
Produce with acks=0)."""
ErrorResponder = Callable[[RequestBody, ErrorCode], ResponseBody]
FallbackResponder = Callable[[int, int, RequestBody, ErrorCode, str | None], ResponseBody]
"""Any API's error response: (api key, version, request, error, message) → response."""
ErrorClassifier = Callable[[Exception], ErrorCode]
"""The error code a handler's exception is answered with (UNKNOWN_SERVER_ERROR unless the
node knows better, e.g. KAFKA_STORAGE_ERROR for a failed disk)."""
Forwarder = Callable[[bytes, str], Awaitable[bytes | None]]
"""(request frame, client address) → the response frame from the node that handled it, or
None to handle it here."""
SendOn = Callable[[Any], Awaitable[Any]]
"""Sends a request body, in the client's header, where `Dispatcher.forwarder` sends frames:
the active controller's response body, or None when the request is to be handled here."""
ForwardCheck = Callable[[RequestContext, Any, SendOn], Awaitable[Body | None]]
"""What the broker a client sent a forwarded API to decides itself before the active
controller does (Kafka's ConfigAdminManager.preprocess: a broker's own configs are changed
through that broker): the whole answer, having sent on (`SendOn`) what is the controller's
to decide, or None to forward the request as it came."""
RequestObserver = Callable[[Request, Body | None, int], None]
"""Called once per decoded request: the request, its response body, nanoseconds it took."""


class CloseConnection(Exception):
    """The connection must close; the message says why (for the log)."""


class Dispatcher:
    def __init__(
        self,
        handlers: Mapping[int, Handler],
        error_responders: Mapping[int, ErrorResponder] | None = None,
        *,
        fallback: FallbackResponder | None = None,
        classify: ErrorClassifier | None = None,
    ) -> None:
        self._handlers = dict(handlers)
        self._error_responders = dict(error_responders or {})
        self._fallback = fallback
        self._classify = classify
        self.observer: RequestObserver | None = None
        self.forwarder: Forwarder | None = None
        self.forwarded_apis: frozenset[int] = frozenset()
        """The API keys `forwarder` is offered (checked before anything is copied)."""
        self.forward_checks: dict[int, ForwardCheck] = {}
        """Forwarded APIs this node checks before it forwards them (decoded here first)."""

    def register(
        self,
        handlers: Mapping[int, Handler],
        error_responders: Mapping[int, ErrorResponder] | None = None,
    ) -> None:
        self._handlers.update(handlers)
        self._error_responders.update(error_responders or {})

    @property
    def handled_api_keys(self) -> frozenset[int]:
        return frozenset(self._handlers)

    async def dispatch(
        self,
        frame: bytes | memoryview,
        listener: str,
        client_address: str,
        *,
        forward: bool = True,
        from_broker: bool = False,
    ) -> Frame | None:
        """The response frame for a request frame, None if nothing is sent back.

        Raises `CloseConnection` when the connection must be closed. With `forward`, a request
        the `forwarder` takes (an admin write on a node that is not the active controller) is
        answered by the active controller; `forward=False` handles it here whatever this node
        is (a request that was forwarded to it already).
        """
        api_key = int.from_bytes(frame[:2], "big", signed=True) if len(frame) >= 2 else -1
        forwarding = forward and self.forwarder is not None and api_key in self.forwarded_apis
        if forwarding and api_key not in self.forward_checks:
            forwarding = False
            assert self.forwarder is not None
            forwarded = await self.forwarder(bytes(frame), client_address)
            if forwarded is not None:
                return forwarded
        off_loop = len(frame) >= OFF_LOOP_BYTES and frame[:2] != _PRODUCE_KEY
        try:
            request = (
                await asyncio.get_running_loop().run_in_executor(_codec, decode_request, frame)
                if off_loop
                else (decode_request(frame))
            )
        except UnsupportedVersion as exc:
            answer = unsupported_version_answer(exc)
            if answer is None:
                raise CloseConnection(str(exc)) from exc
            return answer
        except MalformedInput as exc:
            raise CloseConnection(str(exc)) from exc
        handler = self._handlers.get(request.header.api_key)
        if handler is None:
            raise CloseConnection(
                f"no handler for API key {request.header.api_key}: it is not advertised"
            )
        context = RequestContext(
            request.header, listener, client_address, from_broker, forwarded=not forward
        )
        if forwarding:
            checked = await self._checked_forward(context, request, bytes(frame))
            if checked is not None:
                return checked
        started = time.perf_counter_ns()
        body: Body | None = None
        try:
            handled = await self._handle(handler, context, request)
            body, encoded = await self._encoded(context, request, handled, off_loop=off_loop)
            return encoded
        finally:
            if self.observer is not None:
                self.observer(request, body, time.perf_counter_ns() - started)

    async def _handle(
        self, handler: Handler, context: RequestContext, request: Request
    ) -> Answer | None:
        """The handler's answer; if it raised, the API's error response."""
        try:
            return await handler(context, request.body)
        except CloseConnection:
            raise
        except Exception as exc:
            if self._classify is not None and self._classify(exc) in _EXPECTED:
                # A condition of the cluster the client is told of and retries (an admin
                # write while the controller moves), not a failure of this node.
                log.info(
                    "%s v%d from %s (client %r) answered with an error: %s",
                    type(request.body).__name__,
                    request.header.api_version,
                    context.client_address,
                    request.header.client_id,
                    exc,
                )
            else:
                log.exception(
                    "handler failed for %s v%d from %s (client %r)",
                    type(request.body).__name__,
                    request.header.api_version,
                    context.client_address,
                    request.header.client_id,
                )
            return self._error_body(request, exc)

    async def _encoded(
        self, context: RequestContext, request: Request, answer: Answer | None, *, off_loop: bool
    ) -> tuple[Body | None, Frame | None]:
        """The answer encoded (built first, if `BuiltOffLoop`), on a codec thread if it is built
        there or the request was large; if building or encoding it failed (a bug of ours), the
        API's error response, so that the client is answered and the connection goes on."""
        header = request.header
        try:
            if isinstance(answer, BuiltOffLoop):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(_codec, _build_and_encode, header, answer)
            if off_loop:
                loop = asyncio.get_running_loop()
                return answer, await loop.run_in_executor(_codec, _encode, header, answer)
            return answer, _encode(header, answer)
        except Exception as exc:
            log.exception(
                "building or encoding the answer failed for %s v%d from %s (client %r)",
                type(request.body).__name__,
                header.api_version,
                context.client_address,
                header.client_id,
            )
            body = self._error_body(request, exc)
            return body, _encode(header, body)

    async def _checked_forward(
        self, context: RequestContext, request: Request, frame: bytes
    ) -> Frame | None:
        """A forwarded API with a `ForwardCheck`: its answer, the check's or the active
        controller's; None to handle it here (this node is the active controller, or none can
        be reached)."""
        assert self.forwarder is not None
        forwarder = self.forwarder
        header = request.header

        async def send_on(body: Any) -> Any:
            answer = await forwarder(encode_request(header, body)[4:], context.client_address)
            if answer is None:
                return None
            return decode_response(header.api_key, header.api_version, answer[4:])[1]

        checked = await self.forward_checks[header.api_key](context, request.body, send_on)
        if checked is not None:
            return _encode(header, checked)
        return await forwarder(frame, context.client_address)

    def _error_body(self, request: Request, exc: Exception) -> ResponseBody:
        header = request.header
        if header.api_key == ApiKey.PRODUCE and getattr(request.body, "acks", 1) == 0:
            # acks=0 expects no answer at all: closing is how such a client learns (Kafka too).
            raise CloseConnection("acks=0 produce failed")
        error = ErrorCode.unknown_server_error if self._classify is None else self._classify(exc)
        responder = self._error_responders.get(header.api_key)
        if responder is not None:
            return responder(request.body, error)
        if self._fallback is None:
            raise CloseConnection("handler failed and the API has no error response")
        message = str(exc) if error != ErrorCode.unknown_server_error else None
        return self._fallback(header.api_key, header.api_version, request.body, error, message)


_EXPECTED = frozenset({ErrorCode.not_controller})
"""Errors a handler may raise in the normal course of a cluster's life: logged at INFO."""


def _build_and_encode(header: RequestHeader, deferred: BuiltOffLoop) -> tuple[Body, Frame | None]:
    body = deferred.build()
    return body, _encode(header, body)


def _encode(header: RequestHeader, body: Body | None) -> Frame | None:
    if body is None:
        return None
    if not isinstance(body, FetchResponse):
        return encode_response(header, body)
    try:
        return encode_fetch_response(header.correlation_id, header.api_version, body)
    except BaseException:
        for region in body.regions():
            region.close()
        raise
