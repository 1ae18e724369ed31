"""`MetadataService.topic_log_config`: a topic's storage settings, resolved once per set of
settings and kept, follow every change of the topic's own, this broker's dynamic, and the
cluster's dynamic settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.metadata import BROKER_RESOURCE, TOPIC_RESOURCE
from tests.unit.quorum.test_brokers_service import _service

pytestmark = pytest.mark.unit

DAY_MS = 24 * 3600 * 1000


def test_a_topics_settings_follow_each_layer_of_the_chain(tmp_path: Path) -> None:
    service = _service(tmp_path, {"log.retention.hours": "48"})
    configs = service.image.configs
    assert service.topic_log_config("t").retention_ms == 2 * DAY_MS
    assert service.topic_log_config("t") is service.topic_log_config("u")  # kept, shared

    configs[(BROKER_RESOURCE, "")] = {"log.retention.ms": str(3 * DAY_MS)}
    assert service.topic_log_config("t").retention_ms == 3 * DAY_MS
    configs[(BROKER_RESOURCE, "1")] = {"log.retention.ms": str(4 * DAY_MS)}
    assert service.topic_log_config("t").retention_ms == 4 * DAY_MS
    configs[(TOPIC_RESOURCE, "t")] = {"retention.ms": str(DAY_MS)}
    assert service.topic_log_config("t").retention_ms == DAY_MS
    assert service.topic_log_config("u").retention_ms == 4 * DAY_MS

    configs[(TOPIC_RESOURCE, "t")]["retention.ms"] = str(5 * DAY_MS)  # changed in place
    assert service.topic_log_config("t").retention_ms == 5 * DAY_MS
    del configs[(BROKER_RESOURCE, "1")]
    assert service.topic_log_config("u").retention_ms == 3 * DAY_MS
