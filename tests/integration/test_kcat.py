"""kcat, Debian's build on librdkafka 2.0.x (`make install` installs it), against a broker:
metadata with `-L`, keyed messages produced with `-P` in every codec and read back with `-C -e`.

As in test_kafka_tools, each scenario runs against Gregor and against Apache Kafka itself, and
checks first that the broker serves every API it needs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from broker.protocol import ApiKey
from tests.integration.clients import create_topic
from tests.support.brokers import RunningBroker, require_apis

KCAT_TIMEOUT = 60.0
TOPIC_METADATA = (ApiKey.METADATA, ApiKey.CREATE_TOPICS)


def kcat(broker: RunningBroker, *args: str, stdin: str | None = None) -> str:
    """Run kcat against `broker`; its stdout. A missing kcat is a failure: `make install`."""
    executable = shutil.which("kcat")
    assert executable, "kcat is not installed: `make install` installs Debian's kcat"
    result = subprocess.run(
        [executable, "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=KCAT_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, (
        f"kcat {' '.join(args)}: exit {result.returncode}\n{result.stderr}"
    )
    return result.stdout


def test_metadata_lists_this_broker(broker: RunningBroker) -> None:
    require_apis(broker, (ApiKey.METADATA,))
    metadata: Any = json.loads(kcat(broker, "-L", "-J"))
    assert [(b["id"], b["name"]) for b in metadata["brokers"]] == [(1, broker.bootstrap)]


def test_metadata_of_a_topic_lists_its_partitions_and_leaders(broker: RunningBroker) -> None:
    require_apis(broker, TOPIC_METADATA)
    create_topic(broker.bootstrap, "kcat-described", 3)
    metadata: Any = json.loads(kcat(broker, "-L", "-J", "-t", "kcat-described"))
    [topic] = metadata["topics"]
    assert topic["topic"] == "kcat-described"
    assert "error" not in topic, topic
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    assert {p["leader"] for p in topic["partitions"]} == {1}
    assert all(p["isrs"] == [{"id": 1}] for p in topic["partitions"]), topic


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_keyed_messages_produced_are_consumed_back(broker: RunningBroker, codec: str) -> None:
    require_apis(broker, (*TOPIC_METADATA, ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS))
    topic = f"kcat-{codec}"
    create_topic(broker.bootstrap, topic, 2)
    lines = [f"{key}:{key}-{n}" for n in range(20) for key in ("alpha", "beta", "gamma")]
    kcat(
        broker,
        "-P",
        "-t",
        topic,
        "-K",
        ":",
        "-z",
        codec,
        "-H",
        "origin=kcat",
        "-X",
        "linger.ms=50",
        stdin="".join(f"{line}\n" for line in lines),
    )

    out = kcat(broker, "-C", "-e", "-t", topic, "-o", "beginning", "-f", "%p|%k|%s|%h\n")
    records = [line.split("|") for line in out.splitlines()]
    assert len(records) == len(lines), out
    by_key: dict[str, list[str]] = {}
    partitions: dict[str, set[str]] = {}
    for partition, key, value, headers in records:
        by_key.setdefault(key, []).append(value)
        partitions.setdefault(key, set()).add(partition)
        assert headers == "origin=kcat"
    assert by_key == {key: [f"{key}-{n}" for n in range(20)] for key in ("alpha", "beta", "gamma")}
    assert all(len(p) == 1 for p in partitions.values()), partitions
