"""API handlers, one module per API family: a decoded request and a context in, a response
body out. Handlers hold no sockets; they read and change the node's state."""

from __future__ import annotations

from broker.protocol import ApiKey
from broker.server import Dispatcher, Handler

from . import api_versions, metadata
from .context import NodeState

__all__ = ["NodeState", "build_dispatcher"]


def build_dispatcher(state: NodeState) -> Dispatcher:
    """Every handler the node has; ApiVersions advertises exactly these APIs."""
    handlers: dict[int, Handler] = {}
    dispatcher = Dispatcher(handlers, error_responders={ApiKey.METADATA: metadata.error_response})
    handlers[ApiKey.API_VERSIONS] = api_versions.Handler(lambda: dispatcher.handled_api_keys)
    handlers[ApiKey.METADATA] = metadata.Handler(state)
    dispatcher.register(handlers)
    return dispatcher
