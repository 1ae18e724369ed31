"""Kafka requests and responses: frames in, typed messages out, and back.

This is the project's interface over kio (ADR 0001): the rest of the broker asks for a message
class by API key and version, decodes a request frame, and encodes a response frame here, and
never imports kio itself. Message bodies are kio's frozen dataclasses, one per API and version,
generated from Kafka's schemas; headers and size prefixes are ours (`headers`, `framing`), and so
are the Produce request (`produce`, which keeps records as slices of the frame) and the Fetch
response (`fetch`).

Version rules kept here: a request's header is v2 when its version is flexible, else v1; a
response's header is v1 when flexible, else v0, except ApiVersions responses, which are always
v0 so that a client can read them whatever version it tried (KIP-511).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeAlias, cast

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16
from kio.static.protocol import RequestPayload, ResponsePayload

from .bounds import check_bounds
from .errors import EncodingError, ErrorCode, MalformedInput, UnsupportedVersion
from .framing import encode_frame
from .headers import (
    RequestHeader,
    ResponseHeader,
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    peek_api_key_and_version,
)
from .primitives import Buffer
from .produce import ZERO_COPY_PRODUCE_BYTES, decode_produce_request
from .versions import SUPPORTED, ApiKey, is_decodable

__all__ = [
    "Request",
    "RequestBody",
    "ResponseBody",
    "build",
    "decode_request",
    "decode_request_body",
    "decode_response",
    "decode_response_body",
    "encode_request",
    "encode_request_body",
    "encode_response",
    "encode_response_body",
    "request_header_version",
    "request_module",
    "request_type",
    "response_header_version",
    "response_module",
    "response_type",
    "unsupported_version_answer",
]

RequestBody: TypeAlias = RequestPayload
"""A request body: a kio dataclass carrying `__api_key__` and `__version__`."""
ResponseBody: TypeAlias = ResponsePayload
"""A response body: a kio dataclass carrying `__api_key__` and `__version__`."""

_Reader: TypeAlias = Callable[[Buffer, int], tuple[Any, int]]
_Writer: TypeAlias = Callable[[io.BytesIO, Any], None]


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header and its typed body."""

    header: RequestHeader
    body: RequestBody


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api key {api_key}"


@functools.cache
def request_type(api_key: int, api_version: int) -> type[RequestBody]:
    """The request class for an API version Gregor decodes.

    Raises `LookupError` for versions outside the version table: asking for one is a bug.
    """
    if not is_decodable(api_key, api_version):
        raise LookupError(f"{_api_name(api_key)} v{api_version} is not decoded by Gregor")
    return load_request_schema(api_key, api_version)


@functools.cache
def response_type(api_key: int, api_version: int) -> type[ResponseBody]:
    """The response class for an API version Gregor decodes."""
    if not is_decodable(api_key, api_version):
        raise LookupError(f"{_api_name(api_key)} v{api_version} is not decoded by Gregor")
    return load_response_schema(api_key, api_version)


def response_module(api_key: int, api_version: int) -> ModuleType:
    """The module holding a response version's class and its nested structs, so handlers
    build nested values (`module.MetadataResponseBroker(...)`) for the version asked."""
    return importlib.import_module(response_type(api_key, api_version).__module__)


def request_module(api_key: int, api_version: int) -> ModuleType:
    return importlib.import_module(request_type(api_key, api_version).__module__)


def build(message: type[Any], /, **values: Any) -> Any:
    """Instantiate a message class from values written for every version of it: fields the
    class does not have at this version are left out, missing ones take their defaults."""
    names = _field_names.get(message)
    if names is None:
        names = _field_names[message] = frozenset(f.name for f in dataclasses.fields(message))
    return message(**{name: value for name, value in values.items() if name in names})


_field_names: dict[type[Any], frozenset[str]] = {}


def request_header_version(api_key: int, api_version: int) -> int:
    if is_decodable(api_key, api_version):
        return 2 if request_type(api_key, api_version).__flexible__ else 1
    # Only ApiVersions is read at a version we do not know; it became flexible at v3.
    return 2 if api_key == ApiKey.API_VERSIONS and api_version >= 3 else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if response_type(api_key, api_version).__flexible__ else 0


_readers: dict[type[Any], _Reader] = {}
_writers: dict[type[Any], _Writer] = {}


def _reader(entity: type[Any]) -> _Reader:
    reader = _readers.get(entity)
    if reader is None:
        reader = _readers[entity] = cast(_Reader, entity_reader(entity))
    return reader


def _writer(entity: type[Any]) -> _Writer:
    writer = _writers.get(entity)
    if writer is None:
        writer = _writers[entity] = cast(_Writer, entity_writer(entity))
    return writer


def _decode(entity: type[Any], data: Buffer, position: int, where: Callable[[], str]) -> Any:
    """Decode a body; `where` describes it, built only when there is an error to report."""
    try:
        # kio sizes arrays from their length fields before reading them; refuse lengths that
        # the frame cannot hold first, or one hostile request could abort the process.
        check_bounds(entity, data, position)  # type: ignore[arg-type]
        body, _size = _reader(entity)(data, position)
    except MemoryError:
        raise
    except MalformedInput as exc:
        raise MalformedInput(exc.what, where=where()) from None
    except Exception as exc:  # kio's native reader raises several types; all mean bad bytes.
        raise MalformedInput(f"{type(exc).__name__}: {exc}", where=where()) from exc
    # Like Kafka, bytes after the body are ignored: no client sends them, and refusing them
    # would protect nothing.
    return body


def _encode(body: Any) -> bytes:
    buffer = io.BytesIO()
    try:
        _writer(type(body))(buffer, body)
    except Exception as exc:
        raise EncodingError(
            f"cannot encode {type(body).__name__} v{body.__version__}: {exc}"
        ) from exc
    return buffer.getvalue()


def decode_request_body(api_key: int, api_version: int, data: Buffer) -> RequestBody:
    """Decode a request body alone (no header), e.g. one carried inside an Envelope."""
    entity = request_type(api_key, api_version)
    if api_key == ApiKey.PRODUCE and len(data) >= ZERO_COPY_PRODUCE_BYTES:
        return cast(RequestBody, decode_produce_request(entity, data, 0))
    return cast(RequestBody, _decode(entity, data, 0, lambda: f"{entity.__name__} body"))


def decode_response_body(api_key: int, api_version: int, data: Buffer) -> ResponseBody:
    entity = response_type(api_key, api_version)
    return cast(ResponseBody, _decode(entity, data, 0, lambda: f"{entity.__name__} body"))


def encode_request_body(body: RequestBody) -> bytes:
    return _encode(body)


def encode_response_body(body: ResponseBody) -> bytes:
    return _encode(body)


def decode_request(frame: Buffer) -> Request:
    """Decode one request frame (without its size prefix).

    Raises `UnsupportedVersion` for an API key or version outside the table, and
    `MalformedInput` for anything else that is not a valid request.
    """
    api_key, api_version, correlation_id = peek_api_key_and_version(frame)
    codec = _request_codec(api_key, api_version)
    if codec is None:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    header_version, entity = codec
    header, position = decode_request_header(frame, header_version)

    def where() -> str:
        return (
            f"{entity.__name__} v{api_version}, correlation id {correlation_id}, "
            f"client {header.client_id!r}"
        )

    if api_key == ApiKey.PRODUCE and len(frame) >= ZERO_COPY_PRODUCE_BYTES:
        # Records stay slices of the frame (produce.py): only the batch header is ever copied.
        try:
            return Request(header, decode_produce_request(entity, frame, position))
        except MalformedInput as exc:
            raise MalformedInput(exc.what, where=where()) from None
    return Request(header, _decode(entity, frame, position, where))


@functools.cache
def _request_codec(api_key: int, api_version: int) -> tuple[int, type[RequestBody]] | None:
    """The header version and body class of a decodable request version, or None."""
    if not is_decodable(api_key, api_version):
        return None
    return request_header_version(api_key, api_version), request_type(api_key, api_version)


def encode_request(header: RequestHeader, body: RequestBody) -> bytes:
    """A size-prefixed request frame, for the broker's own clients and for tests."""
    _check_matches(header, body)
    header_version = request_header_version(header.api_key, header.api_version)
    return encode_frame(encode_request_header(header, header_version) + _encode(body))


def encode_response(request: RequestHeader, body: ResponseBody) -> bytes:
    """The size-prefixed response frame answering `request`."""
    _check_matches(request, body)
    header_version = response_header_version(request.api_key, request.api_version)
    header = encode_response_header(ResponseHeader(request.correlation_id), header_version)
    return encode_frame(header + _encode(body))


def decode_response(api_key: int, api_version: int, frame: Buffer) -> tuple[int, ResponseBody]:
    """Decode a response frame (without its size prefix) to `(correlation_id, body)`."""
    header, position = decode_response_header(frame, response_header_version(api_key, api_version))
    entity = response_type(api_key, api_version)

    def where() -> str:
        return f"{entity.__name__} v{api_version}, correlation id {header.correlation_id}"

    body = _decode(entity, frame, position, where)
    return header.correlation_id, cast(ResponseBody, body)


def _check_matches(header: RequestHeader, body: RequestBody | ResponseBody) -> None:
    if (body.__api_key__, body.__version__) != (header.api_key, header.api_version):
        raise EncodingError(
            f"{type(body).__name__} v{body.__version__} does not answer "
            f"{_api_name(header.api_key)} v{header.api_version}"
        )


def unsupported_version_answer(error: UnsupportedVersion) -> bytes | None:
    """What Kafka sends back for a request at a version it does not serve.

    ApiVersions at an unknown version gets a v0 response with UNSUPPORTED_VERSION and the
    ApiVersions range, so the client can retry at a version both sides know (KIP-511). Any
    other API gets nothing: the connection is closed (None).
    """
    if error.api_key != ApiKey.API_VERSIONS:
        return None
    versions = SUPPORTED[ApiKey.API_VERSIONS]
    body = ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersion(
                api_key=i16(ApiKey.API_VERSIONS),
                min_version=i16(versions.min),
                max_version=i16(versions.max),
            ),
        ),
    )
    header = encode_response_header(ResponseHeader(error.correlation_id), 0)
    return encode_frame(header + _encode(body))
