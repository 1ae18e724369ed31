"""The asyncio shell around the sans-io protocol: listeners, connections, dispatch.

What it owns: sockets, per-connection ordering and back-pressure, idle timeouts, the shutdown
order. What it must never do: interpret a request body; handlers do that.
"""

from .connection import parked
from .dispatcher import (
    BUILT_OFF_LOOP_ENTRIES,
    BuiltOffLoop,
    CloseConnection,
    Dispatcher,
    ErrorResponder,
    ForwardCheck,
    Handler,
    RequestContext,
    SendOn,
)
from .server import BoundListener, BrokerServer

__all__ = [
    "BUILT_OFF_LOOP_ENTRIES",
    "BoundListener",
    "BrokerServer",
    "BuiltOffLoop",
    "CloseConnection",
    "Dispatcher",
    "ErrorResponder",
    "ForwardCheck",
    "Handler",
    "RequestContext",
    "SendOn",
    "parked",
]
