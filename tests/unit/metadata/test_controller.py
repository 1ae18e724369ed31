"""The controller's rules: Kafka's validation and error codes for topic, partition and config
changes, decided without changing anything until the image applies the records."""

from __future__ import annotations

import itertools
import uuid

import pytest

from broker.metadata import ConfigOp, MetadataImage, Outcome, QuorumController, TopicRequest
from broker.metadata.controller import MAX_RECORDS_PER_USER_OP
from broker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from broker.metadata.records import (
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from broker.protocol.errors import ErrorCode


def _image(brokers: int = 1) -> MetadataImage:
    image = MetadataImage()
    offsets = itertools.count()
    for broker_id in range(1, brokers + 1):
        image.apply(
            RegisterBrokerRecord(
                broker_id,
                uuid.uuid4(),
                broker_id,
                (BrokerEndpoint("PLAINTEXT", "localhost", 9090 + broker_id, 0),),
            ),
            next(offsets),
        )
        image.apply(UnfenceBrokerRecord(broker_id, broker_id), next(offsets))
    return image


def _controller(image: MetadataImage) -> QuorumController:
    ids = (uuid.UUID(int=i) for i in itertools.count(1))
    return QuorumController(
        image, num_partitions=2, replication_factor=1, new_topic_id=lambda: next(ids)
    )


def _commit(image: MetadataImage, records: list[MetadataRecord]) -> None:
    for record in records:
        image.apply(record, image.offset + 1)


def test_create_topic_with_defaults_and_configs() -> None:
    image = _image()
    controller = _controller(image)
    records, results = controller.create_topics(
        [TopicRequest("orders", configs={"retention.ms": "1000", "cleanup.policy": None})]
    )
    assert [r.error for r in results] == [ErrorCode.none]
    assert results[0].num_partitions == 2
    assert "orders" not in image.topics  # nothing happens before the records apply
    _commit(image, records)
    topic = image.topics["orders"]
    assert sorted(topic.partitions) == [0, 1]
    assert all(p.leader == 1 and p.isr == (1,) for p in topic.partitions.values())
    assert image.topic_config("orders") == {"retention.ms": "1000"}


def test_replicas_are_spread_over_brokers() -> None:
    image = _image(brokers=3)
    records, _ = _controller(image).create_topics([TopicRequest("t", 6, 2)])
    partitions = [r for r in records if isinstance(r, PartitionRecord)]
    assert [p.leader for p in partitions] == [1, 2, 3, 1, 2, 3]
    assert all(len(set(p.replicas)) == 2 for p in partitions)


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (TopicRequest(""), ErrorCode.invalid_topic_exception),
        (TopicRequest(".."), ErrorCode.invalid_topic_exception),
        (TopicRequest("a" * 250), ErrorCode.invalid_topic_exception),
        (TopicRequest("bad name"), ErrorCode.invalid_topic_exception),
        (TopicRequest("t", num_partitions=0), ErrorCode.invalid_partitions),
        (TopicRequest("t", replication_factor=0), ErrorCode.invalid_replication_factor),
        (TopicRequest("t", replication_factor=2), ErrorCode.invalid_replication_factor),
        (TopicRequest("t", configs={"retention.ms": "x"}), ErrorCode.invalid_config),
        (TopicRequest("t", configs={"nope": "1"}), ErrorCode.invalid_config),
        (TopicRequest("t", assignments={0: [1], 2: [1]}), ErrorCode.invalid_replica_assignment),
        (TopicRequest("t", assignments={0: [7]}), ErrorCode.invalid_replica_assignment),
        (TopicRequest("t", 1, assignments={0: [1]}), ErrorCode.invalid_request),
    ],
)
def test_invalid_topics_are_refused(request_: TopicRequest, error: ErrorCode) -> None:
    records, results = _controller(_image()).create_topics([request_])
    assert records == []
    assert results[0].error == error
    assert results[0].message


def test_existing_duplicate_and_colliding_names() -> None:
    image = _image()
    controller = _controller(image)
    records, _ = controller.create_topics([TopicRequest("a.b")])
    _commit(image, records)
    _, results = controller.create_topics(
        [TopicRequest("a.b"), TopicRequest("a_b"), TopicRequest("x"), TopicRequest("x")]
    )
    assert [r.error for r in results] == [
        ErrorCode.topic_already_exists,
        ErrorCode.invalid_topic_exception,
        ErrorCode.invalid_request,
        ErrorCode.invalid_request,
    ]


def test_delete_by_name_and_id() -> None:
    image = _image()
    controller = _controller(image)
    records, results = controller.create_topics([TopicRequest("a"), TopicRequest("b")])
    _commit(image, records)
    b_id = results[1].topic_id
    assert b_id is not None
    records, deleted = controller.delete_topics(["a", "missing"], [b_id, uuid.uuid4()])
    assert [o.error for _, _, o in deleted] == [
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.none,
        ErrorCode.unknown_topic_id,
    ]
    _commit(image, records)
    assert image.topics == {}


def test_create_partitions_only_grows() -> None:
    image = _image()
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("t", 3)])[0])
    records, outcome = controller.create_partitions("t", 5, None)
    assert outcome.error == ErrorCode.none
    _commit(image, records)
    assert sorted(image.topics["t"].partitions) == [0, 1, 2, 3, 4]
    for count, message in ((2, "would not be an increase"), (5, "already has 5")):
        records, outcome = controller.create_partitions("t", count, None)
        assert (records, outcome.error) == ([], ErrorCode.invalid_partitions)
        assert outcome.message is not None
        assert message in outcome.message
    assert controller.create_partitions("nope", 2, None)[1].error == (
        ErrorCode.unknown_topic_or_partition
    )


def test_manual_assignments_may_name_fenced_brokers_which_start_out_of_the_isr() -> None:
    """Kafka's rule: any registered broker may be named, fenced or shutting down; the ISR is
    the active replicas, the first of them leads, and a partition with none is refused."""
    image = _image(brokers=5)
    _commit(
        image,
        [
            BrokerRegistrationChangeRecord(3, 3, fenced=1, in_controlled_shutdown=1),  # stopped
            FenceBrokerRecord(4, 4),  # its session ran out
            BrokerRegistrationChangeRecord(5, 5, fenced=1),  # it asked (its disks failed)
        ],
    )
    controller = _controller(image)
    records, [result] = controller.create_topics(
        [TopicRequest("t", assignments={0: [3, 1, 2], 1: [2, 3, 1]})]
    )
    assert (result.error, result.message, result.replication_factor) == (ErrorCode.none, None, 3)
    _commit(image, records)
    partitions = image.topics["t"].partitions
    assert [(p.replicas, p.isr, p.leader) for p in partitions.values()] == [
        ((3, 1, 2), (1, 2), 1),
        ((2, 3, 1), (2, 1), 2),
    ]
    records, outcome = controller.create_partitions("t", 3, [[4, 3, 2]])
    assert outcome == Outcome()
    _commit(image, records)
    added = partitions[2]
    assert (added.replicas, added.isr, added.leader) == ((4, 3, 2), (2,), 2)

    all_fenced = "are fenced or in controlled shutdown."
    _, [refused] = controller.create_topics([TopicRequest("u", assignments={0: [1], 1: [4]})])
    assert (refused.error, refused.message) == (
        ErrorCode.invalid_replica_assignment,
        f"All brokers specified in the manual partition assignment for partition 1 {all_fenced}",
    )
    records, outcome = controller.create_partitions("t", 4, [[3, 4, 5]])
    assert (records, outcome) == (
        [],
        Outcome(
            ErrorCode.invalid_replica_assignment,
            "All brokers specified in the manual partition assignment for partition 3 "
            f"{all_fenced}",
        ),
    )
    records, outcome = controller.create_partitions("t", 4, [[3, 4, 9]])
    assert (records, outcome.error, outcome.message) == (
        [],
        ErrorCode.invalid_replica_assignment,
        "The manual partition assignment includes broker 9, but no such broker is registered.",
    )

    # Once unregistered, a broker may no longer be named.
    _commit(image, [UnregisterBrokerRecord(3, 3)])
    _, [gone] = controller.create_topics([TopicRequest("v", assignments={0: [1, 3]})])
    assert (gone.error, gone.message) == (
        ErrorCode.invalid_replica_assignment,
        "The manual partition assignment includes broker 3, but no such broker is registered.",
    )


def test_incremental_and_replacing_config_changes() -> None:
    image = _image()
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("t", configs={"retention.ms": "5"})])[0])
    records, outcome = controller.alter_configs(
        TOPIC_RESOURCE,
        "t",
        [
            ConfigOp("cleanup.policy", 0, "compact"),
            ConfigOp("leader.replication.throttled.replicas", 2, "0:1,1:1"),
        ],
        replace=False,
    )
    assert outcome.error == ErrorCode.none
    _commit(image, records)
    assert image.topic_config("t") == {
        "retention.ms": "5",
        "cleanup.policy": "compact",
        "leader.replication.throttled.replicas": "0:1,1:1",
    }
    records, _ = controller.alter_configs(
        TOPIC_RESOURCE,
        "t",
        [ConfigOp("leader.replication.throttled.replicas", 3, "0:1")],
        replace=False,
    )
    _commit(image, records)
    assert image.topic_config("t")["leader.replication.throttled.replicas"] == "1:1"
    records, _ = controller.alter_configs(
        TOPIC_RESOURCE, "t", [ConfigOp("segment.ms", 0, "1000")], replace=True
    )
    _commit(image, records)
    assert image.topic_config("t") == {"segment.ms": "1000"}


@pytest.mark.parametrize(
    ("resource", "name", "op", "error"),
    [
        (TOPIC_RESOURCE, "missing", ConfigOp("retention.ms", 0, "1"), "unknown_topic_or_partition"),
        (TOPIC_RESOURCE, "t", ConfigOp("retention.ms", 0, "soon"), "invalid_config"),
        (TOPIC_RESOURCE, "t", ConfigOp("bogus", 0, "1"), "invalid_config"),
        (TOPIC_RESOURCE, "t", ConfigOp("retention.ms", 2, "1"), "invalid_config"),
        (
            TOPIC_RESOURCE,
            "t",
            ConfigOp("follower.replication.throttled.replicas", 0, "0-1,*"),
            "invalid_config",
        ),
        (BROKER_RESOURCE, "1", ConfigOp("node.id", 0, "2"), "invalid_request"),
        (BROKER_RESOURCE, "9", ConfigOp("log.retention.ms", 0, "2"), "invalid_request"),
        (BROKER_RESOURCE, "", ConfigOp("log.retention.ms", 0, "x"), "invalid_request"),
        (BROKER_RESOURCE, "", ConfigOp("log.dirs", 0, "/x"), "invalid_request"),
        (BROKER_RESOURCE, "1", ConfigOp("num.io.threads", 2, "4"), "invalid_config"),
        (BROKER_RESOURCE, "1", ConfigOp("no.such.config", 2, "4"), "invalid_config"),
    ],
)
def test_invalid_config_changes(resource: int, name: str, op: ConfigOp, error: str) -> None:
    image = _image()
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("t")])[0])
    records, outcome = controller.alter_configs(resource, name, [op], replace=False)
    assert records == []
    assert outcome.error == getattr(ErrorCode, error)
    assert outcome.message


def test_dynamic_broker_defaults() -> None:
    image = _image()
    records, outcome = _controller(image).alter_configs(
        BROKER_RESOURCE, "", [ConfigOp("log.retention.ms", 0, "1000")], replace=False
    )
    assert outcome.error == ErrorCode.none
    _commit(image, records)
    assert image.configs[(BROKER_RESOURCE, "")] == {"log.retention.ms": "1000"}


def test_dynamic_broker_configs_kafka_accepts_and_lists_that_start_from_their_default() -> None:
    image = _image()
    controller = _controller(image)
    records, outcome = controller.alter_configs(
        BROKER_RESOURCE,
        "1",
        [
            ConfigOp("sasl.kerberos.min.time.before.relogin", 0, "61000"),
            ConfigOp("sasl.enabled.mechanisms", 2, "PLAIN"),
        ],
        replace=False,
    )
    assert outcome.error == ErrorCode.none
    _commit(image, records)
    assert image.configs[(BROKER_RESOURCE, "1")] == {
        "sasl.kerberos.min.time.before.relogin": "61000",
        "sasl.enabled.mechanisms": "GSSAPI,PLAIN",
    }


def test_producer_id_blocks_never_overlap() -> None:
    image = _image()
    controller = _controller(image)
    blocks = []
    for _ in range(3):
        records, block = controller.allocate_producer_ids(1, 1)
        _commit(image, records)
        blocks.append(block)
    assert [b.start for b in blocks] == [0, 1000, 2000]


def test_clients_cannot_create_internal_topics_and_the_broker_only_the_offsets_topic() -> None:
    controller = _controller(_image())
    for name in ("__cluster_metadata", "__consumer_offsets", "__transaction_state"):
        records, (result,) = controller.create_topics([TopicRequest(name, 1)])
        assert (records, result.error) == ([], ErrorCode.invalid_request)
        assert result.message == f"Creation of internal topic {name} is prohibited."
    records, (result,) = controller.create_topics(
        [TopicRequest("__cluster_metadata", 1)], by_broker=True
    )
    assert (records, result.error) == ([], ErrorCode.invalid_request)
    records, (result,) = controller.create_topics(
        [TopicRequest("__consumer_offsets", 3)], by_broker=True
    )
    assert result.error == ErrorCode.none
    assert len(records) == 1 + 3


def test_partitions_are_never_added_to_an_internal_topic() -> None:
    image = _image()
    controller = _controller(image)
    _commit(
        image, controller.create_topics([TopicRequest("__consumer_offsets", 3)], by_broker=True)[0]
    )
    records, outcome = controller.create_partitions("__consumer_offsets", 6, None)
    assert (records, outcome.error) == ([], ErrorCode.invalid_request)
    assert len(image.topics["__consumer_offsets"].partitions) == 3


def test_an_operation_over_ten_thousand_records_is_refused_whole() -> None:
    image = _image()
    controller = _controller(image)
    limit = MAX_RECORDS_PER_USER_OP
    # One topic record plus its partitions: 9 999 partitions is the largest topic that fits.
    records, (fits,) = controller.create_topics([TopicRequest("fits", limit - 1)])
    assert fits.error == ErrorCode.none
    assert len(records) == limit
    for request in (
        [TopicRequest("huge", 1_000_000)],
        [TopicRequest("huge", 2**31 - 1)],
        [TopicRequest("fits", limit - 1, configs={"retention.ms": "1"})],
        [TopicRequest("a", 6_000), TopicRequest("bad name!", 1), TopicRequest("b", 6_000)],
    ):
        records, results = controller.create_topics(request)
        assert records == []
        assert [r.error for r in results] == [ErrorCode.policy_violation] * len(request)
        assert all("excessively large batch operation" in (r.message or "") for r in results)

    _commit(image, controller.create_topics([TopicRequest("small", 1), TopicRequest("t", 1)])[0])
    records, outcomes = controller.create_partitions_all(
        [("small", 6_000, None), ("t", 6_000, None)]
    )
    assert records == []
    assert [o.error for o in outcomes] == [ErrorCode.policy_violation] * 2
    records, outcomes = controller.create_partitions_all([("small", 3, None), ("t", 2, None)])
    assert [o.error for o in outcomes] == [ErrorCode.none] * 2
    assert len(records) == 3

    names = [f"t{i}" for i in range(limit + 1)]
    records, deleted = controller.delete_topics(names)
    assert records == []
    assert {outcome.error for _, _, outcome in deleted} == {ErrorCode.policy_violation}


def test_append_and_subtract_start_from_the_default_of_a_list_not_set() -> None:
    """Kafka's rule: APPEND compact to a topic that never set cleanup.policy gives
    delete,compact (time retention stays on), and SUBTRACT delete leaves an empty policy."""
    image = _image()
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("a"), TopicRequest("b")])[0])
    records, outcome = controller.alter_configs(
        TOPIC_RESOURCE, "a", [ConfigOp("cleanup.policy", 2, "compact")], replace=False
    )
    assert outcome.error == ErrorCode.none
    _commit(image, records)
    assert image.topic_config("a")["cleanup.policy"] == "delete,compact"
    records, outcome = controller.alter_configs(
        TOPIC_RESOURCE, "b", [ConfigOp("cleanup.policy", 3, "delete")], replace=False
    )
    assert outcome.error == ErrorCode.none, outcome.message
    _commit(image, records)
    assert image.topic_config("b")["cleanup.policy"] == ""
