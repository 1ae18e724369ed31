"""The test harness's `free_port`: the listeners of one cluster are chosen before any of them
binds, so a port must never be handed out twice (a clash fails a node's start with "address
already in use")."""

from __future__ import annotations

import pytest

from tests.support.nodes import free_port

pytestmark = pytest.mark.unit


def test_no_port_is_handed_out_twice() -> None:
    ports = [free_port() for _ in range(2_000)]
    assert len(set(ports)) == len(ports)
