"""Sending a file region down a connection without copying it through Python.

The fast path calls `os.sendfile` on the socket itself while the transport's own buffer is
empty (so nothing it holds can be overtaken) and the socket takes the bytes at once — the common
case for a consumer that keeps up. What the socket cannot take yet goes through
`loop.sendfile`, which waits for the socket to drain. A transport without a plain socket (TLS)
gets the region's bytes read and written as usual.

Every failure to send is an `OSError`, which the connection answers by aborting (the frame's
length is already on the wire): `loop.sendfile` reports a peer that went away before it sent
a byte as `SendfileNotAvailableError`, a `RuntimeError`, and is translated here.
"""

from __future__ import annotations

import asyncio
import os
from typing import IO, cast

from broker.protocol.fetch import Region

__all__ = ["send_region"]


class RegionTruncated(OSError):
    """The file ended before the region did: the frame cannot be completed."""


async def send_region(transport: asyncio.Transport, region: Region) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        transport.write(region.read())
        return
    offset = region.position
    remaining = len(region)
    if transport.get_write_buffer_size() == 0:
        out = sock.fileno()
        while remaining:
            try:
                sent = os.sendfile(out, region.fd, offset, remaining)
            except BlockingIOError:
                break
            if sent == 0:
                raise RegionTruncated(f"file ended {remaining} bytes before the region's end")
            offset += sent
            remaining -= sent
    if remaining:
        loop = asyncio.get_running_loop()
        file = cast("IO[bytes]", _RegionFile(region))
        try:
            sent = await loop.sendfile(transport, file, offset, remaining, fallback=False)
        except asyncio.SendfileNotAvailableError as exc:
            # Segment files are regular files, which sendfile takes: the socket failed.
            raise ConnectionError(f"sending {remaining} bytes of a file region failed") from exc
        if sent < remaining:  # `loop.sendfile` stops quietly at the end of the file
            raise RegionTruncated(f"file ended {remaining - sent} bytes before the region's end")


class _RegionFile:
    """What `loop.sendfile` asks of a file object, over a region's descriptor."""

    mode = "rb"

    def __init__(self, region: Region) -> None:
        self._fd = region.fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int) -> int:
        return position
