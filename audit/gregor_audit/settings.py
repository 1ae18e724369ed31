"""What one audit is asked to check, and the inputs a user writes for it (durations like `30d`,
Kafka client properties files).

What it owns: `AuditSettings`, and parsing durations and client properties files with errors
that name what is wrong. What it must never do: touch Spark, Kafka or the clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from broker.config import parse_properties

__all__ = [
    "DEFAULT_FUTURE_SKEW_MS",
    "AuditSettings",
    "InvalidSettings",
    "parse_duration",
    "read_properties",
]

DEFAULT_FUTURE_SKEW_MS = 3_600_000
"""Records stamped up to an hour ahead of the audit's clock are tolerated (clock skew)."""

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")


_SET_BY_THE_AUDIT = (
    "bootstrap.servers",
    # What Spark's Kafka source sets itself, and refuses.
    "group.id",
    "auto.offset.reset",
    "key.deserializer",
    "value.deserializer",
    "enable.auto.commit",
    "interceptor.classes",
)


class InvalidSettings(ValueError):
    """An audit's input that cannot be used; the message names it."""


def parse_duration(text: str, *, zero: bool = False) -> int:
    """`90m`, `1d`, `30d`, `1h30m`, `500ms` in milliseconds (units in lower case: `1M` is not a
    minute, nor a month). `zero`: whether `0s` is allowed."""
    compact = text.strip().replace(" ", "")
    if not compact or _DURATION.sub("", compact):
        raise InvalidSettings(
            f"{text!r} is not a duration: write a number and a unit (ms, s, m, h, d or w), "
            "as in 90m, 1d or 30d"
        )
    total = sum(int(number) * _UNITS_MS[unit] for number, unit in _DURATION.findall(compact))
    if total <= 0 and not zero:
        raise InvalidSettings(f"{text!r}: a duration must be longer than zero")
    return total


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file (Kafka's `--command-config`), read as the broker reads its own."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidSettings(f"cannot read the client properties {path}: {exc}") from exc
    return parse_properties(text)


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """One audit: which cluster, which topics, what bound, where the report goes."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    output: str
    """A directory, or a Hadoop-compatible URI (`s3a://…`): `summary.json` and Parquet detail."""
    max_age_ms: int | None = None
    """The bound records must not outlive; None: each topic's own `retention.ms` (delete
    policy) and `max.compaction.lag.ms` (compacted), what its configuration promises."""
    future_skew_ms: int = DEFAULT_FUTURE_SKEW_MS
    client_properties: Mapping[str, str] = field(default_factory=dict)
    """Kafka client properties (security): given to the Admin client and to Spark's reader."""
    timeout_ms: int = 30_000
    """How long a call to the cluster may take before the audit gives up on it."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise InvalidSettings("no bootstrap servers: give HOST:PORT of the Kafka cluster")
        if not self.topics:
            raise InvalidSettings("no topics to audit: name at least one")
        if self.max_age_ms is not None and self.max_age_ms <= 0:
            raise InvalidSettings(f"the maximum age must be positive, not {self.max_age_ms} ms")
        if self.future_skew_ms < 0:
            raise InvalidSettings(f"the future skew cannot be negative ({self.future_skew_ms})")
        for key in _SET_BY_THE_AUDIT:
            if key in self.client_properties:
                raise InvalidSettings(f"{key} cannot be set in the client properties")
