"""Speaking the Kafka protocol to a broker by hand, for the tests no client library can write:
hostile frames, exact versions, and retries a real client would never send."""

from __future__ import annotations

import itertools
import socket
from typing import Any

from broker.protocol import FrameReader, RequestHeader, decode_response, encode_request

__all__ = ["call", "exchange"]

_correlation_ids = itertools.count(1)


def exchange(sock: socket.socket, frame: bytes) -> bytes | None:
    """Send one frame; the response frame, or None if the broker closed the connection."""
    sock.sendall(frame)
    reader = FrameReader()
    while (response := reader.next_frame()) is None:
        data = sock.recv(65536)
        if not data:
            return None
        reader.receive_data(data)
    return response


def call(
    address: tuple[str, int], api_key: int, version: int, body: Any, timeout: float = 10.0
) -> Any:
    """One request on a fresh connection; the decoded response body (its correlation id
    checked). Fails if the broker closes the connection instead of answering."""
    correlation_id = next(_correlation_ids)
    frame = encode_request(RequestHeader(api_key, version, correlation_id, "gregor-tests"), body)
    with socket.create_connection(address, timeout=timeout) as sock:
        response = exchange(sock, frame)
    if response is None:
        raise ConnectionError(f"the broker closed the connection instead of answering {api_key}")
    answered_id, decoded = decode_response(api_key, version, response)
    assert answered_id == correlation_id
    return decoded
