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
        self._answers: dict[tuple[int, frozenset[int]], ResponseBody] = {}
        """Built once per version and set of handlers (every client sends this request first,
        and building its forty entries cost more than encoding them)."""

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        handled = self._handled()
        answer = self._answers.get((version, handled))
        if answer is None:
            answer = self._answers[version, handled] = self._build(version, handled)
        return answer

    @staticmethod
    def _build(version: int, handled: frozenset[int]) -> ResponseBody:
        schema = response_module(ApiKey.API_VERSIONS, version)
        entries = tuple(
            build(schema.ApiVersion, api_key=key, min_version=low, max_version=high)
            for key, low, high in advertisement(handled)
        )
        response: ResponseBody = build(
            schema.ApiVersionsResponse,
            error_code=ErrorCode.none,
            api_keys=entries,
            throttle_time=NO_THROTTLE,
        )
        return response
