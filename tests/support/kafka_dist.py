"""Apache Kafka itself, from Maven Central: its command-line tools and a single-node KRaft broker.

What it owns: the pinned Kafka release and the cache of its jars outside the repository
(`~/.cache/gregor/kafka/<version>/libs`, or under `$GREGOR_CACHE`), and of the message and
metadata record schemas its jars carry (`<version>/protocol`, which the conformance tests read),
fetched once with Maven and a generated pom, under a file lock so that concurrent test processes
share one fetch; running Kafka's tools by main class (`java -cp '<libs>/*' <MainClass> …`) with
a timeout and their output captured; and starting, waiting for and stopping an Apache Kafka
broker on free loopback ports. It is the reference peer that proves a scenario right before it
runs against Gregor.

What it must never do: be imported by the broker; fetch anything but Maven artifacts; write into
the repository; leave a JVM running after the context that started it.

`python -m tests.support.kafka_dist` fetches the jars (`make kafka-dist`) and prints where.

Why 4.3.1: it is the newest release whose artifacts are all on Maven Central. Central already
lists kafka-clients, kafka-server and kafka_2.13 at 4.4.0, but not kafka-tools nor
kafka-tools-api 4.4.0, which kafka_2.13 4.4.0 depends on, so 4.4.0 cannot be resolved yet.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from tests.support.nodes import free_port

__all__ = [
    "BROKER_API_VERSIONS_COMMAND",
    "CLUSTER_TOOL",
    "CONFIG_COMMAND",
    "CONSOLE_CONSUMER",
    "CONSOLE_PRODUCER",
    "CONSUMER_GROUP_COMMAND",
    "CONSUMER_PERFORMANCE",
    "DELETE_RECORDS_COMMAND",
    "KAFKA_VERSION",
    "LEADER_ELECTION_COMMAND",
    "LOG_DIRS_COMMAND",
    "PRODUCER_PERFORMANCE",
    "REASSIGN_PARTITIONS_COMMAND",
    "TOPIC_COMMAND",
    "KafkaBroker",
    "KafkaTools",
    "ToolFailed",
    "ToolResult",
    "cache_dir",
    "fetch",
    "protocol_schemas",
    "run_kafka",
    "run_tool",
    "start_kafka",
    "start_kafka_cluster",
    "stop_kafka_cluster",
]

KAFKA_VERSION = "4.3.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.25.4"
"""The log4j2 that kafka_2.13 4.3.1 depends on; its SLF4J 1.x binding has the same version."""
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# Main classes of Kafka 4.3's scripts (bin/kafka-*.sh name the same classes).
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"
PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERFORMANCE = "org.apache.kafka.tools.ConsumerPerformance"
DELETE_RECORDS_COMMAND = "org.apache.kafka.tools.DeleteRecordsCommand"
LEADER_ELECTION_COMMAND = "org.apache.kafka.tools.LeaderElectionCommand"
REASSIGN_PARTITIONS_COMMAND = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
LOG_DIRS_COMMAND = "org.apache.kafka.tools.LogDirsCommand"
BROKER_API_VERSIONS_COMMAND = "org.apache.kafka.tools.BrokerApiVersionsCommand"
CLUSTER_TOOL = "org.apache.kafka.tools.ClusterTool"
STORAGE_TOOL = "kafka.tools.StorageTool"
KAFKA_MAIN = "kafka.Kafka"

_KAFKA_ARTIFACTS = (f"kafka_{SCALA_VERSION}", "kafka-tools", "kafka-clients")
"""The broker (for the benchmark and the reference runs), the tools, the clients."""
_LOGGING = ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION)
"""The SLF4J 1.x binding to log4j2 that Kafka's own distribution ships in libs/."""
_COMPLETE = ".complete"
_FETCH_TIMEOUT = 900.0
_TOOL_TIMEOUT = 120.0
_STARTED = "Kafka Server started"

# Tools: warnings and errors on stderr, so that stdout holds only what the tool prints.
_TOOLS_LOG4J = """\
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = STDERR
"""
# The broker: INFO on stdout, which the launcher sends to a file next to the data.
_BROKER_LOG4J = """\
status = error
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
logger.state.name = state.change.logger
logger.state.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
"""


# -- the jars --------------------------------------------------------------------------------


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Where one Kafka release lives: `$GREGOR_CACHE/kafka/<version>`, by default under
    `~/.cache/gregor`, outside any work tree so that every clone and CI run reuses it."""
    root = os.environ.get("GREGOR_CACHE") or Path.home() / ".cache" / "gregor"
    return Path(root) / "kafka" / version


def _pom(version: str) -> str:
    kafka = tuple(("org.apache.kafka", artifact, version) for artifact in _KAFKA_ARTIFACTS)
    artifacts = (*kafka, _LOGGING)
    dependencies = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{v}</version></dependency>\n"
        for group, artifact, v in artifacts
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "<modelVersion>4.0.0</modelVersion>\n"
        "<groupId>gregor.tests</groupId><artifactId>kafka-dist</artifactId>"
        f"<version>{version}</version><packaging>pom</packaging>\n"
        f"<dependencies>\n{dependencies}</dependencies>\n</project>\n"
    )


def fetch(version: str = KAFKA_VERSION) -> Path:
    """The directory of Kafka's jars (broker, tools, clients, a log4j2 binding), fetched from
    Maven Central on first use. Several processes may call this at once: one fetches under an
    exclusive lock, the others wait for it and reuse its result. The jars appear in one rename,
    so a fetch that dies half way leaves nothing that looks complete."""
    home = cache_dir(version)
    libs = home / "libs"
    if (libs / _COMPLETE).exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (libs / _COMPLETE).exists():
            return libs
        with tempfile.TemporaryDirectory(dir=home, prefix=".fetch-") as scratch:
            work = Path(scratch)
            (work / "pom.xml").write_text(_pom(version))
            _copy_dependencies(work, f"Apache Kafka {version}")
            (work / "libs" / _COMPLETE).touch()
            (home / "tools-log4j2.properties").write_text(_TOOLS_LOG4J)
            (home / "broker-log4j2.properties").write_text(_BROKER_LOG4J)
            shutil.rmtree(libs, ignore_errors=True)
            (work / "libs").rename(libs)
    return libs


def _copy_dependencies(work: Path, what: str, *options: str) -> None:
    """Let Maven resolve `work/pom.xml` and copy its dependencies' jars into `work/libs`."""
    result = subprocess.run(
        [
            "mvn",
            "--batch-mode",
            "--quiet",
            "--file",
            str(work / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={work / 'libs'}",
            "-DincludeScope=runtime",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=_FETCH_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"mvn could not fetch {what} from Maven Central "
            f"(exit {result.returncode}):\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )


_SCHEMA_JARS = {
    "kafka-clients": ("common/message/", "messages"),
    "kafka-metadata": ("common/metadata/", "metadata-records"),
}
"""Where Kafka's jars keep the JSON its message classes are generated from, and the folder of
the schema tree each goes to (the layout of Kafka's `kafka-protocol` reference folder)."""


def protocol_schemas(version: str = KAFKA_VERSION) -> Path:
    """A folder holding `messages/*.json` (the protocol's request, response and header schemas)
    and `metadata-records/*.json` (KRaft's metadata records) of Kafka `version`, taken from
    its kafka-clients and kafka-metadata jars on Maven Central and cached beside its jars.

    The jars come from the full fetch when it has run; otherwise only these two are fetched,
    so that the unit tier does not wait for the whole broker. Extracted under a lock, into a
    scratch folder renamed into place, as `fetch` does."""
    home = cache_dir(version)
    root = home / "protocol"
    if (root / _COMPLETE).exists():
        return root
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".protocol-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / _COMPLETE).exists():
            return root
        with tempfile.TemporaryDirectory(dir=home, prefix=".protocol-") as scratch:
            work = Path(scratch)
            libs = home / "libs"
            if not (libs / _COMPLETE).exists():
                # Straight from Maven Central over HTTPS, checked against its SHA-512: the unit
                # tier must not need Maven (or Java) on a fresh machine.
                libs = work / "libs"
                libs.mkdir()
                for jar in _SCHEMA_JARS:
                    _download_checked(
                        f"{MAVEN_CENTRAL}/org/apache/kafka/{jar}/{version}/{jar}-{version}.jar",
                        libs / f"{jar}-{version}.jar",
                    )
            tree = work / "protocol"
            for jar, (prefix, folder) in _SCHEMA_JARS.items():
                (tree / folder).mkdir(parents=True)
                with zipfile.ZipFile(libs / f"{jar}-{version}.jar") as archive:
                    names = [
                        name
                        for name in archive.namelist()
                        if name.startswith(prefix) and name.endswith(".json")
                    ]
                    if not names:
                        raise RuntimeError(f"{jar}-{version}.jar holds no {prefix}*.json")
                    for name in names:
                        target = tree / folder / name.removeprefix(prefix)
                        target.write_bytes(archive.read(name))
            (tree / _COMPLETE).touch()
            shutil.rmtree(root, ignore_errors=True)
            tree.rename(root)
    return root


MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"


def _download_checked(url: str, target: Path) -> None:
    """`url` into `target`, refused unless it matches the SHA-512 Maven Central publishes."""
    try:
        with urllib.request.urlopen(url + ".sha512", timeout=60) as answer:
            expected = answer.read().decode().split()[0].strip().lower()
        digest = hashlib.sha512()
        with (
            urllib.request.urlopen(url, timeout=_FETCH_TIMEOUT) as answer,
            target.open("wb") as out,
        ):
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        raise RuntimeError(f"could not download {url}: {exc}") from exc
    if digest.hexdigest() != expected:
        raise RuntimeError(f"{url}: SHA-512 {digest.hexdigest()} is not the published {expected}")


def _java(libs: Path, log_config: Path, main_class: str, heap: str, *jvm_options: str) -> list[str]:
    java_home = os.environ.get("JAVA_HOME")
    return [
        str(Path(java_home) / "bin" / "java") if java_home else "java",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        *jvm_options,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        f"{libs}/*",
        main_class,
    ]


# -- the tools -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolResult:
    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        """The command line (main class onwards) and what the tool said, for failure messages."""
        start = next((i for i, arg in enumerate(self.command) if arg == "-cp"), -2) + 2
        return (
            f"$ {' '.join(self.command[start:])}\nexit {self.returncode}\n"
            f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"
        )


class ToolFailed(AssertionError):
    """A Kafka tool exited non-zero or ran past its timeout; the message has its output."""


def run_tool(
    main_class: str,
    *args: str,
    stdin: str | None = None,
    timeout: float = _TOOL_TIMEOUT,
    check: bool = True,
    heap: str = "256m",
) -> ToolResult:
    """Run one of Kafka's tools by its main class, as its bin/ script would; wait for it."""
    libs = fetch()
    command = (*_java(libs, libs.parent / "tools-log4j2.properties", main_class, heap), *args)
    try:
        completed = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as expired:
        result = ToolResult(command, -1, _text(expired.stdout), _text(expired.stderr))
        raise ToolFailed(f"timed out after {timeout} s:\n{result.describe()}") from None
    result = ToolResult(command, completed.returncode, completed.stdout, completed.stderr)
    if check and result.returncode != 0:
        raise ToolFailed(result.describe())
    return result


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


class RunOptions(TypedDict, total=False):
    """`run_tool`'s keyword arguments, which every `KafkaTools` method passes on."""

    stdin: str | None
    timeout: float
    check: bool
    heap: str


@dataclass(frozen=True, slots=True)
class KafkaTools:
    """Kafka's command-line tools pointed at one bootstrap address. Each method takes the tool's
    own arguments after `--bootstrap-server`; keyword arguments go to `run_tool`."""

    bootstrap: str

    def topics(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(TOPIC_COMMAND, args, options)

    def console_producer(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(CONSOLE_PRODUCER, args, options)

    def console_consumer(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(CONSOLE_CONSUMER, args, options)

    def consumer_groups(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(CONSUMER_GROUP_COMMAND, args, options)

    def configs(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(CONFIG_COMMAND, args, options)

    def delete_records(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(DELETE_RECORDS_COMMAND, args, options)

    def producer_perf(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(PRODUCER_PERFORMANCE, args, options)

    def consumer_perf(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(CONSUMER_PERFORMANCE, args, options)

    def leader_election(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(LEADER_ELECTION_COMMAND, args, options)

    def reassign_partitions(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(REASSIGN_PARTITIONS_COMMAND, args, options)

    def log_dirs(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(LOG_DIRS_COMMAND, args, options)

    def broker_api_versions(self, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        return self._run(BROKER_API_VERSIONS_COMMAND, args, options)

    def cluster(self, command: str, *args: str, **options: Unpack[RunOptions]) -> ToolResult:
        """kafka-cluster: its sub-command comes before `--bootstrap-server`."""
        return run_tool(
            CLUSTER_TOOL, command, "--bootstrap-server", self.bootstrap, *args, **options
        )

    def _run(self, main_class: str, args: tuple[str, ...], options: RunOptions) -> ToolResult:
        return run_tool(main_class, "--bootstrap-server", self.bootstrap, *args, **options)


# -- the broker ------------------------------------------------------------------------------


@dataclass
class KafkaBroker:
    """A running single-node KRaft Apache Kafka (broker and controller in one JVM)."""

    process: subprocess.Popen[bytes]
    port: int
    controller_port: int
    directory: Path
    log: Path
    heap: str = "512m"
    node_id: int = 1

    def restart(self, timeout: float = 90.0) -> None:
        """Start it again on its formatted log dir (after a stop); returns once it serves."""
        assert self.process.poll() is not None, "Kafka is still running"
        self.process = _launch(self.directory / "server.properties", self.log, self.heap)
        _wait_started(self, timeout, already=self.log.read_text(errors="replace").count(_STARTED))

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.port}"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (a controlled shutdown), SIGKILL if it has not exited within `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def log_tail(self, characters: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-characters:] if self.log.exists() else ""


def _cluster_id() -> str:
    """A random cluster id as Kafka writes one: 16 bytes, URL-safe base64, unpadded, never
    starting with '-' (Kafka refuses those as look-alikes of command-line options)."""
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not encoded.startswith("-"):
            return encoded


def _kafka_properties(
    directory: Path, node_id: int, port: int, controller_port: int, voters: str
) -> dict[str, str]:
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "listeners": f"PLAINTEXT://localhost:{port},CONTROLLER://localhost:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://localhost:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.quorum.voters": voters,
        "log.dirs": str(directory / "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }


def format_storage(config: Path, cluster_id: str) -> None:
    """`kafka-storage format --cluster-id ID --config FILE`: Kafka's own tool formats the log
    dirs `config` names (its `meta.properties`, with a directory id each)."""
    libs = fetch()
    formatted = subprocess.run(
        [
            *_java(libs, libs.parent / "broker-log4j2.properties", STORAGE_TOOL, "256m"),
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if formatted.returncode != 0:
        raise RuntimeError(f"kafka-storage format failed:\n{formatted.stdout}{formatted.stderr}")


def _launch(config: Path, log: Path, heap: str) -> subprocess.Popen[bytes]:
    libs = fetch()
    log_config = libs.parent / "broker-log4j2.properties"
    with log.open("ab") as output:
        return subprocess.Popen(
            [
                *_java(
                    libs, log_config, KAFKA_MAIN, heap, f"-Xms{heap}", "-XX:MaxGCPauseMillis=20"
                ),
                str(config),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_started(broker: KafkaBroker, timeout: float, already: int = 0) -> None:
    """Until the broker's log says it has started (once more than `already` times)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise RuntimeError(
                f"Kafka exited with {broker.process.returncode}:\n{broker.log_tail()}"
            )
        if broker.log.read_text(errors="replace").count(_STARTED) > already:
            return
        time.sleep(0.2)
    broker.stop()
    raise RuntimeError(f"Kafka did not start within {timeout} s:\n{broker.log_tail()}")


def start_kafka(
    directory: Path,
    extra: Mapping[str, str] | None = None,
    *,
    heap: str = "512m",
    timeout: float = 90.0,
) -> KafkaBroker:
    """Format a KRaft log dir under `directory`, start `kafka.Kafka` on two free loopback ports,
    and return once it logs that it has started (its listeners then serve clients)."""
    port = free_port()
    controller_port = free_port()
    properties = _kafka_properties(
        directory, 1, port, controller_port, f"1@localhost:{controller_port}"
    ) | dict(extra or {})
    config = directory / "server.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    format_storage(config, _cluster_id())
    log = directory / "kafka.log"
    broker = KafkaBroker(_launch(config, log, heap), port, controller_port, directory, log, heap)
    _wait_started(broker, timeout)
    return broker


def stop_kafka_cluster(brokers: list[KafkaBroker], timeout: float = 15.0) -> None:
    """SIGTERM every node at once (stopped one by one, the last ones wait for a quorum that
    has gone), then SIGKILL what has not exited within `timeout`."""
    for broker in brokers:
        if broker.process.poll() is None:
            broker.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for broker in brokers:
        try:
            broker.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            broker.process.kill()
            broker.process.wait()


def start_kafka_cluster(
    directory: Path,
    count: int = 3,
    extra: Mapping[str, str] | None = None,
    *,
    heap: str = "384m",
    timeout: float = 120.0,
    each: Mapping[int, Mapping[str, str]] | None = None,
) -> list[KafkaBroker]:
    """`count` combined Kafka nodes (node ids 1..count, voters of one quorum), each in
    `directory/kafka-<id>`; returns once every one has started. The caller stops them.
    `each` adds settings to one node, by node id."""
    ports = [(free_port(), free_port()) for _ in range(count)]
    voters = ",".join(f"{i}@localhost:{c}" for i, (_, c) in enumerate(ports, start=1))
    cluster_id = _cluster_id()
    brokers: list[KafkaBroker] = []
    try:
        for node_id, (port, controller_port) in enumerate(ports, start=1):
            home = directory / f"kafka-{node_id}"
            home.mkdir(parents=True, exist_ok=True)
            properties = _kafka_properties(home, node_id, port, controller_port, voters)
            config = home / "server.properties"
            settings = properties | dict(extra or {}) | dict((each or {}).get(node_id, {}))
            config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
            format_storage(config, cluster_id)
            log = home / "kafka.log"
            process = _launch(config, log, heap)
            brokers.append(KafkaBroker(process, port, controller_port, home, log, heap, node_id))
        for broker in brokers:
            _wait_started(broker, timeout)
    except BaseException:
        stop_kafka_cluster(brokers)
        raise
    return brokers


@contextlib.contextmanager
def run_kafka(
    directory: Path, extra: Mapping[str, str] | None = None, *, heap: str = "512m"
) -> Iterator[KafkaBroker]:
    """A Kafka broker for the length of the block; stopped and its log dir removed after."""
    broker = start_kafka(directory, extra, heap=heap)
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(directory / "data", ignore_errors=True)


if __name__ == "__main__":
    started = time.perf_counter()
    where = fetch()
    jars = sum(1 for _ in where.glob("*.jar"))
    seconds = time.perf_counter() - started
    print(f"Apache Kafka {KAFKA_VERSION}: {jars} jars in {where} ({seconds:.1f} s)")
    print(f"its protocol and metadata record schemas: {protocol_schemas()}")
    sys.exit(0)
