"""Fixtures shared by the integration scenarios: one `gregor broker` per test module (`node`),
one broker of each kind per module for the scenarios that run against both (`broker`), and a
garbage collection after every test (`_collect_garbage`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tests.support.brokers import BROKERS, RunningBroker, run_broker
from tests.support.nodes import RunningNode, run_node


@pytest.fixture(scope="module")
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningNode]:
    """One `gregor broker` for the whole test module, stopped (and its clean exit checked)
    after the module's last test."""
    with run_node(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as running:
        yield running


@pytest.fixture(scope="module", params=BROKERS)
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningBroker]:
    """One broker per test module and kind: Gregor, then Apache Kafka (the scenario's check)."""
    with run_broker(request.param, tmp_path_factory.mktemp(request.param)) as running:
        yield running


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """A full collection after each test: a socket or client that a test leaves behind for the
    garbage collector then warns (an error here) in that test's own teardown, not in whichever
    later test happens to set off the next full collection. It costs about 80 ms a test, 15 s
    of the tier's 6 minutes."""
    yield
    gc.collect()
