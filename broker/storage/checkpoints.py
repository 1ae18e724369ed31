"""Kafka's checkpoint files: a version line, a count line, then one entry per line.

Used for `leader-epoch-checkpoint` (per partition: "epoch start_offset") and, per log dir,
`recovery-point-offset-checkpoint` and `log-start-offset-checkpoint` ("topic partition
offset"). Writes go to a temporary file that is fsynced and renamed over the old one, so a
crash leaves either the old or the new checkpoint, never half of one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from .files import fsync_dir

__all__ = [
    "read_checkpoint",
    "read_epoch_checkpoint",
    "read_offset_checkpoint",
    "write_checkpoint",
    "write_epoch_checkpoint",
    "write_offset_checkpoint",
]

_VERSION = 0


class CheckpointError(ValueError):
    """A checkpoint file that cannot be parsed; the message names the file and the line."""


def write_checkpoint(path: Path, entries: Iterable[Sequence[object]]) -> None:
    lines = [" ".join(str(field) for field in entry) for entry in entries]
    text = "\n".join([str(_VERSION), str(len(lines)), *lines]) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_checkpoint(path: Path, fields: int) -> list[list[str]]:
    """Entries of a checkpoint file, each split into `fields` strings; [] if it does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = text.splitlines()
    if len(lines) < 2:
        raise CheckpointError(f"{path}: expected a version and a count line")
    if lines[0].strip() != str(_VERSION):
        raise CheckpointError(f"{path}: unknown checkpoint version {lines[0]!r}")
    try:
        count = int(lines[1])
    except ValueError as exc:
        raise CheckpointError(f"{path}: bad entry count {lines[1]!r}") from exc
    entries = [line.split() for line in lines[2:] if line.strip()]
    if len(entries) != count:
        raise CheckpointError(f"{path}: says {count} entries, holds {len(entries)}")
    for number, entry in enumerate(entries, start=3):
        if len(entry) != fields:
            raise CheckpointError(f"{path}:{number}: expected {fields} fields, got {entry}")
    return entries


def write_epoch_checkpoint(path: Path, epochs: Iterable[tuple[int, int]]) -> None:
    write_checkpoint(path, epochs)


def read_epoch_checkpoint(path: Path) -> list[tuple[int, int]]:
    try:
        return [(int(e), int(o)) for e, o in read_checkpoint(path, 2)]
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc


def write_offset_checkpoint(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    write_checkpoint(path, ((t, p, o) for (t, p), o in sorted(offsets.items())))


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    try:
        return {(t, int(p)): int(o) for t, p, o in read_checkpoint(path, 3)}
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
