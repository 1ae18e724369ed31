"""ApiVersions: the APIs this node has handlers for, at the versions in the version table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.protocol import ApiKey, ErrorCode, ResponseBody, advertised, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE

__all__ = ["Handler"]


class Handler:
    def __init__(self, handled: Callable[[], frozenset[int]]) -> None:
        self._handled = handled

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.API_VERSIONS, version)
        entries = tuple(
            build(schema.ApiVersion, api_key=key, min_version=r.min, max_version=r.max)
            for key, r in sorted(advertised(self._handled()).items())
        )
        response: ResponseBody = build(
            schema.ApiVersionsResponse,
            error_code=ErrorCode.none,
            api_keys=entries,
            throttle_time=NO_THROTTLE,
        )
        return response
