"""Where new partitions' replicas go: over racks first, then evenly over brokers, led by
unfenced brokers, the same on every controller, and carried on from topic to topic."""

from __future__ import annotations

import collections
import itertools
import uuid
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.metadata import MetadataImage, QuorumController, TopicRequest
from broker.metadata.placement import UsableBroker, place, usable_brokers
from broker.metadata.records import (
    FENCE,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)
from broker.protocol.errors import ErrorCode

SIX_OVER_THREE_RACKS = {1: "a", 2: "b", 3: "c", 4: "a", 5: "b", 6: "c"}


def _image(racks: Mapping[int, str | None], fenced: Sequence[int] = ()) -> MetadataImage:
    """Brokers by id with their `broker.rack`; all unfenced but `fenced`."""
    image = MetadataImage()
    offsets = itertools.count()
    for broker_id, rack in racks.items():
        endpoint = BrokerEndpoint("PLAINTEXT", "localhost", 9090 + broker_id, 0)
        image.apply(
            RegisterBrokerRecord(broker_id, uuid.uuid4(), broker_id, (endpoint,), rack=rack),
            next(offsets),
        )
        if broker_id not in fenced:
            image.apply(UnfenceBrokerRecord(broker_id, broker_id), next(offsets))
    return image


def _controller(image: MetadataImage) -> QuorumController:
    ids = (uuid.UUID(int=i) for i in itertools.count(1))
    return QuorumController(
        image,
        num_partitions=1,
        replication_factor=3,
        new_topic_id=lambda: next(ids),
    )


def _commit(image: MetadataImage, records: list[MetadataRecord]) -> None:
    for record in records:
        image.apply(record, image.offset + 1)


def _partitions(records: list[MetadataRecord]) -> list[PartitionRecord]:
    return [r for r in records if isinstance(r, PartitionRecord)]


def _spread(counts: collections.Counter[int], brokers: Sequence[int]) -> int:
    """How far apart the busiest and the idlest of `brokers` are."""
    return max(counts[b] for b in brokers) - min(counts[b] for b in brokers)


# -- through the controller ------------------------------------------------------------------


def test_every_partition_spans_three_racks_and_leads_from_every_broker() -> None:
    image = _image(SIX_OVER_THREE_RACKS)
    records, results = _controller(image).create_topics([TopicRequest("t", 60, 3)])
    assert results[0].ok
    partitions = _partitions(records)
    assert all(len({SIX_OVER_THREE_RACKS[b] for b in p.replicas}) == 3 for p in partitions)
    assert collections.Counter(p.leader for p in partitions) == dict.fromkeys(range(1, 7), 10)
    replicas = collections.Counter(b for p in partitions for b in p.replicas)
    assert replicas == dict.fromkeys(range(1, 7), 30)
    assert all(p.isr == p.replicas for p in partitions)


def test_leaders_alternate_racks_and_followers_are_not_always_the_same() -> None:
    image = _image(SIX_OVER_THREE_RACKS)
    partitions = _partitions(_controller(image).create_topics([TopicRequest("t", 12, 3)])[0])
    racks = [SIX_OVER_THREE_RACKS[p.leader] for p in partitions]
    assert all(a != b for a, b in itertools.pairwise(racks))
    # Broker 1 leads twice; a failure of it does not move both leaderships to one broker.
    led_by_one = [p.replicas for p in partitions if p.leader == 1]
    assert len(led_by_one) == 2
    assert led_by_one[0][1] != led_by_one[1][1]


def test_successive_single_partition_topics_spread_their_leaders_and_replicas() -> None:
    image = _image(SIX_OVER_THREE_RACKS)
    controller = _controller(image)
    for index in range(12):
        records, results = controller.create_topics([TopicRequest(f"t{index}", 1, 3)])
        assert results[0].ok
        _commit(image, records)
    partitions = [p for t in image.topics.values() for p in t.partitions.values()]
    assert collections.Counter(p.leader for p in partitions) == dict.fromkeys(range(1, 7), 2)
    replicas = collections.Counter(b for p in partitions for b in p.replicas)
    assert replicas == dict.fromkeys(range(1, 7), 6)


def test_topics_in_one_request_carry_the_rotation_on() -> None:
    image = _image({1: None, 2: None, 3: None})
    records, _ = _controller(image).create_topics(
        [TopicRequest("a", 1, 1), TopicRequest("b", 1, 1), TopicRequest("c", 1, 1)]
    )
    assert [p.leader for p in _partitions(records)] == [1, 2, 3]


def test_partitions_added_to_several_topics_at_once_carry_the_rotation_on() -> None:
    image = _image({1: None, 2: None, 3: None})
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("a", 1, 1), TopicRequest("b", 1, 1)])[0])
    records, outcomes = controller.create_partitions_all([("a", 2, None), ("b", 3, None)])
    assert all(o.error == ErrorCode.none for o in outcomes)
    assert [p.leader for p in _partitions(records)] == [3, 1, 2]


def test_new_partitions_of_a_topic_follow_the_same_rules() -> None:
    image = _image(SIX_OVER_THREE_RACKS)
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("t", 3, 3)])[0])
    records, outcome = controller.create_partitions("t", 12, None)
    assert outcome.error == ErrorCode.none
    _commit(image, records)
    partitions = image.topics["t"].partitions.values()
    assert all(len({SIX_OVER_THREE_RACKS[b] for b in p.replicas}) == 3 for p in partitions)
    assert collections.Counter(p.leader for p in partitions) == dict.fromkeys(range(1, 7), 2)
    assert all(p.replicas[0] == p.leader for p in partitions)


def test_fenced_brokers_are_left_out_while_unfenced_ones_suffice() -> None:
    image = _image(dict.fromkeys(range(1, 6)), fenced=[2, 4])
    records, results = _controller(image).create_topics([TopicRequest("t", 30, 3)])
    assert results[0].ok
    used = {b for p in _partitions(records) for b in p.replicas}
    assert used == {1, 3, 5}


def test_a_fenced_broker_may_follow_out_of_the_isr_but_never_leads() -> None:
    """As in Kafka: fenced brokers count towards the replication factor, out of the ISR."""
    image = _image({1: None, 2: None, 3: None}, fenced=[3])
    records, results = _controller(image).create_topics([TopicRequest("t", 4, 3)])
    assert results[0].ok
    for partition in _partitions(records):
        assert partition.leader != 3
        assert sorted(partition.replicas) == [1, 2, 3]
        assert partition.isr == tuple(b for b in partition.replicas if b != 3)


def test_a_rack_whose_brokers_are_all_fenced_still_gets_its_replica() -> None:
    """Kafka puts spreading over racks before avoiding fenced brokers."""
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c"}
    image = _image(racks, fenced=[5])
    partitions = _partitions(_controller(image).create_topics([TopicRequest("t", 8, 3)])[0])
    assert all({racks[b] for b in p.replicas} == {"a", "b", "c"} for p in partitions)
    assert all(p.leader != 5 and 5 not in p.isr for p in partitions)


def test_racked_and_unracked_brokers_mix_with_no_rack_as_one_more_rack() -> None:
    racks = {1: "a", 2: "a", 3: None, 4: None}
    image = _image(racks)
    partitions = _partitions(_controller(image).create_topics([TopicRequest("t", 8, 2)])[0])
    assert all(len({racks[b] for b in p.replicas}) == 2 for p in partitions)
    assert collections.Counter(p.leader for p in partitions) == dict.fromkeys(range(1, 5), 2)


def test_a_broker_shutting_down_is_not_used_and_one_shut_down_counts_as_fenced() -> None:
    """Kafka's usable brokers: all registered ones but those in controlled shutdown while
    still unfenced; once fenced, a broker is a follower of last resort like any fenced one."""
    image = _image({1: None, 2: None, 3: None, 4: None})
    _commit(
        image,
        [
            BrokerRegistrationChangeRecord(2, 2, in_controlled_shutdown=1),
            BrokerRegistrationChangeRecord(3, 3, fenced=FENCE, in_controlled_shutdown=1),
        ],
    )
    usable = usable_brokers(image.brokers.values())
    assert [(b.broker_id, b.fenced) for b in usable] == [(1, False), (3, True), (4, False)]
    records, _ = _controller(image).create_topics([TopicRequest("t", 4, 3)])
    for partition in _partitions(records):
        assert sorted(partition.replicas) == [1, 3, 4]
        assert partition.leader != 3
        assert 3 not in partition.isr


@pytest.mark.parametrize(
    ("fenced", "factor", "message"),
    [
        ((), 4, "only 3 broker(s) are registered"),
        ((1, 2, 3), 1, "All brokers are currently fenced."),
        ((1, 2), 4, "only 3 broker(s) are registered"),
    ],
)
def test_too_few_or_only_fenced_brokers_refuse_the_topic(
    fenced: tuple[int, ...], factor: int, message: str
) -> None:
    image = _image({1: None, 2: None, 3: None}, fenced=fenced)
    controller = _controller(image)
    records, results = controller.create_topics([TopicRequest("t", 2, factor)])
    assert (records, results[0].error) == ([], ErrorCode.invalid_replication_factor)
    assert message in (results[0].message or "")


def test_new_partitions_are_refused_when_every_broker_is_fenced() -> None:
    image = _image({1: None, 2: None})
    controller = _controller(image)
    _commit(image, controller.create_topics([TopicRequest("t", 1, 2)])[0])
    _commit(image, [FenceBrokerRecord(1, 1), FenceBrokerRecord(2, 2)])
    records, outcome = controller.create_partitions("t", 2, None)
    assert (records, outcome.error) == ([], ErrorCode.invalid_replication_factor)
    assert "All brokers are currently fenced." in (outcome.message or "")


def test_the_same_image_gives_the_same_placement() -> None:
    def placed() -> list[tuple[int, ...]]:
        image = _image(SIX_OVER_THREE_RACKS, fenced=[4])
        controller = _controller(image)
        _commit(image, controller.create_topics([TopicRequest("first", 5, 3)])[0])
        records, _ = controller.create_topics([TopicRequest("second", 7, 3)])
        return [p.replicas for p in _partitions(records)]

    assert placed() == placed()


# -- the pure placement ------------------------------------------------------------------------

layouts = st.lists(st.integers(1, 4), min_size=1, max_size=5).map(
    lambda sizes: [
        UsableBroker(broker_id=10 * rack + i, rack=f"r{rack}", fenced=False)
        for rack, size in enumerate(sizes)
        for i in range(size)
    ]
)


@given(
    brokers=layouts,
    fenced=st.sets(st.integers(0, 50)),
    data=st.data(),
    partitions=st.integers(0, 40),
    start=st.integers(0, 10_000),
)
def test_racks_come_first_no_broker_twice_and_fenced_brokers_never_lead(
    brokers: list[UsableBroker],
    fenced: set[int],
    data: st.DataObject,
    partitions: int,
    start: int,
) -> None:
    brokers = [
        UsableBroker(b.broker_id, b.rack, b.broker_id in fenced and i > 0)
        for i, b in enumerate(brokers)
    ]
    factor = data.draw(st.integers(1, len(brokers)))
    placed = place(brokers, partitions=partitions, factor=factor, start=start)
    assert placed == place(brokers, partitions=partitions, factor=factor, start=start)
    assert len(placed) == partitions
    rack_of = {b.broker_id: b.rack for b in brokers}
    is_fenced = {b.broker_id: b.fenced for b in brokers}
    racks = collections.Counter(rack_of.values())
    for replicas in placed:
        assert len(set(replicas)) == factor
        assert not is_fenced[replicas[0]]
        held = collections.Counter(rack_of[b] for b in replicas)
        # A rack holds a second replica only once every other rack holds as many as it can.
        for rack, count in held.items():
            assert all(held[other] >= min(count - 1, racks[other]) for other in racks), rack
        # Within a rack, a fenced broker only once its unfenced ones are used.
        for rack in held:
            mine = [b for b in rack_of if rack_of[b] == rack]
            if any(is_fenced[b] for b in replicas if rack_of[b] == rack):
                assert all(b in replicas for b in mine if not is_fenced[b])


@given(
    racks=st.integers(1, 4),
    per_rack=st.integers(1, 4),
    data=st.data(),
    laps=st.integers(1, 4),
    start=st.integers(0, 10_000),
)
def test_equal_racks_share_leaders_and_replicas_exactly(
    racks: int, per_rack: int, data: st.DataObject, laps: int, start: int
) -> None:
    brokers = [
        UsableBroker(broker_id=per_rack * rack + i, rack=f"r{rack}", fenced=False)
        for rack in range(racks)
        for i in range(per_rack)
    ]
    ids = [b.broker_id for b in brokers]
    factor = data.draw(st.integers(1, len(brokers)))
    placed = place(brokers, partitions=laps * len(brokers), factor=factor, start=start)
    assert collections.Counter(p[0] for p in placed) == dict.fromkeys(ids, laps)
    assert collections.Counter(b for p in placed for b in p) == dict.fromkeys(ids, laps * factor)


@given(brokers=layouts, count=st.integers(1, 60), start=st.integers(0, 10_000))
def test_leaders_differ_by_at_most_one_over_any_run_of_partitions(
    brokers: list[UsableBroker], count: int, start: int
) -> None:
    leaders = collections.Counter(
        p[0] for p in place(brokers, partitions=count, factor=1, start=start)
    )
    assert _spread(leaders, [b.broker_id for b in brokers]) <= 1


@pytest.mark.parametrize(
    ("brokers", "factor"),
    [
        ([], 1),
        ([UsableBroker(1, None, fenced=True)], 1),
        ([UsableBroker(1, None, fenced=False)], 2),
        ([UsableBroker(1, None, fenced=False)], 0),
    ],
)
def test_placing_what_cannot_be_placed_is_a_bug(brokers: list[UsableBroker], factor: int) -> None:
    with pytest.raises(ValueError, match="cannot place"):
        place(brokers, partitions=1, factor=factor, start=0)
