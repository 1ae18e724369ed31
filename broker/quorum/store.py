"""What a member of the metadata quorum keeps on disk, in Kafka's layout under
`<metadata log dir>/__cluster_metadata-0/`:
- `quorum-state`: the election state (epoch, vote, leader) as Kafka's JSON, replaced atomically;
- the log: Kafka segments of the entries after the latest snapshot (see `batches`);
- `<20-digit end offset>-<10-digit epoch>.checkpoint`: snapshots (KIP-630), written whole to a
  `.checkpoint.part` file, fsynced, then renamed.

Every method is blocking file work: the driver calls them from a thread, in `Ready`'s order.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from broker.metadata.image import CLUSTER_METADATA_TOPIC
from broker.protocol.errors import MalformedInput
from broker.raft import ElectionState, Entry, RaftLog, Snapshot, SnapshotId
from broker.storage import Log, LogConfig, StorageError
from broker.storage.files import fsync_dir

from .batches import decode_entries, encode_entries, read_snapshot

__all__ = ["METADATA_TOPIC", "Persisted", "QuorumStore", "checkpoint_name"]

log = logging.getLogger(__name__)

METADATA_TOPIC = CLUSTER_METADATA_TOPIC
QUORUM_STATE = "quorum-state"
_CHECKPOINT = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")


def checkpoint_name(snapshot_id: SnapshotId) -> str:
    return f"{snapshot_id.end_offset:020d}-{snapshot_id.epoch:010d}.checkpoint"


@dataclass(frozen=True, slots=True)
class Persisted:
    """What a restart finds: the election state, the latest snapshot and the log after it."""

    election: ElectionState
    snapshot: Snapshot | None
    entries: list[Entry]


class QuorumStore:
    def __init__(
        self,
        log_dir: Path,
        voters: tuple[int, ...],
        *,
        segment_bytes: int,
        now_ms: int,
    ) -> None:
        self.directory = log_dir / f"{METADATA_TOPIC}-0"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._voters = voters
        self._state_path = self.directory / QUORUM_STATE
        # Snapshots bound this log, never time or size: retention is off.
        config = LogConfig(segment_bytes=segment_bytes, retention_ms=-1, retention_bytes=-1)
        # Read whole at every start, so recovery checks every batch.
        self._log = Log(self.directory, config, now_ms=now_ms, clean_shutdown=False)

    # -- restart ----------------------------------------------------------------------------

    def load(self, now_ms: int) -> Persisted:
        snapshot = self._latest_snapshot()
        start = 0 if snapshot is None else snapshot.id.end_offset
        entries: list[Entry] = []
        offsets: list[int] = []
        for segment, position, _ in self._log.batches():
            for offset, entry in decode_entries(segment.read_batch(position, _)):
                offsets.append(offset)
                entries.append(entry)
        log_start = offsets[0] if offsets else self._log.log_end_offset
        if snapshot is None and log_start > 0:
            raise StorageError(
                f"{self.directory}: the metadata log starts at offset {log_start} and no "
                "snapshot holds the entries before it"
            )
        if not self._continues(snapshot, log_start, offsets, entries):
            log.warning(
                "%s: the log does not continue snapshot %s (an install was cut short): dropping it",
                self.directory,
                snapshot.id if snapshot else None,
            )
            self._log.truncate_fully_and_start_at(start, now_ms)
            entries, offsets = [], []
        kept = [entry for offset, entry in zip(offsets, entries, strict=True) if offset >= start]
        return Persisted(self._read_election(), snapshot, kept)

    @staticmethod
    def _continues(
        snapshot: Snapshot | None, log_start: int, offsets: list[int], entries: list[Entry]
    ) -> bool:
        """Whether the log on disk carries on from `snapshot`: it starts at the snapshot's end,
        or holds the snapshot's last entry with the snapshot's epoch."""
        if snapshot is None or snapshot.id.end_offset == 0:
            return True
        last = snapshot.id.end_offset - 1
        if not offsets:
            return log_start == snapshot.id.end_offset
        if log_start == snapshot.id.end_offset:
            return True
        if not offsets[0] <= last <= offsets[-1]:
            return False
        return entries[last - offsets[0]].epoch == snapshot.id.epoch

    def _latest_snapshot(self) -> Snapshot | None:
        found: list[tuple[SnapshotId, Path]] = []
        for path in self.directory.iterdir():
            match = _CHECKPOINT.match(path.name)
            if match:
                found.append((SnapshotId(int(match[1]), int(match[2])), path))
            elif path.name.endswith(".checkpoint.part"):
                path.unlink()  # a snapshot whose writing was cut short
        if not found:
            return None
        snapshot_id, path = max(found)
        data = path.read_bytes()
        try:
            read_snapshot(data)
        except MalformedInput as exc:
            raise StorageError(f"{path}: not a readable snapshot: {exc}") from None
        return Snapshot(snapshot_id, data)

    def _read_election(self) -> ElectionState:
        try:
            state = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return ElectionState()
        except ValueError as exc:
            raise StorageError(
                f"{self._state_path}: not Kafka's quorum-state JSON: {exc}"
            ) from None

        recorded = state.get("currentVoters")
        if isinstance(recorded, list) and recorded:
            voters = sorted(int(voter.get("voterId", -1)) for voter in recorded)
            if voters != sorted(self._voters):
                # Kafka's QuorumState refuses this too: a static quorum's voters do not change
                # by editing the setting, and two voter sets would elect two leaders.
                raise StorageError(
                    f"controller.quorum.voters names voters {sorted(self._voters)}, but this "
                    f"node's metadata log belongs to a quorum of voters {voters} "
                    f"({self._state_path}): restore the setting, or start the node on empty "
                    "log dirs"
                )

        def node(key: str) -> int | None:
            value = int(state.get(key, -1))
            return None if value < 0 else value

        return ElectionState(int(state.get("leaderEpoch", 0)), node("votedId"), node("leaderId"))

    # -- what Ready asks for, in its order ---------------------------------------------------

    def save_election(self, election: ElectionState) -> None:
        state = {
            "clusterId": "",
            "leaderId": -1 if election.leader is None else election.leader,
            "leaderEpoch": election.epoch,
            "votedId": -1 if election.voted_for is None else election.voted_for,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": voter} for voter in self._voters],
            "data_version": 0,
        }
        tmp = self._state_path.with_name(QUORUM_STATE + ".tmp")
        with open(tmp, "w") as handle:
            json.dump(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._state_path)
        fsync_dir(self.directory)

    def save_snapshot(self, snapshot: Snapshot) -> None:
        path = self.directory / checkpoint_name(snapshot.id)
        part = path.with_name(path.name + ".part")
        with open(part, "wb") as handle:
            handle.write(snapshot.data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(part, path)
        fsync_dir(self.directory)

    def install(self, snapshot: Snapshot, now_ms: int) -> None:
        """A snapshot fetched from the leader replaces the whole log."""
        self.save_snapshot(snapshot)
        self._log.truncate_fully_and_start_at(snapshot.id.end_offset, now_ms)
        self._delete_snapshots_before(snapshot.id)

    def truncate(self, offset: int, log: RaftLog, now_ms: int, *, leader: int) -> None:
        """Drop the entries from `offset` on. Kafka's segments truncate at batch boundaries, so
        the entries of the last batch that are below `offset` are written again, from the
        core's `log` (which holds them: nothing below the high watermark is truncated)."""
        self._log.truncate_to(offset)
        end = self._log.log_end_offset
        if end >= offset:
            return
        if end < log.start_offset:
            # That batch began in what a snapshot holds: the log starts at the snapshot now.
            self._log.truncate_fully_and_start_at(log.start_offset, now_ms)
            end = log.start_offset
        self.append(end, log.read(end, offset - end), now_ms, leader=leader)

    def append(
        self,
        first_offset: int,
        entries: tuple[Entry, ...],
        now_ms: int,
        *,
        leader: int,
    ) -> None:
        if not entries:
            return
        if first_offset != self._log.log_end_offset:
            raise StorageError(
                f"{self.directory}: entries from {first_offset} cannot follow the log end "
                f"{self._log.log_end_offset}"
            )
        data = encode_entries(
            first_offset, entries, now_ms=now_ms, leader=leader, voters=self._voters
        )
        self._log.append_as_follower(data, now_ms=now_ms)

    def delete_before(self, offset: int, now_ms: int) -> None:
        """A snapshot ending at `offset` is on disk: the log below it and older snapshots go."""
        self._log.delete_records(min(offset, self._log.log_end_offset))
        for segment in self._log.delete_old_segments(now_ms):
            segment.delete()
        latest = self._latest_id()
        if latest is not None:
            self._delete_snapshots_before(latest)

    def flush(self, now_ms: int) -> None:
        self._log.flush(now_ms)

    def close(self, now_ms: int) -> None:
        self._log.close(now_ms)

    # -- helpers -----------------------------------------------------------------------------

    def _latest_id(self) -> SnapshotId | None:
        ids = [
            SnapshotId(int(m[1]), int(m[2]))
            for m in (_CHECKPOINT.match(p.name) for p in self.directory.iterdir())
            if m
        ]
        return max(ids, default=None)

    def _delete_snapshots_before(self, keep: SnapshotId) -> None:
        for path in self.directory.iterdir():
            match = _CHECKPOINT.match(path.name)
            if match and SnapshotId(int(match[1]), int(match[2])) < keep:
                path.unlink()
