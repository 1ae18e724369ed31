"""`gregor operator --log-format json`: one JSON object per line, naming the resource a line
is about, for log collectors; and kopf's per-reconciliation "handler succeeded" lines kept
out unless the level is DEBUG."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from gregor_operator.main import configure_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root, objects = logging.getLogger(), logging.getLogger("kopf.objects")
    aio = logging.getLogger("asyncio")  # kopf.configure silences it below DEBUG
    handlers, level, objects_level = list(root.handlers), root.level, objects.level
    aio_handlers, aio_propagates = list(aio.handlers), aio.propagate
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    objects.setLevel(objects_level)
    aio.handlers[:] = aio_handlers
    aio.propagate = aio_propagates


@pytest.mark.usefixtures("restored_logging")
def test_json_lines_name_the_resource_and_keep_the_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logging.getLogger().setLevel(logging.INFO)
    configure_logging("json")
    logging.getLogger("gregor_operator.kafka").info("cluster at %s did not answer", "b:9092")
    logging.getLogger("gregor_operator.kafka").debug("not at INFO")
    objects = logging.getLogger("kopf.objects")
    objects.info("Handler 'cluster_changed' succeeded.")
    objects.error("Handler failed", extra={"k8s_ref": {"namespace": "apps", "name": "gregor"}})
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["severity"], line["message"]) for line in lines] == [
        ("info", "cluster at b:9092 did not answer"),
        ("error", "Handler failed"),
    ]
    assert lines[1]["object"] == {"namespace": "apps", "name": "gregor"}


@pytest.mark.usefixtures("restored_logging")
def test_at_debug_kopfs_own_lines_are_kept() -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    configure_logging("text")
    assert logging.getLogger("kopf.objects").isEnabledFor(logging.INFO)
