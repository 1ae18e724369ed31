"""Partitions hosted by this node: appends, reads and offsets over the storage engine.

What it owns: which logs exist (following the metadata image), high watermarks, waiting
fetches. What it must never do: decode requests or touch sockets (handlers do).
"""

from .fetcher import FetcherSettings, ReplicaFetchers
from .isr import IsrSender
from .manager import ReplicaManager
from .offsets import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
)
from .partition import AppendResult, FetchResult, OffsetResult, Partition

__all__ = [
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_PENDING_UPLOAD_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIERED_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "AppendResult",
    "FetchResult",
    "FetcherSettings",
    "IsrSender",
    "OffsetResult",
    "Partition",
    "ReplicaFetchers",
    "ReplicaManager",
]
