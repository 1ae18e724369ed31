"""Kafka's own message schemas, read for conformance tests.

The schemas are Apache Kafka's `clients/src/main/resources/common/message/*.json` and
`metadata/src/main/resources/common/metadata/*.json` (Apache-2.0), as its kafka-clients and
kafka-metadata jars carry them. They are never copied into this repository: by default they are
taken from the jars of the Kafka release the tests compare against, fetched from Maven Central
into the cache outside the repository (`tests.support.kafka_dist.protocol_schemas`), or read
from wherever the `GREGOR_KAFKA_SCHEMAS` environment variable points (a folder holding
`messages/` and `metadata-records/`). A missing folder is an error, never a reason to skip.

The format, as Kafka's generator reads it: JSON with whole-line `//` comments; a message has
`apiKey`, `type` (request, response, header or data), `validVersions`, `flexibleVersions`,
`fields` and optional `commonStructs`; a field has `name`, `type` (a primitive, `[]` + a
primitive, or a struct name, inline with `fields` or one of the `commonStructs`), `versions`,
and optional `nullableVersions`, `taggedVersions` + `tag`, `flexibleVersions`, `default`, ...
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tests.support import kafka_dist

__all__ = [
    "INT_RANGES",
    "NO_VERSIONS",
    "PRIMITIVES",
    "REPO_ROOT",
    "SCHEMAS_ENV",
    "FieldSpec",
    "MessageSpec",
    "SchemaError",
    "SchemasMissing",
    "Versions",
    "find_message",
    "load_message",
    "load_messages",
    "messages_dir",
    "parse_versions",
    "schemas_root",
    "strip_comments",
]

SCHEMAS_ENV = "GREGOR_KAFKA_SCHEMAS"
REPO_ROOT = Path(__file__).resolve().parent.parent

INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}
"""Range of each integer type on the wire."""

PRIMITIVES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "float64",
        "string",
        "bytes",
        "records",
        "uuid",
    }
)
"""Kafka's primitive field types; any other type name is a struct."""

_MAX_VERSION = 32767
"""Kafka versions are int16: "N+" means N up to Short.MAX_VALUE."""


class SchemasMissing(FileNotFoundError):
    """The Kafka schema folder is not where the tests look for it."""


class SchemaError(ValueError):
    """A schema file that does not parse the way Kafka's generator would read it."""


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range as Kafka writes it: "0-4", "3+", "5" or "none"."""

    low: int
    high: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.low, self.high + 1))

    @property
    def empty(self) -> bool:
        return self.low > self.high

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.high == _MAX_VERSION:
            return f"{self.low}+"
        return f"{self.low}-{self.high}" if self.low != self.high else str(self.low)


NO_VERSIONS = Versions(0, -1)

_RANGE = re.compile(r"(\d+)-(\d+)")
_OPEN = re.compile(r"(\d+)\+")
_SINGLE = re.compile(r"\d+")


def parse_versions(text: str) -> Versions:
    """Parse Kafka's version range syntax."""
    text = text.strip()
    if text == "none":
        return NO_VERSIONS
    if match := _RANGE.fullmatch(text):
        low, high = int(match[1]), int(match[2])
        if low > high:
            raise SchemaError(f"version range {text!r} is backwards")
        return Versions(low, high)
    if match := _OPEN.fullmatch(text):
        return Versions(int(match[1]), _MAX_VERSION)
    if _SINGLE.fullmatch(text):
        return Versions(int(text), int(text))
    raise SchemaError(f"not a version range: {text!r}")


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    type: str
    """As written in the schema: "int32", "[]string", "[]TopicData", "Assignment"."""
    versions: Versions
    nullable_versions: Versions
    tagged_versions: Versions
    tag: int | None
    flexible_versions: Versions | None
    """A field-level override of the message's flexible versions (RequestHeader.ClientId)."""
    default: str | None
    """The default as written ("-1", "null", "false"), None when the schema gives none."""
    ignorable: bool
    fields: tuple[FieldSpec, ...]
    """A struct's fields, whether inline or from `commonStructs`; empty for primitives."""

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def item_type(self) -> str:
        """The element type of an array, else the type itself."""
        return self.type.removeprefix("[]")

    @property
    def is_struct(self) -> bool:
        return self.item_type not in PRIMITIVES


@dataclass(frozen=True, slots=True)
class MessageSpec:
    path: Path
    name: str
    type: str
    """request, response, header or data."""
    api_key: int | None
    valid_versions: Versions
    flexible_versions: Versions
    fields: tuple[FieldSpec, ...]


def schemas_root() -> Path:
    """The schema folder: `$GREGOR_KAFKA_SCHEMAS`, else the pinned Kafka release's schemas,
    fetched from Maven Central on first use."""
    override = os.environ.get(SCHEMAS_ENV)
    if override:
        return Path(override)
    return kafka_dist.protocol_schemas()


def messages_dir(root: Path | None = None) -> Path:
    """The folder of message schemas under `root`; raises `SchemasMissing` naming the path."""
    root = schemas_root() if root is None else root
    folder = root / "messages"
    if not folder.is_dir():
        raise SchemasMissing(
            f"Kafka message schemas not found: {folder} is not a directory. Put Kafka's "
            f"clients/src/main/resources/common/message/*.json in {folder}, or unset "
            f"{SCHEMAS_ENV} to use the schemas of Kafka {kafka_dist.KAFKA_VERSION}'s jars."
        )
    if not any(folder.glob("*.json")):
        raise SchemasMissing(f"Kafka message schemas not found: {folder} holds no *.json files")
    return folder


def strip_comments(text: str) -> str:
    """Drop the whole-line `//` comments Kafka's schema files carry (they are not JSON)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def _str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise SchemaError(f"{where}: {key!r} must be a string, found {value!r}")
    return value


def _optional_versions(raw: Mapping[str, Any], key: str, where: str) -> Versions | None:
    if key not in raw:
        return None
    return parse_versions(_str(raw, key, where))


def _optional_tag(raw: Mapping[str, Any], where: str) -> int | None:
    tag = raw.get("tag")
    # Kafka's generator reads the tag with Jackson, which also takes a quoted number
    # (BrokerHeartbeatRequest.OfflineLogDirs has "tag": "0").
    if isinstance(tag, str) and tag.isdigit():
        return int(tag)
    if tag is None or (isinstance(tag, int) and not isinstance(tag, bool)):
        return tag
    raise SchemaError(f"{where}: 'tag' must be a number, found {tag!r}")


def _parse_field(
    raw: Mapping[str, Any], structs: Mapping[str, Mapping[str, Any]], where: str
) -> FieldSpec:
    name = _str(raw, "name", where)
    where = f"{where}.{name}"
    type_ = _str(raw, "type", where)
    tagged = _optional_versions(raw, "taggedVersions", where)
    tag = _optional_tag(raw, where)
    if (tag is None) != (tagged is None):
        raise SchemaError(f"{where}: 'tag' and 'taggedVersions' must come together")
    # Kafka's generator falls back to taggedVersions when a tagged field omits versions.
    versions = _optional_versions(raw, "versions", where) or tagged
    if versions is None:
        raise SchemaError(f"{where}: no 'versions'")
    field = FieldSpec(
        name=name,
        type=type_,
        versions=versions,
        nullable_versions=_optional_versions(raw, "nullableVersions", where) or NO_VERSIONS,
        tagged_versions=tagged or NO_VERSIONS,
        tag=tag,
        flexible_versions=_optional_versions(raw, "flexibleVersions", where),
        default=None if raw.get("default") is None else str(raw["default"]),
        ignorable=raw.get("ignorable") is True,
        fields=(),
    )
    if not field.is_struct:
        if "fields" in raw:
            raise SchemaError(f"{where}: a {type_} field cannot have fields")
        return field
    if "fields" in raw:
        struct_fields = raw["fields"]
    elif field.item_type in structs:
        struct_fields = structs[field.item_type]["fields"]
    else:
        raise SchemaError(f"{where}: struct type {field.item_type!r} has no fields anywhere")
    if not isinstance(struct_fields, list):
        raise SchemaError(f"{where}: 'fields' must be a list")
    return replace(field, fields=tuple(_parse_field(sub, structs, where) for sub in struct_fields))


def load_message(path: Path) -> MessageSpec:
    """Parse one schema file, resolving struct types through its `commonStructs`."""
    where = path.name
    try:
        raw = json.loads(strip_comments(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{where}: not JSON once comments are stripped: {exc}") from exc
    if not isinstance(raw, dict):
        raise SchemaError(f"{where}: not a JSON object")
    structs = {_str(s, "name", where): s for s in raw.get("commonStructs", [])}
    api_key = raw.get("apiKey")
    if not (api_key is None or isinstance(api_key, int)):
        raise SchemaError(f"{where}: apiKey must be an integer")
    name = _str(raw, "name", where)
    valid = parse_versions(_str(raw, "validVersions", where))
    # A removed API (Kafka 4's ControlledShutdown, "validVersions": "none") keeps only its
    # key and name: it has no flexible versions to name.
    flexible = _optional_versions(raw, "flexibleVersions", where)
    if flexible is None and not valid.empty:
        raise SchemaError(f"{where}: 'flexibleVersions' must be a string, found None")
    return MessageSpec(
        path=path,
        name=name,
        type=_str(raw, "type", where),
        api_key=api_key,
        valid_versions=valid,
        flexible_versions=flexible or NO_VERSIONS,
        fields=tuple(_parse_field(f, structs, name) for f in raw.get("fields", [])),
    )


def load_messages(root: Path | None = None) -> Mapping[str, MessageSpec]:
    """Every schema under `root` (default `schemas_root()`), by file stem."""
    return _load_messages(messages_dir(root))


@functools.cache
def _load_messages(folder: Path) -> Mapping[str, MessageSpec]:
    return {path.stem: load_message(path) for path in sorted(folder.glob("*.json"))}


def find_message(api_key: int, kind: str, root: Path | None = None) -> MessageSpec:
    """The request or response schema of an API key; raises `LookupError` naming the folder."""
    found = [
        spec
        for spec in load_messages(root).values()
        if spec.api_key == api_key and spec.type == kind
    ]
    if len(found) != 1:
        folder = messages_dir(root)
        names = ", ".join(spec.path.name for spec in found) or "none"
        raise LookupError(
            f"expected one {kind} schema with apiKey {api_key} in {folder}, found {names}"
        )
    return found[0]
