"""A partition directory's identity: the `partition.metadata` file with its topic id (KIP-516).

A topic name is not an identity: a topic deleted and created again has the same name and
new partitions, and a broker that was down meanwhile still holds the old directories under
that name. Kafka writes the topic id into each partition directory and treats a directory
whose id is not the metadata's as a stray; so does Gregor. The format is Kafka's, so that
its tools read it:

    version: 0
    topic_id: <the id in URL-safe base64, unpadded>

What it must never do: decide what a mismatch means (the log manager does) or read a clock.
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from .errors import StorageError
from .files import fsync_dir

__all__ = ["PARTITION_METADATA", "decode_uuid", "encode_uuid", "read_topic_id", "write_topic_id"]

PARTITION_METADATA = "partition.metadata"
_VERSION = 0


def encode_uuid(value: uuid.UUID) -> str:
    """Kafka's `Uuid.toString`: the 16 bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


def decode_uuid(text: str) -> uuid.UUID:
    """Kafka's `Uuid.fromString`; ValueError for anything that is not 16 bytes so encoded."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return uuid.UUID(bytes=raw)


def read_topic_id(directory: Path) -> uuid.UUID | None:
    """The topic id a partition directory was created for; None if it has no
    `partition.metadata` (a directory from before topic ids). A file that cannot be parsed
    raises StorageError, naming it: a directory of unknown identity is never served."""
    path = directory / PARTITION_METADATA
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    fields = {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in text.splitlines())
        if key.strip()
    }
    try:
        version = int(fields["version"])
        if version != _VERSION:
            raise ValueError(f"version {version} is not {_VERSION}")
        return decode_uuid(fields["topic_id"])
    except (KeyError, ValueError) as exc:
        raise StorageError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None


def write_topic_id(directory: Path, topic_id: uuid.UUID) -> None:
    """Write `partition.metadata` durably (a temporary file, fsynced, renamed into place, the
    directory fsynced), so that a crash leaves either no file or the whole one."""
    path = directory / PARTITION_METADATA
    temporary = path.with_name(PARTITION_METADATA + ".tmp")
    data = f"version: {_VERSION}\ntopic_id: {encode_uuid(topic_id)}\n".encode()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_dir(directory)
