"""Request headers v0–v2 and response headers v0–v1.

Our own codec rather than kio's: the header must be read before the API version is known to be
supported (an unknown ApiVersions version is still answered), kio has no request header v0, and
this is the one part of every request on the hot path, so it is a few `struct` calls.

Layouts (RequestHeader.json / ResponseHeader.json):
- request v0: api_key int16, api_version int16, correlation_id int32
- request v1: v0 + client_id as a nullable int16-length string
- request v2: v1 + tagged fields (client_id stays non-compact)
- response v0: correlation_id int32; response v1: v0 + tagged fields
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import MalformedInput
from .primitives import Buffer, TaggedFields, read_tagged_fields, write_tagged_fields

__all__ = [
    "RequestHeader",
    "ResponseHeader",
    "decode_request_header",
    "decode_response_header",
    "encode_request_header",
    "encode_response_header",
    "peek_api_key_and_version",
]

_KEY_VERSION_CORRELATION = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    tagged_fields: TaggedFields = ()


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    correlation_id: int
    tagged_fields: TaggedFields = ()


def peek_api_key_and_version(frame: Buffer) -> tuple[int, int, int]:
    """The api key, api version and correlation id that open every request header."""
    view = memoryview(frame)
    if len(view) < _KEY_VERSION_CORRELATION.size:
        raise MalformedInput(
            f"request of {len(view)} bytes is shorter than a request header", where="request header"
        )
    api_key, api_version, correlation_id = _KEY_VERSION_CORRELATION.unpack_from(view, 0)
    return api_key, api_version, correlation_id


def decode_request_header(frame: Buffer, header_version: int) -> tuple[RequestHeader, int]:
    """Decode a request header; return it and the position where the body starts."""
    view = memoryview(frame)
    api_key, api_version, correlation_id = peek_api_key_and_version(view)
    pos = _KEY_VERSION_CORRELATION.size
    if header_version == 0:
        return RequestHeader(api_key, api_version, correlation_id), pos
    where = f"request header v{header_version}, correlation id {correlation_id}"
    if pos + 2 > len(view):
        raise MalformedInput("missing client_id", where=where)
    (length,) = _INT16.unpack_from(view, pos)
    pos += 2
    client_id: str | None = None
    if length >= 0:
        if pos + length > len(view):
            raise MalformedInput(f"client_id of {length} bytes is truncated", where=where)
        try:
            client_id = str(view[pos : pos + length], "utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedInput("client_id is not valid UTF-8", where=where) from exc
        pos += length
    elif length != -1:
        raise MalformedInput(f"client_id has negative length {length}", where=where)
    tagged: TaggedFields = ()
    if header_version >= 2:
        tagged, pos = read_tagged_fields(view, pos, where)
    return RequestHeader(api_key, api_version, correlation_id, client_id, tagged), pos


def encode_request_header(header: RequestHeader, header_version: int) -> bytes:
    out = _KEY_VERSION_CORRELATION.pack(header.api_key, header.api_version, header.correlation_id)
    if header_version == 0:
        return out
    if header.client_id is None:
        out += _INT16.pack(-1)
    else:
        client_id = header.client_id.encode()
        out += _INT16.pack(len(client_id)) + client_id
    if header_version >= 2:
        out += write_tagged_fields(header.tagged_fields)
    return out


def decode_response_header(frame: Buffer, header_version: int) -> tuple[ResponseHeader, int]:
    view = memoryview(frame)
    if len(view) < 4:
        raise MalformedInput("response shorter than its correlation id", where="response header")
    (correlation_id,) = _INT32.unpack_from(view, 0)
    if header_version == 0:
        return ResponseHeader(correlation_id), 4
    where = f"response header v1, correlation id {correlation_id}"
    tagged, pos = read_tagged_fields(view, 4, where)
    return ResponseHeader(correlation_id, tagged), pos


def encode_response_header(header: ResponseHeader, header_version: int) -> bytes:
    out = _INT32.pack(header.correlation_id)
    if header_version >= 1:
        out += write_tagged_fields(header.tagged_fields)
    return out
