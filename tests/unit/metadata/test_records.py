"""The metadata record tables match Kafka's metadata record schemas field by field, and every
record survives encode → decode; hostile bytes are refused with a message, never a crash."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from broker.metadata.records import (
    RECORD_TYPES,
    STRUCT_TYPES,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    Spec,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    decode_record,
    encode_record,
)
from broker.protocol.errors import MalformedInput
from tests.kafka_schemas import FieldSpec, load_message, schemas_root


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower().replace("i_d", "id")


def _schema_path(record: type[MetadataRecord]) -> Path:
    path = schemas_root() / "metadata-records" / f"{record.__name__}.json"
    assert path.exists(), f"Kafka's schema for {record.__name__} is missing: {path}"
    return path


def _compare(ours: tuple[Spec, ...], theirs: tuple[FieldSpec, ...], where: str) -> None:
    assert [s.name for s in ours] == [_snake(f.name) for f in theirs], where
    for spec, field in zip(ours, theirs, strict=True):
        here = f"{where}.{field.name}"
        kind = field.type
        if field.is_struct:
            kind = "[]" + field.item_type
        assert spec.type == kind, here
        assert spec.since == field.versions.low, here
        assert spec.tag == field.tag, here
        assert spec.nullable == (not field.nullable_versions.empty), here


@pytest.mark.parametrize("record", [RECORD_TYPES[key] for key in sorted(RECORD_TYPES)])
def test_field_tables_match_kafka(record: type[MetadataRecord]) -> None:
    schema = load_message(_schema_path(record))
    assert schema.api_key == record.API_KEY
    assert record.VERSION in schema.valid_versions
    assert schema.valid_versions.high == record.VERSION
    _compare(record.FIELDS, schema.fields, record.__name__)
    for field in schema.fields:
        if field.is_struct:
            # Every nested struct has a table of its own, checked the same way.
            struct = STRUCT_TYPES[field.item_type]
            _compare(struct.FIELDS, field.fields, f"{record.__name__}.{field.name}")


SAMPLES: list[MetadataRecord] = [
    RegisterBrokerRecord(
        broker_id=3,
        incarnation_id=uuid.uuid4(),
        broker_epoch=42,
        end_points=(BrokerEndpoint("PLAINTEXT", "broker-3.local", 9092, 0),),
        rack="eu-1a",
        fenced=False,
        log_dirs=(uuid.uuid4(),),
    ),
    TopicRecord("orders", uuid.uuid4()),
    PartitionRecord(
        partition_id=2,
        topic_id=uuid.uuid4(),
        replicas=(1, 2, 3),
        isr=(1, 2),
        leader=1,
        leader_epoch=4,
        partition_epoch=9,
        leader_recovery_state=1,
        eligible_leader_replicas=(3,),
    ),
    ConfigRecord(2, "orders", "retention.ms", "1000"),
    ConfigRecord(4, "", "log.retention.ms", None),
    PartitionChangeRecord(0, uuid.uuid4(), isr=(1,), leader=2),
    PartitionChangeRecord(0, uuid.uuid4()),
    UnfenceBrokerRecord(3, 42),
    FenceBrokerRecord(3, 42),
    UnregisterBrokerRecord(3, 42),
    BrokerRegistrationChangeRecord(3, 42, fenced=-1, in_controlled_shutdown=1),
    BrokerRegistrationChangeRecord(3, 42),
    RemoveTopicRecord(uuid.uuid4()),
    FeatureLevelRecord("metadata.version", 21),
    ProducerIdsRecord(1, 42, 5000),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_round_trip(record: MetadataRecord) -> None:
    assert decode_record(encode_record(record)) == record


def test_known_bytes_of_a_topic_record() -> None:
    """Frame version 1, api key 2, version 0, compact string, uuid, no tagged fields."""
    topic_id = uuid.UUID(int=1)
    assert encode_record(TopicRecord("t", topic_id)) == (
        b"\x01\x02\x00" + b"\x02t" + topic_id.bytes + b"\x00"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x02\x02\x00", "frame version 2"),
        (b"\x01\x63\x00", "type 99 is unknown"),
        (b"\x01\x02\x05", "v5 is newer"),
        (b"\x01\x02\x00\x7ft", "runs past the end"),
        (encode_record(TopicRecord("t", uuid.UUID(int=1))) + b"\x00", "bytes left"),
        (b"\x01\x03\x00" + b"\x00\x00\x00\x01" + bytes(16) + b"\xff\xff\xff\x0f", "claims"),
    ],
)
def test_hostile_bytes_are_refused_by_name(data: bytes, message: str) -> None:
    with pytest.raises(MalformedInput, match=message):
        decode_record(data)
