"""A log dir's identity: its `meta.properties`, as Kafka's `kafka-storage format` writes it.

    version=1
    cluster.id=<the cluster's id>
    node.id=<the node's id>
    directory.id=<this directory's own id, URL-safe base64, KIP-858>

The cluster and node ids keep a node from serving another cluster's or another node's data;
the directory id tells a disk from its replacement. A volume replaced by an empty one and
formatted again gets a new directory id, so the cluster can tell that the replicas it assigned
to the old directory are gone, however the new one is named.

What it owns: reading, writing (atomically, fsynced) and checking the file. What it must
never do: decide whether a node may format (the node and `gregor format` do) or read a clock.

Formatting is explicit, as in Kafka: `gregor format` (`format_dirs`) formats a new node's dirs;
a node's start (`load_formatted`) refuses a metadata log dir that has no `meta.properties`,
since an empty one there is a new node's or a lost one's and only the operator of the node
can say which (Kafka's REQUIRE_METADATA_LOG_DIR). Its other empty log dirs are formatted at
start with a new directory id: a replaced JBOD disk comes back as a new directory, and the
controller takes the replicas it had on the old one as lost.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import StorageError
from .files import fsync_dir
from .partition_metadata import decode_uuid, encode_uuid

__all__ = [
    "META_PROPERTIES",
    "NOT_FORMATTED",
    "DirIdentity",
    "MetaProperties",
    "NotFormatted",
    "format_dirs",
    "load_formatted",
    "load_or_format",
    "new_directory_id",
    "read_meta_properties",
]

META_PROPERTIES = "meta.properties"
_VERSION = "1"
_RESERVED_IDS = 100
"""Kafka reserves the directory ids whose 16 bytes are 0 … 99 (UNASSIGNED, LOST, MIGRATING
and those to come); a directory never gets one."""


@dataclass(frozen=True, slots=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: uuid.UUID | None
    """None: written by a Gregor from before directory ids (given one at its next start)."""


NOT_FORMATTED = "is not formatted"
"""What a node says of a metadata log dir without `meta.properties` (the operator looks for it
in a pod's last words)."""


class NotFormatted(StorageError):
    """The metadata log dir has no `meta.properties`: a new node's, not formatted yet, or the
    replacement of a lost one."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(f"{log_dir} {NOT_FORMATTED} (it has no {META_PROPERTIES})")
        self.log_dir = log_dir


@dataclass(frozen=True, slots=True)
class DirIdentity:
    """What a node's log dirs say it is, once checked."""

    cluster_id: str
    directory_ids: dict[Path, uuid.UUID]
    """Each log dir's directory id (the metadata log dir's too, when it is a log dir)."""
    formatted: tuple[Path, ...] = ()
    """The empty log dirs this start formatted, each with a new directory id."""


def new_directory_id() -> uuid.UUID:
    while True:
        found = uuid.uuid4()
        if found.int >= _RESERVED_IDS:
            return found


def read_meta_properties(log_dir: Path) -> MetaProperties | None:
    """The dir's `meta.properties`; None if it has none. One that cannot be read raises
    StorageError naming it."""
    path = log_dir / META_PROPERTIES
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    entries = {
        key.strip(): value.strip()
        for key, sep, value in (line.partition("=") for line in text.splitlines())
        if sep and not key.lstrip().startswith("#")
    }
    try:
        directory = entries.get("directory.id")
        return MetaProperties(
            cluster_id=entries["cluster.id"],
            node_id=int(entries["node.id"]),
            directory_id=None if directory is None else decode_uuid(directory),
        )
    except (KeyError, ValueError) as exc:
        raise StorageError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None


def _write(log_dir: Path, meta: MetaProperties) -> None:
    assert meta.directory_id is not None
    path = log_dir / META_PROPERTIES
    temporary = path.with_name(META_PROPERTIES + ".tmp")
    text = (
        f"version={_VERSION}\ncluster.id={meta.cluster_id}\nnode.id={meta.node_id}\n"
        f"directory.id={encode_uuid(meta.directory_id)}\n"
    )
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_dir(log_dir)


def _empty(log_dir: Path) -> bool:
    return not any(p.name not in (".lock", META_PROPERTIES + ".tmp") for p in log_dir.iterdir())


def format_dirs(
    log_dirs: Sequence[Path], cluster_id: str, node_id: int, *, ignore_formatted: bool = False
) -> list[Path]:
    """`gregor format` (Kafka's `kafka-storage format`): give each dir a `meta.properties`
    with the cluster id, the node id and a directory id of its own; returns the dirs it
    formatted. A dir formatted already is refused (StorageError) unless `ignore_formatted`,
    and then left as it is if it is this cluster's and this node's; a dir that holds anything
    else is never formatted."""
    formatted = []
    for log_dir in log_dirs:
        log_dir.mkdir(parents=True, exist_ok=True)
        found = read_meta_properties(log_dir)
        if found is not None:
            _check(log_dir, found, cluster_id, node_id)
            if not ignore_formatted:
                raise StorageError(
                    f"{log_dir} is formatted already (its {META_PROPERTIES} says cluster "
                    f"{found.cluster_id}, node {found.node_id}); use --ignore-formatted to "
                    "leave formatted dirs as they are"
                )
            continue
        if not _empty(log_dir):
            raise StorageError(f"{log_dir} is not empty and has no {META_PROPERTIES}")
        _write(log_dir, MetaProperties(cluster_id, node_id, new_directory_id()))
        formatted.append(log_dir)
    return formatted


def _check(log_dir: Path, found: MetaProperties, cluster_id: str | None, node_id: int) -> None:
    if cluster_id is not None and found.cluster_id != cluster_id:
        raise StorageError(
            f"{log_dir} belongs to cluster {found.cluster_id}, not {cluster_id}; refusing it"
        )
    if found.node_id != node_id:
        raise StorageError(
            f"{log_dir} belongs to node {found.node_id}, not node.id={node_id}; refusing it"
        )


def load_formatted(
    metadata_dir: Path, log_dirs: Sequence[Path], node_id: int, cluster_id: str | None = None
) -> DirIdentity:
    """A node's start (Kafka's REQUIRE_METADATA_LOG_DIR and REQUIRE_AT_LEAST_ONE_VALID): the
    metadata log dir must be formatted (NotFormatted otherwise); every formatted dir must be
    this node's and one cluster's (`cluster_id` if given, else the metadata log dir's); a dir
    formatted before directory ids is given one; an empty log dir is formatted with the
    cluster id and a new directory id. A dir with data and no `meta.properties`, and two dirs
    with one directory id (one copied from the other), are refused (StorageError)."""
    dirs = [metadata_dir, *(d for d in log_dirs if d != metadata_dir)]
    found = {d: meta for d in dirs if (meta := read_meta_properties(d)) is not None}
    anchor = found.get(metadata_dir)
    if anchor is None:
        raise NotFormatted(metadata_dir)
    for log_dir, meta in found.items():
        _check(log_dir, meta, cluster_id or anchor.cluster_id, node_id)
    ids: dict[Path, uuid.UUID] = {}
    formatted = []
    for log_dir in dirs:
        meta = found.get(log_dir)
        if meta is None:
            log_dir.mkdir(parents=True, exist_ok=True)
            if not _empty(log_dir):
                raise StorageError(f"{log_dir} is not empty and has no {META_PROPERTIES}")
            meta = MetaProperties(anchor.cluster_id, node_id, new_directory_id())
            _write(log_dir, meta)
            formatted.append(log_dir)
        elif meta.directory_id is None:
            meta = MetaProperties(meta.cluster_id, meta.node_id, new_directory_id())
            _write(log_dir, meta)
        assert meta.directory_id is not None
        ids[log_dir] = meta.directory_id
    if len(set(ids.values())) != len(ids):
        raise StorageError(
            "two log dirs have the same directory.id (one was copied from the other): "
            + ", ".join(str(d) for d in ids)
        )
    return DirIdentity(anchor.cluster_id, {d: ids[d] for d in log_dirs}, tuple(formatted))


def load_or_format(
    log_dirs: Sequence[Path], node_id: int, cluster_id: str | None, *, new_cluster_id: str
) -> DirIdentity:
    """`gregor format --ignore-formatted`, then a start, for a node that is new whenever its
    dirs are empty (`gregor local up`'s single node, a simulation's broker): the cluster id is
    `cluster_id`, else the one the formatted dirs have, else `new_cluster_id`. The first dir
    holds the metadata log."""
    clusters = {meta.cluster_id for d in log_dirs if (meta := read_meta_properties(d)) is not None}
    if len(clusters) > 1:
        raise StorageError(f"log dirs belong to different clusters: {sorted(clusters)}")
    chosen = cluster_id or next(iter(clusters), None) or new_cluster_id
    format_dirs(log_dirs, chosen, node_id, ignore_formatted=True)
    return load_formatted(log_dirs[0], log_dirs, node_id, chosen)
