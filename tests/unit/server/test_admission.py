"""Admission control's bookkeeping: connection quotas per address and in total, and the
request memory pool (Kafka's non-strict SimpleMemoryPool) with its waiters."""

from __future__ import annotations

from broker.server.admission import ConnectionQuotas, MemoryPool


def test_an_address_over_its_limit_is_refused_and_others_are_not() -> None:
    quotas = ConnectionQuotas(max_connections=10, max_per_ip=2, overrides={"10.0.0.9": 0})

    assert quotas.admit("10.0.0.1") is None
    assert quotas.admit("10.0.0.1") is None
    refused = quotas.admit("10.0.0.1")
    assert refused is not None
    assert "maximum of 2 connections" in refused
    assert quotas.admit("10.0.0.2") is None
    assert quotas.admit("10.0.0.9") is not None  # its override allows none
    quotas.release("10.0.0.1")
    assert quotas.admit("10.0.0.1") is None
    assert quotas.total == 3


def test_the_broker_wide_limit_counts_every_address() -> None:
    quotas = ConnectionQuotas(max_connections=2, max_per_ip=5)
    assert quotas.admit("a") is None
    assert quotas.admit("b") is None
    refused = quotas.admit("c")
    assert refused is not None
    assert "max.connections=2" in refused
    quotas.release("a")
    assert quotas.admit("c") is None


def test_the_pool_grants_while_anything_is_left_and_wakes_waiters_in_turn() -> None:
    pool = MemoryPool(100)
    assert pool.try_reserve(80)
    assert pool.try_reserve(80)  # non-strict: 20 were left, so it runs over by one request
    assert pool.used == 160
    assert not pool.try_reserve(1)
    woken: list[str] = []
    pool.wait(lambda: woken.append("first"))
    pool.wait(lambda: woken.append("second"))

    pool.release(60)  # still nothing left: nobody is woken
    assert woken == []
    pool.release(80)
    assert woken == ["first", "second"]
    assert pool.available == 80


def test_a_forgotten_waiter_is_not_woken_and_no_bound_means_no_bookkeeping() -> None:
    pool = MemoryPool(10)
    assert pool.try_reserve(10)
    woken: list[int] = []

    def wake() -> None:
        woken.append(1)

    pool.wait(wake)
    pool.forget(wake)
    pool.release(10)
    assert woken == []

    unbounded = MemoryPool(None)
    assert unbounded.try_reserve(10**12)
    assert unbounded.used == 0
