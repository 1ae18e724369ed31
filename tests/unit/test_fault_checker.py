"""The fault-injection run's checker (`tests.faults.checker`) and schedule: each check fires on
the log that breaks it and only on that one, so a run that reports nothing has checked
something."""

from __future__ import annotations

import pytest

from tests.faults.checker import check, duplicates
from tests.faults.plan import FAULT_KINDS, Settings, draw
from tests.faults.stamps import Incarnation, Ledger, Send, Stamp, parse_stamp

TOPIC = Incarnation("faults-a", 2)


def _value(sequence: int, partition: int = 0, incarnation: Incarnation = TOPIC) -> bytes:
    return Stamp(incarnation, partition, sequence).value()


def _acknowledged(*offsets: tuple[int, int, int]) -> dict[int, Send]:
    """(sequence, partition, offset) of acknowledged sends."""
    return {s: Send(p, acknowledged=True, offset=o) for s, p, o in offsets}


def _failing(**records: list[tuple[int, bytes | None]]) -> dict[str, int]:
    return {c: n for c, n in check(TOPIC, SENDS, {0: records["p0"]}).counts().items() if n}


SENDS = _acknowledged((1, 0, 0), (2, 0, 1), (3, 0, 2))


def test_a_log_holding_every_acknowledged_record_once_in_order_passes() -> None:
    verdict = check(TOPIC, SENDS, {0: [(0, _value(1)), (1, _value(2)), (2, _value(3))]})
    assert verdict.ok, verdict.problems
    assert (verdict.acknowledged, verdict.read) == (3, 3)


@pytest.mark.parametrize(
    ("records", "fails"),
    [
        ([(0, _value(1)), (2, _value(3))], {"lost": 1, "moved": 0}),
        (
            [(0, _value(1)), (1, _value(2)), (2, _value(3)), (3, _value(3))],
            {"duplicated": 1},
        ),
        (
            [
                (0, _value(1)),
                (1, _value(2)),
                (2, _value(3)),
                (3, _value(9, 0, Incarnation("faults-a", 1))),
            ],
            {"wrong_topic": 1},
        ),
        (
            [
                (0, _value(1)),
                (1, _value(2)),
                (2, _value(3)),
                (3, _value(4, 0, Incarnation("faults-b", 2))),
            ],
            {"wrong_topic": 1},
        ),
        ([(0, _value(1)), (1, _value(2)), (2, _value(3)), (3, b"someone else's")], {"unknown": 1}),
        ([(0, _value(1)), (1, _value(2)), (2, _value(3)), (3, _value(77))], {"unknown": 1}),
        ([(0, _value(1)), (1, b"x"), (2, _value(2)), (3, _value(3))], {"unknown": 1, "moved": 2}),
        ([(0, _value(2)), (1, _value(1)), (2, _value(3))], {"moved": 2, "out_of_order": 1}),
    ],
    ids=[
        "lost",
        "duplicated",
        "old-incarnation",
        "other-topic",
        "foreign",
        "never-sent",
        "moved",
        "out-of-order",
    ],
)
def test_each_check_fires_on_the_log_that_breaks_it(
    records: list[tuple[int, bytes | None]], fails: dict[str, int]
) -> None:
    assert _failing(p0=records) == {c: n for c, n in fails.items() if n}


def test_a_record_in_another_partition_than_it_was_sent_to_is_wrong() -> None:
    sends = _acknowledged((1, 0, 0), (2, 1, 0))
    verdict = check(TOPIC, sends, {0: [(0, _value(1))], 1: [(0, _value(2, partition=0))]})
    assert verdict.counts()["wrong_topic"] == 1
    assert verdict.counts()["lost"] == 1


def test_a_failed_send_may_be_there_once_but_not_twice() -> None:
    sends = {**SENDS, 4: Send(0, error="_MSG_TIMED_OUT")}
    written = [(0, _value(1)), (1, _value(2)), (2, _value(3)), (3, _value(4))]
    once = check(TOPIC, sends, {0: written})
    assert once.ok, once.problems
    assert once.failed_but_written == 1
    assert check(TOPIC, sends, {0: [*written[:3]]}).ok
    twice = check(TOPIC, sends, {0: [*written, (4, _value(4))]})
    assert twice.counts()["duplicated"] == 1


def test_copies_under_different_producer_epochs_are_the_producers_resends() -> None:
    """librdkafka bumps its epoch when it cannot tell whether a send was written, and sends
    the record again: idempotence holds within one epoch only."""
    written = [(0, _value(1)), (1, _value(2)), (2, _value(2)), (3, _value(3))]
    sends = _acknowledged((1, 0, 0), (2, 0, 2), (3, 0, 3))
    assert duplicates({0: written}) == {(0, 1), (0, 2)}
    resent = check(TOPIC, sends, {0: written}, {(0, 1): (1000, 0, 1), (0, 2): (1000, 1, 0)})
    assert {c: n for c, n in resent.counts().items() if n} == {"duplicated_across_epochs": 1}
    assert "epoch 1 seq 0" in resent.problems["duplicated_across_epochs"][0]
    same_epoch = check(TOPIC, sends, {0: written}, {(0, 1): (1000, 0, 1), (0, 2): (1000, 0, 2)})
    assert {c: n for c, n in same_epoch.counts().items() if n} == {"duplicated": 1}
    unlooked = check(TOPIC, sends, {0: written})
    assert {c: n for c, n in unlooked.counts().items() if n} == {"duplicated": 1}


def test_an_acknowledgement_without_an_offset_is_not_held_to_one() -> None:
    sends = {1: Send(0, acknowledged=True, offset=-1)}
    assert check(TOPIC, sends, {0: [(5, _value(1))]}).ok


def test_stamps_round_trip_and_foreign_values_are_none() -> None:
    stamp = Stamp(Incarnation("faults-b", 3), 2, 12345)
    assert parse_stamp(stamp.value()) == stamp
    for value in (None, b"", b"faults|a|b|c|d", b"other|faults-b|3|2|1", b"faults|x|1|2"):
        assert parse_stamp(value) is None


def test_the_ledger_counts_what_was_settled_and_forgets_checked_incarnations() -> None:
    ledger = Ledger()
    first, second, third = (ledger.send(TOPIC, p) for p in (0, 1, 2))
    assert len({first.sequence, second.sequence, third.sequence}) == 3
    ledger.delivered(first, None, 7)
    ledger.delivered(second, "_MSG_TIMED_OUT", -1)
    ledger.unsent(third)
    sends = ledger.sends(TOPIC)
    assert sorted(sends) == [first.sequence, second.sequence]
    assert sends[first.sequence].offset == 7
    assert (ledger.acknowledged, ledger.failed, dict(ledger.errors)) == (
        1,
        1,
        {"_MSG_TIMED_OUT": 1},
    )
    ledger.forget(TOPIC)
    assert ledger.sends(TOPIC) == {}
    assert ledger.acknowledged == 1


def test_the_schedule_is_the_seeds_alone() -> None:
    settings = Settings(faults=200, seed=11)
    schedule = draw(settings)
    assert schedule == draw(settings)
    assert schedule != draw(Settings(faults=200, seed=12))
    assert {f.kind for f in schedule} == set(FAULT_KINDS)
    assert {f.node for f in schedule} == {1, 2, 3}
    assert all(f.topic in settings.topic_names() for f in schedule if f.kind == "recreate")
    assert any(f.node_down for f in schedule)
    assert draw(Settings(faults=20, seed=11)) == schedule[:20]
