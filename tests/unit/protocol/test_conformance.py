"""The message classes Gregor uses match Kafka's own schemas, field by field.

For every API version in `SUPPORTED` that Gregor decodes, request and response, the kio class
returned by `request_type` / `response_type` is compared with Kafka's schema (read from
the pinned Kafka release's jars by `tests.kafka_schemas`), recursively through nested structs
and commonStructs:
field names (under kio's naming rules below), order of the untagged fields (the wire order),
types, presence at the version, nullability at the version, tags, and flexibility. The request
header, which is our own codec, is checked against RequestHeader.json separately.

A missing schema folder, a supported API without a schema, or a supported version outside the
schema's validVersions is a failure, never a skip.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
import re
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest

from broker.protocol import (
    SUPPORTED,
    ApiKey,
    ErrorCode,
    RequestHeader,
    request_type,
    response_type,
)
from broker.protocol.headers import decode_request_header, encode_request_header
from broker.protocol.versions import is_decodable
from tests.kafka_schemas import (
    INT_RANGES,
    NO_VERSIONS,
    REPO_ROOT,
    SCHEMAS_ENV,
    FieldSpec,
    MessageSpec,
    SchemasMissing,
    find_message,
    load_messages,
    messages_dir,
    parse_versions,
    schemas_root,
)
from tests.support import kafka_dist

pytestmark = pytest.mark.unit

Kind = Literal["request", "response"]
KINDS: tuple[Kind, ...] = ("request", "response")

# ---------------------------------------------------------------------------------------------
# How kio (0.6.5) turns a schema field into a dataclass field. Each rule was read off kio's
# generated classes and is applied exactly; whatever the rules do not explain is a mismatch.
#
# 1. Names are snake_case (`kio_name`): a word starts at an upper-case letter that follows a
#    lower-case letter ("TopicId" → topic_id), and at the last capital of a run of capitals or
#    digits when a lower-case letter follows ("ISRReplicas" → isr_replicas); digits do not
#    start a word ("V3AndBelow" → v3_and_below). A name that shadows a Python builtin gets a
#    trailing underscore ("Type" → type_, "Id" → id_).
# 2. Durations: the int32/int64 fields named in DURATION_FIELDS lose their "Ms" suffix and
#    have kafka_type timedelta_i32/timedelta_i64 (ThrottleTimeMs → throttle_time).
# 3. Timestamps: the int64 fields named in TIMESTAMP_FIELDS lose their "Ms" suffix and have
#    kafka_type datetime_i64 (LogAppendTimeMs → log_append_time).
# 4. Error codes: the int16 fields named in ERROR_CODE_FIELDS have kafka_type error_code (kio's
#    ErrorCode enum). Other error fields (TopicConfigErrorCode) stay int16.
# 5. Every other primitive keeps its schema type as kafka_type; an array of primitives carries
#    its element type. Struct fields carry no kafka_type: their Python type is the nested
#    dataclass, named as in the schema, or tuple[Struct, ...] for an array.
# 6. A field is Optional (`X | None`) exactly when the schema makes it nullable at that
#    version, except where kio uses None as the Python spelling of a non-null wire value:
#    - uuid fields are always Optional: None is the all-zero UUID;
#    - datetime_i64 fields whose default is -1 are Optional: None is -1.
# 7. A field is in the class exactly at the versions in its `versions`; it has metadata "tag"
#    equal to its schema tag exactly at the versions in its `taggedVersions`.
# 8. Every class (message and nested) carries __version__, __api_key__ and __flexible__, the
#    last true exactly at the message's flexibleVersions.
# ---------------------------------------------------------------------------------------------

DURATION_FIELDS = frozenset(
    {
        "AcquisitionLockTimeoutMs",
        "ExpiryTimePeriodMs",
        "HeartbeatIntervalMs",
        "MaxLifetimeMs",
        "MaxWaitMs",
        "PushIntervalMs",
        "RebalanceTimeoutMs",
        "RenewPeriodMs",
        "RetentionTimeMs",
        "SessionLifetimeMs",
        "SessionTimeoutMs",
        "TaskOffsetIntervalMs",
        "ThrottleTimeMs",
        "TimeoutMs",
        "TransactionTimeoutMs",
        "timeoutMs",  # CreateTopicsRequest and DeleteTopicsRequest spell it with a small t.
    }
)
"""Rule 2: schema fields kio models as `datetime.timedelta` (every one kio 0.6.5 has)."""

TIMESTAMP_FIELDS = frozenset(
    {
        "ExpiryTimestampMs",
        "IssueTimestampMs",
        "LogAppendTimeMs",
        "MaxTimestampMs",
        "TransactionStartTimeMs",
    }
)
"""Rule 3: schema fields kio models as `datetime.datetime` (every one kio 0.6.5 has)."""

ERROR_CODE_FIELDS = frozenset({"ErrorCode", "PartitionErrorCode"})
"""Rule 4: schema fields kio models as `ErrorCode`."""

WIRE_TYPE = {
    "timedelta_i32": "int32",
    "timedelta_i64": "int64",
    "datetime_i64": "int64",
    "error_code": "int16",
}
"""kio's richer kafka_types and the schema type that is on the wire for each."""

_PYTHON_TYPE: Mapping[str, type] = {
    "bool": bool,
    "float64": float,
    "string": str,
    "bytes": bytes,
    "records": bytes,
    "uuid": uuid.UUID,
    "error_code": ErrorCode,
    "timedelta_i32": datetime.timedelta,
    "timedelta_i64": datetime.timedelta,
    "datetime_i64": datetime.datetime,
}

_WORD_START = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])")


def kio_name(schema_name: str) -> str:
    """Rules 1–3: the dataclass field name kio gives a schema field."""
    if schema_name in DURATION_FIELDS | TIMESTAMP_FIELDS:
        schema_name = schema_name.removesuffix("Ms")
    name = _WORD_START.sub("_", schema_name).lower()
    return f"{name}_" if name in dir(builtins) else name


def kio_kafka_type(field: FieldSpec) -> str:
    """Rules 2–5: the kafka_type kio gives a primitive field (or array element)."""
    wire = field.item_type
    if field.name in DURATION_FIELDS and wire in ("int32", "int64"):
        return f"timedelta_i{wire.removeprefix('int')}"
    if field.name in TIMESTAMP_FIELDS and wire == "int64":
        return "datetime_i64"
    if field.name in ERROR_CODE_FIELDS and wire == "int16":
        return "error_code"
    return wire


def kio_optional(field: FieldSpec, version: int) -> bool:
    """Rule 6: whether kio's Python type for the field admits None."""
    if field.type == "uuid":
        return True
    if kio_kafka_type(field) == "datetime_i64" and field.default == "-1":
        return True
    return version in field.nullable_versions


def test_naming_rules() -> None:
    """The examples the rules above are documented with."""
    assert kio_name("TopicId") == "topic_id"
    assert kio_name("ISRReplicas") == "isr_replicas"
    assert kio_name("V3AndBelow") == "v3_and_below"
    assert kio_name("Type") == "type_"
    assert kio_name("ThrottleTimeMs") == "throttle_time"
    assert kio_name("timeoutMs") == "timeout"
    assert kio_name("LogAppendTimeMs") == "log_append_time"
    assert kio_name("CommitTimestamp") == "commit_timestamp"


# ---------------------------------------------------------------------------------------------
# Differences between kio and Kafka's schemas that are known and accepted, each with the
# reason. The test fails on any difference not listed here, and on any listed one that no
# longer occurs.
# ---------------------------------------------------------------------------------------------

ACCEPTED: Mapping[tuple[ApiKey, int, Kind], Mapping[str, str]] = {}
"""(api key, version, request|response) → {difference, exactly as reported: one-line reason}.

Empty: kio 0.6.5 (generated from a Kafka 4.1-era tree) agrees with Kafka 4.3.1's schemas at
every version in SUPPORTED. Outside that range they differ, e.g. VoteRequest v0–v1
(Candidate* fields renamed Replica* upstream) and ListClientMetricsResources (renamed
ListConfigResources, KIP-1142); add an entry here only with the reason it is harmless.
"""


# ---------------------------------------------------------------------------------------------
# The comparison.
# ---------------------------------------------------------------------------------------------


def _split_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = typing.get_args(annotation)
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return rest[0], True
    return annotation, False


def _split_array(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0], True
    return annotation, False


def _primitive_problem(kafka_type: str, python_type: Any) -> str | None:
    """Whether kio's Python type can hold the kafka_type's values (kio checks this at runtime)."""
    if not isinstance(python_type, type):
        return f"Python type {python_type!r} is not a class"
    if kafka_type in INT_RANGES:
        bounds = (getattr(python_type, "__low__", None), getattr(python_type, "__high__", None))
        if not issubclass(python_type, int) or bounds != INT_RANGES[kafka_type]:
            return f"Python type {python_type.__name__} is not a {kafka_type}"
        return None
    expected = _PYTHON_TYPE.get(kafka_type)
    if expected is None:
        return f"unknown kafka_type {kafka_type!r}"
    if not issubclass(python_type, expected):
        return f"Python type {python_type.__name__} is not a {expected.__name__}"
    return None


def _compare_class(
    cls: type[Any],
    fields: Sequence[FieldSpec],
    *,
    api_key: int,
    version: int,
    flexible: bool,
    path: str,
) -> Iterator[str]:
    """Every difference between a kio class and the schema fields it models, at one version."""
    class_vars = (
        getattr(cls, "__version__", None),
        getattr(cls, "__api_key__", None),
        getattr(cls, "__flexible__", None),
    )
    if class_vars != (version, api_key, flexible):
        yield (
            f"{path}: kio {cls.__name__} has (__version__, __api_key__, __flexible__) = "
            f"{class_vars}, expected {(version, api_key, flexible)}"
        )
    hints = typing.get_type_hints(cls)
    kio_fields = {f.name: f for f in dataclasses.fields(cls)}
    present = [f for f in fields if version in f.versions]
    expected_names = {kio_name(f.name): f for f in present}

    for name in kio_fields.keys() - expected_names.keys():
        yield f"{path}: kio field {name!r} is not in the schema at v{version}"
    for name, spec in expected_names.items():
        if name not in kio_fields:
            yield f"{path}.{spec.name}: in the schema at v{version}, missing from kio ({name!r})"

    untagged_kio = [
        name for name, f in kio_fields.items() if name in expected_names and "tag" not in f.metadata
    ]
    untagged_schema = [
        name
        for name, spec in expected_names.items()
        if name in kio_fields and "tag" not in kio_fields[name].metadata
    ]
    if untagged_kio != untagged_schema:
        yield f"{path}: untagged fields in kio order {untagged_kio}, schema order {untagged_schema}"

    for name, spec in expected_names.items():
        if name in kio_fields:
            yield from _compare_field(
                kio_fields[name],
                hints[name],
                spec,
                api_key=api_key,
                version=version,
                flexible=flexible,
                path=f"{path}.{spec.name}",
            )


def _compare_field(
    field: dataclasses.Field[Any],
    annotation: Any,
    spec: FieldSpec,
    *,
    api_key: int,
    version: int,
    flexible: bool,
    path: str,
) -> Iterator[str]:
    expected_tag = spec.tag if version in spec.tagged_versions else None
    tag = field.metadata.get("tag")
    if tag != expected_tag:
        yield f"{path}: tag {tag} in kio, {expected_tag} in the schema at v{version}"
    if spec.flexible_versions is not None and (version in spec.flexible_versions) != flexible:
        yield f"{path}: field-level flexibleVersions {spec.flexible_versions} is not modelled"

    inner, optional = _split_optional(annotation)
    expected_optional = kio_optional(spec, version)
    if optional != expected_optional:
        nullable = "nullable" if version in spec.nullable_versions else "not nullable"
        yield (
            f"{path}: {'Optional' if optional else 'not Optional'} in kio ({annotation}), "
            f"{nullable} in the schema at v{version}"
        )
    element, is_array = _split_array(inner)
    if is_array != spec.is_array:
        yield f"{path}: {spec.type} in the schema, {inner} in kio"
        return
    element, element_optional = _split_optional(element)
    if element_optional and not (is_array and spec.item_type == "uuid"):
        yield f"{path}: kio array elements are Optional ({inner})"

    kafka_type = field.metadata.get("kafka_type")
    if spec.is_struct:
        if kafka_type is not None:
            yield f"{path}: struct {spec.type} has kafka_type {kafka_type!r} in kio"
        if not (isinstance(element, type) and dataclasses.is_dataclass(element)):
            yield f"{path}: struct {spec.type} in the schema, {element!r} in kio"
            return
        if element.__name__ != spec.item_type:
            yield f"{path}: struct {spec.item_type} in the schema, {element.__name__} in kio"
        yield from _compare_class(
            element,
            spec.fields,
            api_key=api_key,
            version=version,
            flexible=flexible,
            path=f"{path}[]" if is_array else path,
        )
        return

    expected_type = kio_kafka_type(spec)
    if kafka_type != expected_type:
        wire = WIRE_TYPE.get(str(kafka_type), kafka_type)
        yield (
            f"{path}: kafka_type {kafka_type!r} (wire {wire}) in kio, {spec.type} in the "
            f"schema (kio's rules give {expected_type!r})"
        )
    elif problem := _primitive_problem(expected_type, element):
        yield f"{path}: {problem}"


def schema_differences(spec: MessageSpec, cls: type[Any], version: int) -> list[str]:
    """Every difference between the kio class of a message version and its schema."""
    problems: list[str] = []
    flexible = version in spec.flexible_versions
    if cls.__name__ != spec.name:
        problems.append(f"{spec.name}: kio class is {cls.__name__}")
    problems.extend(
        _compare_class(
            cls,
            spec.fields,
            api_key=typing.cast(int, spec.api_key),
            version=version,
            flexible=flexible,
            path=spec.name,
        )
    )
    return problems


# ---------------------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------------------

CASES = [
    pytest.param(api_key, version, kind, id=f"{api_key.name}-v{version}-{kind}")
    for api_key, versions in SUPPORTED.items()
    for version in versions
    if is_decodable(api_key, version)
    for kind in KINDS
]


def _schema(api_key: ApiKey, kind: Kind, root: Path | None = None) -> MessageSpec:
    """The schema, or a test failure naming what is missing where."""
    try:
        return find_message(api_key, kind, root)
    except (SchemasMissing, LookupError) as exc:
        problem = f"{api_key.name} {kind}: {exc}"
    pytest.fail(problem, pytrace=False)


def check_conformance(api_key: ApiKey, version: int, kind: Kind, root: Path | None = None) -> None:
    """Fail unless the kio class of the message version matches its schema under `root`."""
    spec = _schema(api_key, kind, root)
    if version not in spec.valid_versions:
        pytest.fail(
            f"{api_key.name} v{version} is supported, but {spec.path} has validVersions "
            f"{spec.valid_versions}",
            pytrace=False,
        )
    cls = (request_type if kind == "request" else response_type)(api_key, version)
    problems = set(schema_differences(spec, cls, version))
    accepted = ACCEPTED.get((api_key, version, kind), {})
    unexpected = sorted(problems - accepted.keys())
    stale = sorted(accepted.keys() - problems)
    assert not unexpected, f"kio differs from {spec.path} at v{version}:\n" + "\n".join(unexpected)
    assert not stale, "accepted differences that no longer occur:\n" + "\n".join(stale)


@pytest.mark.parametrize(("api_key", "version", "kind"), CASES)
def test_message_matches_kafka_schema(api_key: ApiKey, version: int, kind: Kind) -> None:
    check_conformance(api_key, version, kind)


# The comparison itself must notice each kind of difference: each case below alters the real
# schema in one way and expects the difference to be reported.


def _alter(
    fields: tuple[FieldSpec, ...], path: Sequence[str], **changes: Any
) -> tuple[FieldSpec, ...]:
    """`fields` with the field at `path` (schema names, through structs) changed."""
    head, *rest = path
    if head not in {f.name for f in fields}:
        raise KeyError(f"no field {head!r}")
    return tuple(
        (replace(f, fields=_alter(f.fields, rest, **changes)) if rest else replace(f, **changes))
        if f.name == head
        else f
        for f in fields
    )


def _tagged_field(name: str, tag: int) -> FieldSpec:
    since = parse_versions("12+")
    return FieldSpec(
        name=name,
        type="int32",
        versions=since,
        nullable_versions=NO_VERSIONS,
        tagged_versions=since,
        tag=tag,
        flexible_versions=None,
        default=None,
        ignorable=True,
        fields=(),
    )


def _swap_first_two(spec: MessageSpec) -> MessageSpec:
    return replace(spec, fields=(spec.fields[1], spec.fields[0], *spec.fields[2:]))


_METADATA = SUPPORTED[ApiKey.METADATA].max
"""The version the alterations of Metadata are compared at (each test compares the newest)."""

_ALTERATIONS: list[tuple[str, ApiKey, Callable[[MessageSpec], MessageSpec], str]] = [
    (
        "not-nullable",
        ApiKey.METADATA,
        lambda s: replace(
            s, fields=_alter(s.fields, ["Brokers", "Rack"], nullable_versions=NO_VERSIONS)
        ),
        "MetadataResponse.Brokers[].Rack: Optional in kio",
    ),
    (
        "nullable",
        ApiKey.METADATA,
        lambda s: replace(
            s, fields=_alter(s.fields, ["Brokers", "Host"], nullable_versions=parse_versions("0+"))
        ),
        "MetadataResponse.Brokers[].Host: not Optional in kio",
    ),
    (
        "wider-int",
        ApiKey.METADATA,
        lambda s: replace(
            s, fields=_alter(s.fields, ["Topics", "Partitions", "LeaderEpoch"], type="int64")
        ),
        "MetadataResponse.Topics[].Partitions[].LeaderEpoch: kafka_type 'int32'",
    ),
    (
        "not-an-array",
        ApiKey.METADATA,
        lambda s: replace(
            s, fields=_alter(s.fields, ["Topics", "Partitions", "ReplicaNodes"], type="int32")
        ),
        "MetadataResponse.Topics[].Partitions[].ReplicaNodes: int32 in the schema",
    ),
    (
        "not-a-duration",
        ApiKey.METADATA,
        lambda s: replace(s, fields=_alter(s.fields, ["ThrottleTimeMs"], name="ThrottleTime")),
        "MetadataResponse.ThrottleTime: kafka_type 'timedelta_i32' (wire int32) in kio, int32",
    ),
    (
        "new-tagged-field",
        ApiKey.METADATA,
        lambda s: replace(s, fields=(*s.fields, _tagged_field("NewThing", 0))),
        f"MetadataResponse.NewThing: in the schema at v{_METADATA}, missing from kio ('new_thing')",
    ),
    (
        "field-gone",
        ApiKey.METADATA,
        lambda s: replace(
            s, fields=_alter(s.fields, ["ClusterId"], versions=parse_versions(f"2-{_METADATA - 1}"))
        ),
        f"MetadataResponse: kio field 'cluster_id' is not in the schema at v{_METADATA}",
    ),
    (
        "order",
        ApiKey.METADATA,
        _swap_first_two,
        "MetadataResponse: untagged fields in kio order",
    ),
    (
        "not-flexible",
        ApiKey.METADATA,
        lambda s: replace(s, flexible_versions=NO_VERSIONS),
        "MetadataResponse.Brokers[]: kio MetadataResponseBroker has (__version__, __api_key__, "
        f"__flexible__) = ({_METADATA}, 3, True), expected ({_METADATA}, 3, False)",
    ),
    (
        "struct-renamed",
        ApiKey.METADATA,
        lambda s: replace(s, fields=_alter(s.fields, ["Brokers"], type="[]Broker")),
        "MetadataResponse.Brokers: struct Broker in the schema, MetadataResponseBroker in kio",
    ),
    (
        "other-tag",
        ApiKey.FETCH,
        lambda s: replace(
            s, fields=_alter(s.fields, ["Responses", "Partitions", "DivergingEpoch"], tag=5)
        ),
        "FetchResponse.Responses[].Partitions[].DivergingEpoch: tag 0 in kio, 5 in the schema",
    ),
    (
        "not-tagged",
        ApiKey.FETCH,
        lambda s: replace(
            s,
            fields=_alter(
                s.fields,
                ["Responses", "Partitions", "DivergingEpoch"],
                tag=None,
                tagged_versions=NO_VERSIONS,
            ),
        ),
        "FetchResponse.Responses[].Partitions[].DivergingEpoch: tag 0 in kio, None in the schema",
    ),
    (
        "nested-struct-field",
        ApiKey.FETCH,
        lambda s: replace(
            s,
            fields=_alter(
                s.fields, ["Responses", "Partitions", "DivergingEpoch", "EndOffset"], type="int32"
            ),
        ),
        "FetchResponse.Responses[].Partitions[].DivergingEpoch.EndOffset: kafka_type 'int64'",
    ),
]


@pytest.mark.parametrize(
    ("api_key", "alter", "expected"),
    [pytest.param(key, alter, expected, id=name) for name, key, alter, expected in _ALTERATIONS],
)
def test_comparison_reports_each_kind_of_difference(
    api_key: ApiKey, alter: Callable[[MessageSpec], MessageSpec], expected: str
) -> None:
    version = SUPPORTED[api_key].max
    spec = _schema(api_key, "response")
    cls = response_type(api_key, version)
    assert schema_differences(spec, cls, version) == []
    problems = schema_differences(alter(spec), cls, version)
    assert any(problem.startswith(expected) for problem in problems), problems


def test_every_supported_api_has_both_schemas() -> None:
    missing = []
    for api_key in SUPPORTED:
        for kind in KINDS:
            try:
                find_message(api_key, kind)
            except LookupError as exc:
                missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_accepted_differences_are_for_supported_versions() -> None:
    for api_key, version, _kind in ACCEPTED:
        assert is_decodable(api_key, version), (api_key, version)


def test_missing_schema_folder_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-kafka-protocol"
    monkeypatch.setenv(SCHEMAS_ENV, str(missing))
    with pytest.raises(SchemasMissing, match=re.escape(str(missing / "messages"))):
        messages_dir()
    with pytest.raises(SchemasMissing, match=re.escape(str(missing / "messages"))):
        load_messages()
    with pytest.raises(pytest.fail.Exception, match=re.escape(str(missing / "messages"))):
        check_conformance(ApiKey.METADATA, SUPPORTED[ApiKey.METADATA].max, "request")


def test_empty_schema_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "messages").mkdir()
    with pytest.raises(SchemasMissing, match="holds no"):
        messages_dir(tmp_path)


def test_default_schemas_come_from_the_pinned_kafka_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone needs nothing beside it: by default the schemas are those of the Kafka release
    the tests compare against, taken from its jars in the cache outside the repository."""
    monkeypatch.delenv(SCHEMAS_ENV, raising=False)
    root = schemas_root()
    assert root == kafka_dist.cache_dir() / "protocol"
    assert not root.is_relative_to(REPO_ROOT)
    assert (messages_dir() / "ProduceRequest.json").is_file()
    assert (root / "metadata-records" / "TopicRecord.json").is_file()


def test_missing_schema_file_or_version_fails(tmp_path: Path) -> None:
    """A supported API without a schema file, or a supported version outside the schema's
    validVersions, fails the conformance check."""
    (tmp_path / "messages").mkdir()
    (tmp_path / "messages" / "ApiVersionsRequest.json").write_text(
        '// comment\n{"apiKey": 18, "type": "request", "name": "ApiVersionsRequest",\n'
        ' "validVersions": "0-2", "flexibleVersions": "3+", "fields": []}\n'
    )
    version = SUPPORTED[ApiKey.API_VERSIONS].max
    with pytest.raises(pytest.fail.Exception, match=r"has validVersions 0-2"):
        check_conformance(ApiKey.API_VERSIONS, version, "request", tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"one request schema with apiKey 0 in .*none"):
        check_conformance(ApiKey.PRODUCE, 3, "request", tmp_path)


def test_version_ranges() -> None:
    assert list(parse_versions("0-4")) == [0, 1, 2, 3, 4]
    assert 3 in parse_versions("3+")
    assert 32767 in parse_versions("3+")
    assert 2 not in parse_versions("3+")
    assert list(parse_versions("none")) == []
    assert list(parse_versions("5")) == [5]
    assert str(parse_versions("3+")) == "3+"
    assert str(parse_versions("0-4")) == "0-4"
    with pytest.raises(ValueError, match="not a version range"):
        parse_versions("v3")


# ---------------------------------------------------------------------------------------------
# The request header: our own dataclass and codec (broker.protocol.headers), checked loosely.
# ---------------------------------------------------------------------------------------------

HEADER_FIELDS = {
    "RequestApiKey": "api_key",
    "RequestApiVersion": "api_version",
    "CorrelationId": "correlation_id",
    "ClientId": "client_id",
}
"""RequestHeader.json's fields and our names for them (ours drop the Request prefix)."""


def _header_spec() -> MessageSpec:
    try:
        specs = load_messages()
    except SchemasMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    if "RequestHeader" not in specs:
        pytest.fail(f"no RequestHeader.json in {messages_dir()}", pytrace=False)
    return specs["RequestHeader"]


def test_request_header_matches_kafka_schema() -> None:
    spec = _header_spec()
    assert spec.type == "header"
    # v0 served only ControlledShutdown v0, which Kafka 4.0 removed with ZooKeeper.
    assert list(spec.valid_versions) == [1, 2]
    ours = {f.name: f for f in dataclasses.fields(RequestHeader)}
    schema_names = [f.name for f in spec.fields]
    assert schema_names == list(HEADER_FIELDS), "RequestHeader.json fields changed"
    assert [HEADER_FIELDS[name] for name in schema_names] + ["tagged_fields"] == list(ours)
    hints = typing.get_type_hints(RequestHeader)

    client_id = "gregor-conformance"
    tagged = ((0, b"\x01"),)
    for version in spec.valid_versions:
        flexible = version in spec.flexible_versions
        header = RequestHeader(1, 2, 3, client_id, tagged if flexible else ())
        encoded = encode_request_header(header, version)
        decoded, end = decode_request_header(encoded, version)
        assert end == len(encoded)
        for field in spec.fields:
            name = HEADER_FIELDS[field.name]
            if version in field.versions:
                assert getattr(decoded, name) == getattr(header, name), (version, name)
                nullable = version in field.nullable_versions
                assert _split_optional(hints[name])[1] == nullable, (version, name)
            else:
                # Absent at this version: not on the wire, so it must have a default.
                assert ours[name].default is None, (version, name)
                assert getattr(decoded, name) is None, (version, name)
        assert decoded.tagged_fields == (tagged if flexible else ()), version

    # ClientId keeps its int16 length even in flexible v2 (field-level flexibleVersions none).
    (client_id_spec,) = (f for f in spec.fields if f.name == "ClientId")
    assert client_id_spec.flexible_versions is not None
    assert 2 not in client_id_spec.flexible_versions
    v2 = encode_request_header(RequestHeader(1, 2, 3, client_id), 2)
    assert v2[8:10] == len(client_id).to_bytes(2, "big")
