"""The memory of large request frames, handled on a thread of its own (ADR 0012).

A frame of `GATHER_BYTES` or more is read straight into an anonymous mapping of its own
(`FrameReader.gather`). Two things about that memory cost the event loop dearly when done there:
faulting its pages in as the bytes land (two fifths of the loop's time under a flood of 8 MiB
produces) and unmapping it once the request is answered (a tenth). Both happen here instead, on
one thread, in system calls that run without the GIL:

- `populate` faults in a range of pages ahead of the bytes with `madvise(MADV_POPULATE_WRITE)`,
  called through `ctypes` (which drops the GIL; `mmap.madvise` holds it). Linux 5.14 and later;
  elsewhere the call fails, is ignored, and the pages fault in on the loop as before;
- `unmap` closes a buffer once nothing holds a view of it (`mmap.close` refuses otherwise, and
  the buffer then goes with its last view).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import mmap
from concurrent.futures import ThreadPoolExecutor

__all__ = ["populate", "unmap"]

_thread = ThreadPoolExecutor(1, thread_name_prefix="frame-memory")
_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def populate(buffer: mmap.mmap, start: int, end: int) -> asyncio.Future[None]:
    """Fault in the pages of `buffer[start:end]` (`start` on a page boundary) on the thread;
    done when they are. The bytes are left as they are: the loop may be reading into the same
    pages meanwhile."""
    return asyncio.get_running_loop().run_in_executor(_thread, _populate, buffer, start, end)


def unmap(buffer: object) -> None:
    """Have a request frame's buffer (the `obj` of the frame's view, once the caller holds no
    view of it) unmapped on the thread; anything but a mapping is left alone."""
    if isinstance(buffer, mmap.mmap):
        _thread.submit(_unmap, buffer)


def _populate(buffer: mmap.mmap, start: int, end: int) -> None:
    pages = (ctypes.c_char * (end - start)).from_buffer(buffer, start)
    try:
        _libc.madvise(ctypes.addressof(pages), end - start, _MADV_POPULATE_WRITE)
    finally:
        del pages  # the buffer must have no exports left when it is released


def _unmap(buffer: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):
        buffer.close()
