"""ApiVersions: the APIs this node has handlers for, at the versions in the version table.

`advertisement` is the one answer: the handler sends it and `gregor api-versions` prints it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from broker.protocol import ApiKey, ErrorCode, ResponseBody, advertised, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE

__all__ = ["Handler", "advertisement"]


def advertisement(handled: Iterable[int]) -> list[tuple[ApiKey, int, int]]:
    """(API key, min version, max version) of each API a node with handlers for `handled`
    advertises, in API key order, as they go on the wire."""
    return [(key, r.min, r.max) for key, r in sorted(advertised(handled).items())]


class Handler:
    def __init__(self, handled: Callable[[], frozenset[int]]) -> None:
        self._handled = handled

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.API_VERSIONS, version)
        entries = tuple(
            build(schema.ApiVersion, api_key=key, min_version=low, max_version=high)
            for key, low, high in advertisement(self._handled())
        )
        response: ResponseBody = build(
            schema.ApiVersionsResponse,
            error_code=ErrorCode.none,
            api_keys=entries,
            throttle_time=NO_THROTTLE,
        )
        return response
