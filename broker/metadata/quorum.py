"""The metadata log: `__cluster_metadata-0`, a Raft log with (for now) a single voter.

With one voter the node elects itself at every start: it bumps the epoch in `quorum-state` and
fsyncs it before writing, so each leadership has its own epoch in the log, as in KRaft. A
record is committed once it is fsynced — the single-voter majority — and only committed
records reach the image. The multi-voter quorum (Vote, BeginQuorumEpoch, Fetch) extends this
class's `append`/`replay` rather than replacing it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from broker.protocol.records import Record, build_batch, iter_records
from broker.storage import Log, LogConfig

from .records import MetadataRecord, decode_record, encode_record

__all__ = ["METADATA_TOPIC", "MetadataLog"]

METADATA_TOPIC = "__cluster_metadata"
QUORUM_STATE = "quorum-state"


class MetadataLog:
    def __init__(self, log_dir: Path, node_id: int, *, now_ms: int) -> None:
        self.node_id = node_id
        directory = log_dir / f"{METADATA_TOPIC}-0"
        directory.mkdir(parents=True, exist_ok=True)
        self._state_path = directory / QUORUM_STATE
        previous = self._read_epoch()
        self.epoch = previous + 1
        self._write_state()
        # Replayed in full at every start, so recovery checks every batch.
        self._log = Log(directory, LogConfig(), now_ms=now_ms, clean_shutdown=False)

    def _read_epoch(self) -> int:
        try:
            state = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return 0
        return int(state.get("leaderEpoch", 0))

    def _write_state(self) -> None:
        state = {
            "clusterId": "",
            "leaderId": self.node_id,
            "leaderEpoch": self.epoch,
            "votedId": self.node_id,
            "appliedOffset": 0,
            "currentVoters": [{"voterId": self.node_id}],
            "data_version": 0,
        }
        tmp = self._state_path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            json.dump(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._state_path)

    @property
    def end_offset(self) -> int:
        return self._log.log_end_offset

    def append(self, records: Sequence[MetadataRecord], now_ms: int) -> int:
        """Write and commit `records` as one batch; returns the offset of the first."""
        batch = build_batch(
            [
                Record(offset=i, timestamp=now_ms, key=None, value=encode_record(r))
                for i, r in enumerate(records)
            ]
        )
        info = self._log.append_as_leader(batch, leader_epoch=self.epoch, now_ms=now_ms)
        self._log.flush(now_ms)
        return info.first_offset

    def replay(self) -> Iterator[tuple[int, MetadataRecord]]:
        """Every committed record with its offset, oldest first."""
        for segment, position, header in self._log.batches():
            for record in iter_records(segment.read_batch(position, header)):
                if record.value is not None:
                    yield record.offset, decode_record(record.value)

    def close(self, now_ms: int) -> None:
        self._log.close(now_ms)
