"""The asyncio shell around the sans-io protocol: listeners, connections, dispatch.

What it owns: sockets, per-connection ordering and back-pressure, idle timeouts, the shutdown
order. What it must never do: interpret a request body; handlers do that.
"""

from .dispatcher import Dispatcher, Handler, RequestContext
from .server import BoundListener, BrokerServer

__all__ = ["BoundListener", "BrokerServer", "Dispatcher", "Handler", "RequestContext"]
