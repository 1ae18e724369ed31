"""Closing a kafka-python client for good: `close_kafka_python`.

kafka-python 3.0 closes a connection gracefully: while a request is still in the connection's
write buffer, the socket is closed only once the IO loop has sent it. A client's close() closes
its connections and then stops the IO loop; a request written in the loop's last turn (by its
IO thread, racing close()) is then never sent and its socket never closed. The socket stays
open in a reference cycle with its transport until a full garbage collection finalises it, in
whichever later test happens to be running: `ResourceWarning: unclosed <socket.socket ...
raddr=('127.0.0.1', <the broker's port>)>`, an error in this suite. Such a connection never
reports itself lost, so it is still in the client's table of connections afterwards.

The fix reads kafka-python's private attributes; a release without them (older, or one that
fixed the race) gets the plain close().
"""

from __future__ import annotations

from typing import Any

__all__ = ["close_kafka_python"]


def close_kafka_python(client: Any, *args: Any, **kwargs: Any) -> None:
    """`client.close(...)` for a kafka-python consumer, producer or admin client, then close
    the sockets of the connections it closed but left open (see the module docstring)."""
    client.close(*args, **kwargs)
    network = getattr(client, "_client", None) or getattr(
        getattr(client, "_sender", None), "_client", None
    )
    connections = getattr(getattr(network, "_manager", None), "_conns", {})
    for connection in list(connections.values()):
        transport = getattr(connection, "transport", None)
        sock = getattr(transport, "_sock", None)
        if sock is not None and getattr(transport, "_closed", False):
            sock.close()
