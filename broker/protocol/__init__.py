"""The Kafka wire protocol, sans-io: bytes in, typed frames out, and back.

What it owns: framing, request/response headers, message bodies for every API version in the
version table, record batches (magic 2) and their codecs, and the protocol's errors.
What it must never do: open sockets, read clocks, import asyncio or the server. Everything
outside this package goes through the names exported here and never imports kio directly.
"""

from .compression import Codec
from .errors import (
    EncodingError,
    ErrorCode,
    FrameTooLarge,
    MalformedInput,
    ProtocolError,
    UnsupportedVersion,
)
from .framing import DEFAULT_MAX_REQUEST_BYTES, FrameReader, encode_frame
from .headers import RequestHeader, ResponseHeader
from .messages import (
    Request,
    RequestBody,
    ResponseBody,
    build,
    decode_request,
    decode_request_body,
    decode_response,
    decode_response_body,
    encode_request,
    encode_request_body,
    encode_response,
    encode_response_body,
    request_type,
    response_module,
    response_type,
    unsupported_version_answer,
)
from .versions import REFUSED, SUPPORTED, ApiKey, VersionRange, advertised, is_supported

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "REFUSED",
    "SUPPORTED",
    "ApiKey",
    "Codec",
    "EncodingError",
    "ErrorCode",
    "FrameReader",
    "FrameTooLarge",
    "MalformedInput",
    "ProtocolError",
    "Request",
    "RequestBody",
    "RequestHeader",
    "ResponseBody",
    "ResponseHeader",
    "UnsupportedVersion",
    "VersionRange",
    "advertised",
    "build",
    "decode_request",
    "decode_request_body",
    "decode_response",
    "decode_response_body",
    "encode_frame",
    "encode_request",
    "encode_request_body",
    "encode_response",
    "encode_response_body",
    "is_supported",
    "request_type",
    "response_module",
    "response_type",
    "unsupported_version_answer",
]
