"""Errors of the protocol layer, split by blame as h11 does.

`MalformedInput` is the peer's fault: bytes that are not a valid Kafka frame, header, message or
record batch. It is the only exception decoding ever raises, whatever the underlying library
raised, so the server can answer or close the connection and keep serving everyone else.
`EncodingError` is ours: a response that does not fit its schema is a broker bug.

Kafka error codes travel as values inside responses (`ErrorCode`), never as exceptions.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "EncodingError",
    "ErrorCode",
    "FrameTooLarge",
    "MalformedInput",
    "ProtocolError",
    "UnsupportedVersion",
]


class ProtocolError(Exception):
    """Base of every error raised by `broker.protocol`."""


class MalformedInput(ProtocolError):
    """The peer sent bytes that cannot be decoded.

    `what` names the problem, `where` names the part of the input (a frame, a header, a message
    at a version, a record batch at a byte position) so that the log line alone tells an operator
    which client sent what.
    """

    def __init__(self, what: str, *, where: str) -> None:
        super().__init__(f"{what} ({where})")
        self.what = what
        self.where = where


class FrameTooLarge(MalformedInput):
    """A frame announced more bytes than `socket.request.max.bytes` allows.

    Kafka closes the connection without reading the frame; so must we, before buffering it.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"frame of {size} bytes exceeds socket.request.max.bytes={limit}",
            where="frame size prefix",
        )
        self.size = size
        self.limit = limit


class UnsupportedVersion(MalformedInput):
    """The request names an API key or version this broker does not serve.

    A client that negotiated with ApiVersions never sends one, so Kafka closes the connection;
    the one exception is ApiVersions itself, answered by `unsupported_version_answer`.
    """

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(
            f"unsupported API key {api_key} version {api_version}",
            where=f"request header, correlation id {correlation_id}",
        )
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class EncodingError(ProtocolError):
    """The broker built a message that does not fit its schema: a bug on our side."""
