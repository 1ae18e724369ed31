"""File-system steps the storage layer repeats: making a file or a rename durable."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file"]


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so that files created, renamed or removed in it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync a file written earlier (by path, from any thread), unless it is gone by now:
    deleted or renamed away meanwhile, it no longer needs to be durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
