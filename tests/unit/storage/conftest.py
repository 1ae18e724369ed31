"""Fixtures of the storage tests; the helpers themselves are in `logs`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .logs import LogOpener


@pytest.fixture
def open_log(tmp_path: Path) -> Iterator[LogOpener]:
    """Open (and reopen) partition logs in `tmp_path/orders-0`; leftovers are closed at the end."""
    opener = LogOpener(tmp_path)
    yield opener
    opener.close_leftovers()


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The segment files (`.log`, `.index`, `.timeindex`) fsynced during the test."""
    synced: list[Path] = []
    real = os.fsync

    def spy(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.suffix in {".log", ".index", ".timeindex"}:
            synced.append(path)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced
