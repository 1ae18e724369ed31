"""A `gregor broker` process that real clients bootstrap from, that refuses hostile input
without losing other clients, and that starts and stops as operators expect."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from broker.protocol import (
    SUPPORTED,
    ApiKey,
    ErrorCode,
    FrameReader,
    RequestHeader,
    build,
    decode_response,
    encode_request,
    request_type,
)
from broker.protocol.messages import request_module
from broker.storage.meta_properties import read_meta_properties
from tests.integration.clients import QUIET, admin_client, create_topic
from tests.support.kafka_dist import format_storage, start_kafka
from tests.support.kafka_python import close_kafka_python
from tests.support.nodes import (
    RunningNode,
    free_port,
    refused_start,
    run_node,
    spawn_node,
    wait_listening,
)
from tests.support.wire import exchange


def _api_versions(sock: socket.socket, version: int) -> Any:
    body = build(
        request_type(ApiKey.API_VERSIONS, version),
        client_software_name="gregor-tests",
        client_software_version="1",
    )
    frame = exchange(
        sock, encode_request(RequestHeader(ApiKey.API_VERSIONS, version, 7, "t"), body)
    )
    assert frame is not None
    return decode_response(ApiKey.API_VERSIONS, 0 if version > 4 else version, frame)[1]


def _empty_metadata_request() -> Any:
    return build(
        request_type(ApiKey.METADATA, 12),
        topics=(),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_confluent_kafka_bootstraps_and_sees_this_broker(node: RunningNode) -> None:
    metadata: Any = admin_client(node.bootstrap).list_topics(timeout=10)
    assert list(metadata.brokers) == [1]
    assert (metadata.brokers[1].host, metadata.brokers[1].port) == ("localhost", node.port)
    assert metadata.cluster_id is not None
    assert len(metadata.cluster_id) == 22


# kafka-python loads its schemas with importlib.resources.read_text, deprecated on 3.11–3.12;
# imported here so that these filters, which pytest applies while the test runs, cover it.
@pytest.mark.filterwarnings(
    "ignore:read_text is deprecated:DeprecationWarning:kafka.protocol.schemas.load_json"
)
@pytest.mark.filterwarnings(
    "ignore:open_text is deprecated:DeprecationWarning:importlib.resources._legacy"
)
def test_kafka_python_and_aiokafka_bootstrap(node: RunningNode) -> None:
    from aiokafka import AIOKafkaClient  # noqa: PLC0415
    from kafka import KafkaAdminClient  # noqa: PLC0415

    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10_000)
    try:
        assert admin.describe_cluster()["brokers"][0]["port"] == node.port
    finally:
        close_kafka_python(admin)

    async def bootstrap() -> set[int]:
        client = AIOKafkaClient(bootstrap_servers=node.bootstrap)
        try:
            await client.bootstrap()
            return {b.nodeId for b in client.cluster.brokers()}
        finally:
            await client.close()

    assert asyncio.run(bootstrap()) == {1}


def test_only_apis_with_handlers_are_advertised(node: RunningNode) -> None:
    with socket.create_connection(("localhost", node.port), timeout=10) as sock:
        response = _api_versions(sock, 3)
    assert response.error_code == ErrorCode.none
    advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    served = {
        ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA,
        ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR,
        ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP,
        ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS, ApiKey.API_VERSIONS,
        ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.DELETE_RECORDS,
        ApiKey.INIT_PRODUCER_ID, ApiKey.DESCRIBE_CONFIGS, ApiKey.ALTER_CONFIGS,
        ApiKey.DESCRIBE_LOG_DIRS, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_GROUPS,
        ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.OFFSET_DELETE, ApiKey.DESCRIBE_CLUSTER,
        ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        ApiKey.LIST_PARTITION_REASSIGNMENTS, ApiKey.UNREGISTER_BROKER,
        ApiKey.DESCRIBE_QUORUM, ApiKey.LIST_CONFIG_RESOURCES, ApiKey.DESCRIBE_TOPIC_PARTITIONS,
    }  # fmt: skip
    assert set(advertised) == served  # nothing without a handler (SASL, Raft, transactions)
    assert advertised == {key: (SUPPORTED[key].min, SUPPORTED[key].max) for key in served}
    # Kafka 4.3's maxima, topic ids included (Produce v13, Fetch v13+).
    assert advertised[ApiKey.PRODUCE] == (0, 13)
    assert advertised[ApiKey.FETCH] == (4, 18)


def test_api_versions_at_a_future_version_is_answered_so_the_client_can_retry(
    node: RunningNode,
) -> None:
    with socket.create_connection(("localhost", node.port), timeout=10) as sock:
        frame = struct.pack(">hhihb", ApiKey.API_VERSIONS, 99, 5, -1, 0)
        response = exchange(sock, struct.pack(">i", len(frame)) + frame)
        assert response is not None
        body: Any = decode_response(ApiKey.API_VERSIONS, 0, response)[1]
        assert body.error_code == ErrorCode.unsupported_version
        # The connection stays usable for the retry.
        assert _api_versions(sock, 3).error_code == ErrorCode.none


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(b"\xde\xad\xbe\xef" * 8, id="garbage"),
        pytest.param(struct.pack(">i", 200 * 1024 * 1024), id="oversized-frame"),
        pytest.param(struct.pack(">i", -3), id="negative-size"),
        pytest.param(struct.pack(">ihhih", 10, 999, 0, 1, -1), id="unknown-api-key"),
        pytest.param(struct.pack(">ihhih", 10, ApiKey.PRODUCE, 1, 1, -1), id="produce-v1"),
        pytest.param(
            struct.pack(">ihhih", 14, ApiKey.METADATA, 1, 1, -1) + b"\x7f\xff\xff\xff",
            id="hostile-array-length",
        ),
    ],
)
def test_hostile_input_closes_that_connection_and_others_are_served(
    node: RunningNode, hostile: bytes
) -> None:
    with (
        socket.create_connection(("localhost", node.port), timeout=10) as bystander,
        socket.create_connection(("localhost", node.port), timeout=10) as attacker,
    ):
        assert _api_versions(bystander, 3).error_code == ErrorCode.none
        assert exchange(attacker, hostile) is None  # closed, nothing answered
        assert _api_versions(bystander, 3).error_code == ErrorCode.none


def test_pipelined_requests_are_answered_in_order(node: RunningNode) -> None:
    frames = b"".join(
        encode_request(
            RequestHeader(ApiKey.METADATA, 12, correlation_id, "pipeline"),
            _empty_metadata_request(),
        )
        for correlation_id in range(50)
    )
    with socket.create_connection(("localhost", node.port), timeout=10) as sock:
        sock.sendall(frames)
        reader = FrameReader()
        seen: list[int] = []
        while len(seen) < 50:
            reader.receive_data(sock.recv(65536))
            while (frame := reader.next_frame()) is not None:
                seen.append(decode_response(ApiKey.METADATA, 12, frame)[0])
    assert seen == list(range(50))


def test_a_client_that_never_reads_does_not_stop_the_broker(node: RunningNode) -> None:
    request = encode_request(
        RequestHeader(ApiKey.METADATA, 12, 1, "slow"), _empty_metadata_request()
    )
    with socket.create_connection(("localhost", node.port), timeout=10) as slow:
        slow.setblocking(False)
        sent = 0
        try:
            for _ in range(20_000):
                sent += slow.send(request)
        except BlockingIOError:
            pass
        assert sent > 0
        with socket.create_connection(("localhost", node.port), timeout=10) as other:
            assert _api_versions(other, 3).error_code == ErrorCode.none


def test_invalid_config_stops_the_node_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text(f"listeners=PLAINTEXT://localhost:{free_port()}\nnum.partitions=zero\n")
    assert "num.partitions" in refused_start(config)


def _sasl_ssl_listener(plain: int, external: int) -> dict[str, str]:
    """Issue 25's node: a PLAINTEXT listener and an EXTERNAL one its map makes SASL_SSL, with
    no JAAS login nor keystore configured."""
    return {
        "listeners": f"PLAINTEXT://localhost:{plain},EXTERNAL://localhost:{external}",
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,EXTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT"
        ),
    }


def _refused_connection(port: int) -> bool:
    try:
        socket.create_connection(("localhost", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_listener_gregor_cannot_secure_stops_the_node_before_it_listens(
    tmp_path: Path,
) -> None:
    """Served in plaintext, a port its user believes encrypted and authenticated would not be:
    the node refuses to start, names the key and the protocol, and opens no port."""
    plain, external = free_port(), free_port()
    properties = _sasl_ssl_listener(plain, external) | {"log.dirs": str(tmp_path / "logs")}
    config = tmp_path / "server.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    said = refused_start(config)
    assert "listener.security.protocol.map" in said
    assert "listener EXTERNAL uses SASL_SSL" in said
    assert _refused_connection(plain)
    assert _refused_connection(external)
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_kafka_too_refuses_a_sasl_ssl_listener_it_has_no_login_for(tmp_path: Path) -> None:
    """The same node on Apache Kafka 4.3.1 exits non-zero at start, before serving either
    port: the refusal above is Kafka's behaviour, not a stricter one."""
    plain, external, controller = free_port(), free_port(), free_port()
    properties = _sasl_ssl_listener(plain, external)
    properties["listeners"] += f",CONTROLLER://localhost:{controller}"
    properties |= {
        "advertised.listeners": f"PLAINTEXT://localhost:{plain},EXTERNAL://localhost:{external}",
        "controller.quorum.voters": f"1@localhost:{controller}",
    }
    with pytest.raises(RuntimeError, match=r"^Kafka exited with [1-9]"):
        start_kafka(tmp_path, properties).stop()
    said = (tmp_path / "kafka.log").read_text(errors="replace")
    assert "Exiting Kafka due to fatal exception during startup" in said
    assert "Could not find a 'KafkaServer' or 'external.KafkaServer' entry in the JAAS" in said
    assert _refused_connection(plain)
    assert _refused_connection(external)


def test_a_log_dir_of_another_cluster_is_refused(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "meta.properties").write_text("version=1\ncluster.id=someoneelse\nnode.id=2\n")
    config = tmp_path / "server.properties"
    config.write_text(
        f"node.id=1\nlisteners=PLAINTEXT://localhost:{free_port()}\nlog.dirs={logs}\n"
    )
    assert "belongs to node 2" in refused_start(config)


def _write(config: Path, properties: dict[str, str]) -> Path:
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    return config


def test_a_voter_refuses_an_unformatted_metadata_log_dir_and_says_what_to_do(
    tmp_path: Path,
) -> None:
    """Kafka's REQUIRE_METADATA_LOG_DIR: an empty metadata log dir is a new node's or a lost
    one's. A voter formatted anew would vote as a voter that lost its log, so the node does
    not format it: it names the dir, the command for a new node, and what to do instead."""
    controller = free_port()
    config = _write(
        tmp_path / "server.properties",
        {
            "node.id": "2",
            "process.roles": "broker,controller",
            "controller.quorum.voters": f"1@localhost:{free_port()},2@localhost:{controller}",
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://localhost:{free_port()},CONTROLLER://localhost:{controller}",
            "log.dirs": f"{tmp_path / 'a'},{tmp_path / 'b'}",
        },
    )
    said = refused_start(config)
    assert f"the metadata log dir {tmp_path / 'a'} is not formatted" in said
    assert f"gregor format --config {config} --cluster-id <the cluster id>" in said
    assert "Node 2 is a voter of the metadata quorum" in said
    assert "vote as a voter that lost its log" in said
    assert "Recover the dir from a backup, or replace the voter" in said
    assert not (tmp_path / "a" / "meta.properties").exists()
    assert not (tmp_path / "b").exists(), "nothing is formatted"
    # Told the cluster's id, it still formats nothing: --cluster-id only checks.
    told = _gregor("broker", "--config", str(config), "--cluster-id=ToldTheClusterIdXXXXXX")
    assert told.returncode == 1
    assert "--cluster-id ToldTheClusterIdXXXXXX" in told.stderr
    assert not (tmp_path / "a" / "meta.properties").exists()


def test_a_broker_refuses_an_unformatted_metadata_log_dir_and_says_what_to_do(
    tmp_path: Path,
) -> None:
    config = _write(
        tmp_path / "server.properties",
        {
            "node.id": "3",
            "process.roles": "broker",
            "controller.quorum.voters": f"1@localhost:{free_port()}",
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://localhost:{free_port()}",
            "log.dirs": str(tmp_path / "logs"),
            "metadata.log.dir": str(tmp_path / "metadata"),
        },
    )
    said = refused_start(config)
    assert f"the metadata log dir {tmp_path / 'metadata'} is not formatted" in said
    assert "it comes back as a new directory" in said
    assert "voter" not in said
    assert not (tmp_path / "logs").exists()


def test_an_empty_log_dir_beside_a_formatted_metadata_log_dir_comes_back_as_a_new_directory(
    tmp_path: Path,
) -> None:
    """A replaced JBOD disk: the node formats it at start with a new directory id (the
    controller takes the replicas of the old one as lost) and serves."""
    port = free_port()
    logs = [tmp_path / "a", tmp_path / "b"]
    properties = _combined(port, logs)
    node = spawn_node(tmp_path, properties, port)
    try:
        wait_listening(node)
        before = read_meta_properties(logs[1])
    finally:
        assert node.stop() == 0
    shutil.rmtree(logs[1])
    logs[1].mkdir()
    node.restart()  # not formatted by anyone: the node does it
    try:
        wait_listening(node)
        metadata: Any = admin_client(node.bootstrap).list_topics(timeout=10)
    finally:
        assert node.stop() == 0
    after = read_meta_properties(logs[1])
    assert before is not None
    assert after is not None
    cluster = before.cluster_id
    assert (after.cluster_id, after.node_id, metadata.cluster_id) == (cluster, 1, cluster)
    assert after.directory_id not in (before.directory_id, None)
    assert f"log dir {logs[1]} was empty: formatted for cluster {cluster}" in node.log_tail()


def _combined(port: int, log_dirs: list[Path]) -> dict[str, str]:
    """A single combined node's settings, on `log_dirs`."""
    return {
        "node.id": "1",
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://localhost:{port}",
        "log.dirs": ",".join(map(str, log_dirs)),
        "offsets.topic.replication.factor": "1",
    }


def _gregor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_gregor_format_gives_the_dirs_their_identity_and_the_node_serves_them(
    tmp_path: Path,
) -> None:
    logs = [tmp_path / "a", tmp_path / "b"]
    port = free_port()
    properties = _combined(port, logs)
    config = tmp_path / "server.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    formatted = _gregor("format", "--config", str(config), "--cluster-id", "FormattedByGregor")
    assert formatted.returncode == 0, formatted.stderr
    assert formatted.stdout.count(": formatted (directory.id ") == 2
    identities = [read_meta_properties(d) for d in logs]
    assert {m.cluster_id for m in identities if m is not None} == {"FormattedByGregor"}

    again = _gregor("format", "--config", str(config), "--cluster-id", "FormattedByGregor")
    assert again.returncode == 1
    assert "is formatted already" in again.stderr
    kept = _gregor(
        "format", "--config", str(config), "--cluster-id", "FormattedByGregor", "--ignore-formatted"
    )
    assert kept.returncode == 0, kept.stderr
    assert [read_meta_properties(d) for d in logs] == identities, "directory ids are kept"

    node = spawn_node(tmp_path, properties, port)  # no --cluster-id: the dirs have it
    try:
        wait_listening(node)
        assert admin_client(node.bootstrap).list_topics(timeout=10).cluster_id == (
            "FormattedByGregor"
        )
    finally:
        assert node.stop() == 0


@pytest.mark.slow
def test_kafkas_storage_tool_writes_what_gregor_reads(tmp_path: Path) -> None:
    """The same `meta.properties` on both sides: a dir Kafka's `kafka-storage format` made
    names its cluster, node and directory id to Gregor too."""
    controller = free_port()
    config = tmp_path / "kafka.properties"
    config.write_text(
        "process.roles=broker,controller\nnode.id=7\n"
        f"controller.quorum.voters=7@localhost:{controller}\n"
        "controller.listener.names=CONTROLLER\n"
        f"listeners=PLAINTEXT://localhost:{free_port()},CONTROLLER://localhost:{controller}\n"
        f"log.dirs={tmp_path / 'data'}\n"
    )
    format_storage(config, "MkU3OEVBNTcwNTJENDM2Qk")
    found = read_meta_properties(tmp_path / "data")
    assert found is not None
    assert (found.cluster_id, found.node_id) == ("MkU3OEVBNTcwNTJENDM2Qk", 7)
    assert found.directory_id is not None


def test_restart_keeps_the_cluster_id(tmp_path: Path) -> None:
    with run_node(tmp_path) as first:
        before = admin_client(first.bootstrap).list_topics(timeout=10)
    with run_node(tmp_path) as second:
        after = admin_client(second.bootstrap).list_topics(timeout=10)
    assert after.cluster_id == before.cluster_id


def test_idle_connections_close_after_connections_max_idle_ms(tmp_path: Path) -> None:
    with (
        run_node(tmp_path, {"connections.max.idle.ms": "300"}) as short,
        socket.create_connection(("localhost", short.port), timeout=10) as sock,
    ):
        assert _api_versions(sock, 3).error_code == ErrorCode.none
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the broker closed it


def _fetch_everything(topic: str) -> bytes:
    schema = request_module(ApiKey.FETCH, 12)
    partition = build(
        schema.FetchPartition,
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=64 * 1024 * 1024,
    )
    body = build(
        schema.FetchRequest,
        cluster_id=None,
        replica_id=-1,
        max_wait=timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=64 * 1024 * 1024,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(build(schema.FetchTopic, topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    return encode_request(RequestHeader(ApiKey.FETCH, 12, 5, "never-reads"), body)


def _open_files(process: subprocess.Popen[str]) -> int:
    return len(os.listdir(f"/proc/{process.pid}/fd"))


def _segment_descriptors(process: subprocess.Popen[str], topic: str) -> int:
    """Descriptors the broker holds on the topic's `.log` files: one per segment, plus one per
    Fetch response region pinned while it waits for the socket."""
    held = 0
    for fd in os.listdir(f"/proc/{process.pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{process.pid}/fd/{fd}")
            held += f"/{topic}-0/" in target and target.endswith(".log")
    return held


def test_a_consumer_that_stops_reading_is_cut_off_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """A Fetch response waits on the socket holding its segment files open (zero-copy); a
    client that never reads it loses its connection after `connections.max.idle.ms`, and the
    files are let go, while everyone else is served throughout."""
    with run_node(tmp_path, {"connections.max.idle.ms": "1000"}) as node:
        create_topic(node.bootstrap, "big", partitions=1)
        producer = Producer({"bootstrap.servers": node.bootstrap, **QUIET})
        for _ in range(8 * 1024):
            producer.produce("big", os.urandom(1024))
            producer.poll(0)
        assert producer.flush(30) == 0
        baseline = _open_files(node.process)
        segments = _segment_descriptors(node.process, "big")
        with socket.socket() as stuck:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.connect(("localhost", node.port))
            stuck.sendall(_fetch_everything("big"))
            deadline = time.monotonic() + 10
            while _segment_descriptors(node.process, "big") == segments:
                assert time.monotonic() < deadline, "the response never pinned its segment"
                time.sleep(0.05)
            with socket.create_connection(("localhost", node.port), timeout=10) as other:
                assert _api_versions(other, 3).error_code == ErrorCode.none
            deadline = time.monotonic() + 20
            while (
                _open_files(node.process) > baseline
                or _segment_descriptors(node.process, "big") > segments
            ) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _open_files(node.process) <= baseline
            assert _segment_descriptors(node.process, "big") == segments
            received = 0
            stuck.settimeout(10)
            with contextlib.suppress(ConnectionResetError):
                while chunk := stuck.recv(1 << 20):
                    received += len(chunk)
        assert 0 < received < 8 * 1024 * 1024, "the response was cut off, not completed"
