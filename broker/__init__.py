"""Gregor's broker: a Kafka-compatible broker in Python.

Layers, from the wire inwards: `protocol` (sans-io codec), then — as they land — the server,
the API handlers, the replica manager and the storage engine (see DESIGN.md).
"""

__version__ = "0.1.0"
