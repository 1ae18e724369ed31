"""Fixtures shared by the integration scenarios that run against both brokers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.brokers import BROKERS, RunningBroker, run_broker


@pytest.fixture(scope="module", params=BROKERS)
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningBroker]:
    """One broker per test module and kind: Gregor, then Apache Kafka (the scenario's check)."""
    with run_broker(request.param, tmp_path_factory.mktemp(request.param)) as running:
        yield running
