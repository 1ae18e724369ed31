"""The metadata log's entries as Kafka record batches: how they sit on disk, in `.checkpoint`
files and in Fetch responses, in the layout Kafka's own tools read (KIP-595, KIP-630).

An entry is one record, and a proposal is one batch (KRaft's atomic append): a batch is
written, checked and fetched whole, so a torn write or a cut-short fetch never leaves part of a
proposal. Its partition leader epoch is its entries' epoch; the leader's first entry of an
epoch is a control batch holding a LeaderChangeMessage (control type 2), as KRaft writes it.
A snapshot is a records file that starts with a SnapshotHeaderRecord control batch (type 3)
and ends with a SnapshotFooterRecord (type 4), with the state machine's records between.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from broker.protocol.errors import MalformedInput
from broker.protocol.primitives import Buffer, write_uvarint
from broker.protocol.records import Record, build_batch, iter_batches, iter_records
from broker.raft import Entry

__all__ = [
    "decode_entries",
    "encode_entries",
    "read_snapshot",
    "write_snapshot",
]

LEADER_CHANGE = 2
SNAPSHOT_HEADER = 3
SNAPSHOT_FOOTER = 4

_CONTROL_KEY = struct.Struct(">hh")
_MAX_RECORDS_PER_BATCH = 1000


def _control_key(kind: int) -> bytes:
    return _CONTROL_KEY.pack(0, kind)


def _leader_change(leader: int, voters: Sequence[int]) -> bytes:
    """LeaderChangeMessage v0: Version, LeaderId, Voters, GrantingVoters (flexible)."""
    members = write_uvarint(len(voters) + 1) + b"".join(
        struct.pack(">i", voter) + b"\x00" for voter in voters
    )
    return struct.pack(">hi", 0, leader) + members + members + b"\x00"


def encode_entries(
    first_offset: int,
    entries: Sequence[Entry],
    *,
    now_ms: int,
    leader: int = -1,
    voters: Sequence[int] = (),
) -> bytes:
    """`entries`, the first at `first_offset`, as batches: one per proposal (the entries up
    to one that is not `continued`, or to the end), one control batch per control entry."""
    out = bytearray()
    start = 0
    while start < len(entries):
        first = entries[start]
        if first.control:
            record = Record(
                first_offset + start, now_ms, _control_key(LEADER_CHANGE),
                _leader_change(leader, voters),
            )  # fmt: skip
            out += build_batch([record], partition_leader_epoch=first.epoch, is_control=True)
            start += 1
            continue
        end = start + 1
        while (
            end < len(entries)
            and entries[end - 1].continued
            and entries[end].epoch == first.epoch
            and not entries[end].control
        ):
            end += 1
        records = [
            Record(first_offset + i, now_ms, None, entries[i].payload) for i in range(start, end)
        ]
        out += build_batch(records, partition_leader_epoch=first.epoch)
        start = end
    return bytes(out)


def decode_entries(data: Buffer) -> Iterator[tuple[int, Entry]]:
    """Each record of `data` (whole batches, CRCs checked) as an entry, with its offset; the
    records of a batch are one proposal (each but the last `continued`)."""
    for position, header in iter_batches(data):
        last = header.last_offset
        for record in iter_records(data, position):
            if header.is_control:
                yield record.offset, Entry(header.partition_leader_epoch, b"", control=True)
            else:
                entry = Entry(
                    header.partition_leader_epoch,
                    record.value or b"",
                    continued=record.offset < last,
                )
                yield record.offset, entry


def write_snapshot(
    payloads: Iterable[bytes], *, end_offset: int, epoch: int, last_timestamp: int, now_ms: int
) -> bytes:
    """A `.checkpoint` file's bytes: header, the state machine's records, footer. Offsets run
    from `end_offset` (Kafka numbers a snapshot's records after the log it replaces)."""
    header = struct.pack(">hq", 0, last_timestamp) + b"\x00"
    out = bytearray(
        build_batch(
            [Record(end_offset, now_ms, _control_key(SNAPSHOT_HEADER), header)], is_control=True
        )
    )
    offset = end_offset
    batch: list[Record] = []
    for payload in payloads:
        batch.append(Record(offset, now_ms, None, payload))
        offset += 1
        if len(batch) == _MAX_RECORDS_PER_BATCH:
            out += build_batch(batch, partition_leader_epoch=epoch)
            batch = []
    if batch:
        out += build_batch(batch, partition_leader_epoch=epoch)
    footer = struct.pack(">h", 0) + b"\x00"
    out += build_batch(
        [Record(offset, now_ms, _control_key(SNAPSHOT_FOOTER), footer)], is_control=True
    )
    return bytes(out)


def read_snapshot(data: Buffer) -> list[bytes]:
    """The state machine's records of a `.checkpoint` file, checked whole: every CRC, a header
    first and a footer last (a file cut short is refused, never read in part)."""
    payloads: list[bytes] = []
    kinds: list[int] = []
    for position, header in iter_batches(data):
        for record in iter_records(data, position):
            if header.is_control:
                key = record.key or b""
                if len(key) != _CONTROL_KEY.size:
                    raise MalformedInput("control record key is not 4 bytes", where="snapshot")
                kinds.append(_CONTROL_KEY.unpack(key)[1])
            else:
                payloads.append(record.value or b"")
    if not kinds or kinds[0] != SNAPSHOT_HEADER or kinds[-1] != SNAPSHOT_FOOTER:
        raise MalformedInput("snapshot has no header or no footer", where="snapshot")
    return payloads
