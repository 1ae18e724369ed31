"""The golden captures' contract: what the capture script produces, how its files are named, and
what every capture must satisfy. Shared by `tests.golden.capture`, the unit test over the
committed captures and the integration test that captures live.

Files are named `<NNN>-<ApiName>-v<version>[-<variant>].bin`. The variant tells apart bodies
of one API version worth keeping separately: a Produce's codec; whether a Metadata names topics
(`topics`), asks for none (`no-topics`) or for all (`all-topics`).

A capture decodes through `broker.protocol.decode_request` to the API, version and variant its
file name says. A Produce capture's record batches pass their CRC, use its codec, and hold
exactly the record the capture script produced. Each client's captures start with ApiVersions
and include a Metadata naming topics, FindCoordinator, JoinGroup and a Produce for every codec.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.protocol import ApiKey, Codec, ProtocolError, decode_request
from broker.protocol.records import Record, iter_batches, iter_records, validate_batch

__all__ = [
    "CLIENTS",
    "CODECS",
    "GOLDEN_DIR",
    "HEADERS",
    "KEY",
    "VALUE",
    "Golden",
    "api_name",
    "check_capture",
    "check_coverage",
    "file_name",
    "metadata_variant",
    "required_kinds",
    "topic_for",
]

GOLDEN_DIR = Path(__file__).parent
"""Captures live in GOLDEN_DIR/<client>/."""
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
KEY = b"golden-key"
VALUE = b"golden-value " * 8  # repetitive, so every codec has something to compress
HEADERS = (("golden-header", b"golden"), ("trace-id", b"0123456789abcdef"))

_REQUIRED = frozenset(
    {"ApiVersions", "Metadata-topics", "FindCoordinator", "JoinGroup"}
    | {f"Produce-{codec}" for codec in CODECS}
)
_REQUIRED_BY_CLIENT = {
    # kafka-python ≥ 3 is idempotent by default, so it asks for a producer id first.
    "kafka-python": frozenset({"InitProducerId"}),
}
_FILE_NAME = re.compile(
    r"(?P<index>\d{3})-(?P<api>[A-Za-z]+)-v(?P<version>\d+)(?:-(?P<variant>[a-z0-9-]+))?\.bin"
)


def topic_for(codec: str) -> str:
    """The topic that the producer using `codec` writes to."""
    return f"golden-{codec}"


def api_name(api_key: int) -> str:
    """Kafka's name for an API, as in the file names: `ApiVersions` for API key 18."""
    try:
        return "".join(word.capitalize() for word in ApiKey(api_key).name.split("_"))
    except ValueError:
        return f"ApiKey{api_key}"


def file_name(index: int, api_key: int, version: int, variant: str | None) -> str:
    suffix = f"-{variant}" if variant else ""
    return f"{index:03d}-{api_name(api_key)}-v{version}{suffix}.bin"


def metadata_variant(topics: Sequence[Any] | None) -> str:
    """The variant of a Metadata request with these `topics`."""
    if topics is None:
        return "all-topics"
    return "topics" if topics else "no-topics"


_API_KEYS = {api_name(key): key for key in ApiKey}


@dataclass(frozen=True)
class Golden:
    """What a capture's file name says about it."""

    path: Path
    index: int
    api_key: ApiKey
    version: int
    variant: str | None

    @classmethod
    def parse(cls, path: Path) -> Golden:
        match = _FILE_NAME.fullmatch(path.name)
        if match is None:
            raise AssertionError(f"{path}: not named <NNN>-<ApiName>-v<version>[-<variant>].bin")
        if match["api"] not in _API_KEYS:
            raise AssertionError(f"{path}: {match['api']} is not the name of a Kafka API")
        return cls(
            path=path,
            index=int(match["index"]),
            api_key=_API_KEYS[match["api"]],
            version=int(match["version"]),
            variant=match["variant"],
        )

    @property
    def kind(self) -> str:
        """The API's name and the variant, if any: `Produce-gzip`, `JoinGroup`."""
        name = api_name(self.api_key)
        return f"{name}-{self.variant}" if self.variant else name


def check_capture(path: Path) -> None:
    """Assert that one capture decodes as its name says, and holds the expected record."""
    golden = Golden.parse(path)
    try:
        request = decode_request(path.read_bytes())
    except ProtocolError as exc:
        raise AssertionError(f"{path}: does not decode: {exc}") from exc
    header = request.header
    if (header.api_key, header.api_version) != (golden.api_key, golden.version):
        raise AssertionError(
            f"{path}: decodes as API key {header.api_key} v{header.api_version}, "
            f"not {golden.api_key.name} v{golden.version}"
        )
    body: Any = request.body
    if golden.api_key == ApiKey.PRODUCE:
        _check_produce(golden, body)
    elif golden.api_key == ApiKey.METADATA:
        if golden.variant != metadata_variant(body.topics):
            raise AssertionError(f"{path}: asks for {metadata_variant(body.topics)}")
    elif golden.variant is not None:
        raise AssertionError(f"{path}: only Produce and Metadata captures have variants")


def _check_produce(golden: Golden, body: Any) -> None:
    path, codec = golden.path, golden.variant
    if codec not in CODECS:
        raise AssertionError(f"{path}: a Produce capture must name one of the codecs {CODECS}")
    records: list[Record] = []
    for topic in body.topic_data:
        if topic.name != topic_for(codec):
            raise AssertionError(f"{path}: produces to {topic.name!r}, not {topic_for(codec)!r}")
        for partition in topic.partition_data:
            data = partition.records
            where = f"{path}: {topic.name}[{partition.index}]"
            if not data:
                raise AssertionError(f"{where}: no record batches")
            try:
                for position, batch in iter_batches(data):
                    validate_batch(data, position)
                    if batch.codec is not Codec[codec.upper()]:
                        raise AssertionError(
                            f"{where}: the batch at byte {position} uses {batch.codec.name}, "
                            f"not {codec}"
                        )
                    records.extend(iter_records(data, position))
            except ProtocolError as exc:
                raise AssertionError(f"{where}: {exc}") from exc
    produced = [(record.key, record.value, record.headers) for record in records]
    if produced != [(KEY, VALUE, HEADERS)]:
        raise AssertionError(f"{path}: records {produced}, expected one {(KEY, VALUE, HEADERS)}")


def required_kinds(client: str) -> frozenset[str]:
    """The `Golden.kind`s a client's captures must include."""
    return _REQUIRED | _REQUIRED_BY_CLIENT.get(client, frozenset())


def check_coverage(directory: Path, client: str) -> None:
    """Assert that a client's captures include every kind of request it must send."""
    goldens = sorted((Golden.parse(path) for path in directory.glob("*.bin")), key=_index)
    missing = required_kinds(client) - {golden.kind for golden in goldens}
    if missing:
        raise AssertionError(f"{directory}: no capture of {sorted(missing)}")
    if goldens[0].api_key != ApiKey.API_VERSIONS:
        raise AssertionError(f"{directory}: the first capture is {goldens[0].path.name}")


def _index(golden: Golden) -> int:
    return golden.index
