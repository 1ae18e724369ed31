"""File-system steps the storage layer repeats: making a rename durable."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir"]


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so that files created, renamed or removed in it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
