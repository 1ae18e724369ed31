"""`broker.heap.HeapPolicy`: what lives through a full collection is frozen, out of the
collector's reach (the next full collection walks only what came since); every `rescan_s` it
is put back, so that cycles among once-frozen objects that died meanwhile are freed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from broker.heap import HeapPolicy

pytestmark = pytest.mark.unit


class Node:
    """A cycle: reference counting alone never frees it."""

    def __init__(self) -> None:
        self.me = self


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy() -> Iterator[tuple[HeapPolicy, Clock]]:
    clock = Clock()
    heap = HeapPolicy(rescan_s=600, clock=clock)
    heap.install()
    try:
        yield heap, clock
    finally:
        heap.uninstall()
        gc.unfreeze()  # the rest of the test session as it was
        gc.collect()


def test_the_survivors_of_a_full_collection_are_frozen(
    policy: tuple[HeapPolicy, Clock],
) -> None:
    survivor = Node()
    gc.collect()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert not gc.is_tracked(survivor) or all(o is not survivor for o in gc.get_objects())
    gc.collect(0)  # a young collection freezes nothing (frozen objects may still die: their
    assert gc.get_freeze_count() <= frozen  # reference counts drop, in any thread)


def test_frozen_garbage_is_freed_after_the_rescan(policy: tuple[HeapPolicy, Clock]) -> None:
    heap, clock = policy
    cycle = Node()
    gone = weakref.ref(cycle)
    gc.collect()  # it survives, and is frozen
    del cycle
    gc.collect()
    assert gone() is not None, "a frozen cycle is out of the collector's reach"
    clock.now += 599
    gc.collect()
    assert gone() is not None
    clock.now += 1
    gc.collect()  # due: the frozen objects go back to the collector
    assert heap.rescans == 1
    gc.collect()  # the full walk frees the dead cycle
    assert gone() is None
    assert gc.get_freeze_count() > 0, "what still lives is frozen again"
