"""A Gregor node: its log dirs, its listeners, its handlers, and its lifecycle.

A node starts only on a formatted metadata log dir (`gregor format`, as `kafka-storage
format`, gives each dir a `meta.properties` with the cluster id, the node id and a directory
id): it never formats that one itself, since an empty one may be a lost one. It refuses a log
dir that belongs to another cluster or another node, and formats its other empty log dirs,
each with a new directory id (a replaced disk). SIGTERM stops the node cleanly and it exits 0.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import signal
import uuid
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from broker import restarts
from broker.compaction import run_cleaner
from broker.config import BrokerConfig, InvalidConfig
from broker.forwarding import FORWARDED_APIS, Forwarding
from broker.groups.api import GroupConfig
from broker.groups.persistence import GroupLogUnavailable, GroupLogWriteFailed, LogGroupLog
from broker.groups.service import GroupService
from broker.handlers import NodeState, build_dispatcher
from broker.handlers.context import OFFSETS_TOPIC, Endpoint, steady_clock_ms, wall_clock_ms
from broker.handlers.quorum import build_controller_dispatcher
from broker.kraft import MetadataService
from broker.lifecycle import BrokerLifecycle
from broker.metadata import BROKER_RESOURCE, ConfigChanged, MetadataImage, PartitionChanged
from broker.metadata.image import Change
from broker.metrics import BrokerMetrics, MetricsEndpoint
from broker.protocol.errors import ErrorCode
from broker.replica import FetcherSettings, IsrSender, ReplicaFetchers, ReplicaManager
from broker.server import BoundListener, BrokerServer, Dispatcher
from broker.storage import Log, LogManager, StorageError
from broker.storage.manager import TopicPartition
from broker.storage.meta_properties import (
    META_PROPERTIES,
    NOT_FORMATTED,
    DirIdentity,
    NotFormatted,
    load_formatted,
)
from broker.storage.partition_metadata import encode_uuid

__all__ = ["Node", "NodeError", "check_log_dirs", "new_cluster_id"]

log = logging.getLogger(__name__)


_CONNECTION_LIMITS = (
    "max.connections",
    "max.connections.per.ip",
    "max.connections.per.ip.overrides",
)
"""The connection limits a dynamic broker config changes on a running node."""

HOUSEKEEPING_INTERVAL_S = 1.0


class NodeError(Exception):
    """The node cannot start; the message says what an operator must fix."""


def new_cluster_id() -> str:
    """Kafka's form: a random UUID in URL-safe base64 without padding (22 characters), and,
    as Kafka's `Uuid.randomUuid` does, never one that starts with `-`: one in 64 would, and
    a command line takes it for an option (`--cluster-id -Ab…`)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def check_log_dirs(
    config: BrokerConfig, cluster_id: str | None = None, *, config_path: str | None = None
) -> DirIdentity:
    """Check each dir's `meta.properties` (this node's; the cluster's, `cluster_id` if given),
    format the empty log dirs other than the metadata log dir, and give each its directory id
    (`broker/storage/meta_properties.py`). `config_path` is named in what to do when the
    metadata log dir is not formatted."""
    try:
        identity = load_formatted(
            config.metadata_dir, list(config.log_dirs), config.node_id, cluster_id
        )
    except NotFormatted as exc:
        raise NodeError(_not_formatted(config, exc.log_dir, cluster_id, config_path)) from None
    except StorageError as exc:
        raise NodeError(str(exc)) from None
    for log_dir in identity.formatted:
        log.warning(
            "log dir %s was empty: formatted for cluster %s with a new directory.id %s (a "
            "replaced disk: any replicas the old one held are lost here, and fetched again)",
            log_dir,
            identity.cluster_id,
            encode_uuid(identity.directory_ids[log_dir]),
        )
    return identity


def _not_formatted(
    config: BrokerConfig, log_dir: Path, cluster_id: str | None, config_path: str | None
) -> str:
    """Why the node does not start on an unformatted metadata log dir, and what to do."""
    command = (
        f"gregor format --config {config_path or '<its server.properties>'} "
        f"--cluster-id {cluster_id or '<the cluster id>'}"
    )
    said = (
        f"the metadata log dir {log_dir} {NOT_FORMATTED}: it has no {META_PROPERTIES}. A new "
        f"node's dirs are formatted once, before its first start: {command}. A node that ran "
        "before and finds it empty has lost it (a replaced disk, a volume not mounted)"
    )
    if config.is_voter:
        return said + (
            f". Node {config.node_id} is a voter of the metadata quorum "
            "(controller.quorum.voters): formatting its lost metadata log dir anew would let "
            "it vote as a voter that lost its log, and a majority counted with it could elect "
            "a leader without records the quorum committed. Recover the dir from a backup, or "
            "replace the voter (a new node id in controller.quorum.voters on every node)."
        )
    if "controller" in config.process_roles:  # the only voter, without a quorum to rejoin
        return said + ": formatted anew, the node starts a cluster with empty metadata."
    return said + (
        ": formatted anew, it comes back as a new directory, and the replicas it held are "
        "fetched again from the other brokers that have them."
    )


class Node:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        cluster_id: str | None = None,
        config_path: str | None = None,
    ) -> None:
        """`cluster_id`: the cluster the log dirs must belong to (they say which otherwise);
        `config_path`: the node's server.properties, named in what the node says when it
        cannot start."""
        self.config = config
        identity = check_log_dirs(config, cluster_id, config_path=config_path)
        self.cluster_id = identity.cluster_id
        self.directory_ids = identity.directory_ids
        """Each log dir's directory id (KIP-858), registered with the controller."""
        self.logs = LogManager(
            list(config.log_dirs),
            config.log,
            producer_id_expiration_ms=config.producer_id_expiration_ms,
            retention_check_interval_ms=config.log_retention_check_interval_ms,
            dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
            background_flush=True,
        )
        self.clock = wall_clock_ms
        self.metadata: MetadataService | None = None
        self.server: BrokerServer | None = None
        self._logs_loaded = False
        self.dispatcher: Dispatcher | None = None
        """The client listeners' handlers (also what forwarded requests are handled by)."""
        self.forwarding: Forwarding | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self._reported_all_failed = False
        self.controller_server: BrokerServer | None = None
        """The controller listener: the metadata quorum's requests, when this node votes."""
        self.state: NodeState | None = None
        self.groups: GroupService | None = None
        self.replicas: ReplicaManager | None = None
        self.fetchers: ReplicaFetchers | None = None
        self.metrics: BrokerMetrics | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self.phase = "starting"
        """What the node is doing (`/v1/state`): starting (replaying the metadata log),
        recovering (loading its logs), registering (with the controller, until unfenced),
        running, pending-controlled-shutdown, stopping."""
        self._housekeeping: asyncio.Task[None] | None = None
        self._isr_checks: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._cleaner: asyncio.Task[None] | None = None
        self.banner: str | None = None
        """Printed once the node serves (`gregor local up` tells the user where)."""

    async def start(self) -> list[BoundListener]:
        """Lock the log dirs, replay the metadata log, load the partitions it assigns here,
        then listen and register: clients are served only once the node knows its state."""
        now = self.clock()
        try:
            self.logs.lock()
        except StorageError as exc:
            raise NodeError(str(exc)) from None
        if self.config.metrics_listener is not None:
            await self._serve_http(*self.config.metrics_listener)
        metadata = self.metadata = MetadataService(
            self.config,
            self.clock,
            cluster_id=self.cluster_id,
            steady_clock=steady_clock_ms(),
            controller_endpoint=self._controller_endpoint(),
        )
        if self._controller_endpoint() is not None:
            # The quorum must be reachable before this node waits for it.
            self.controller_server = BrokerServer(
                self.config,
                build_controller_dispatcher(metadata, self.cluster_id, lambda: self.dispatcher),
                controller=True,
            )
            await self.controller_server.start()
        await metadata.start()
        replicas = await self._load_logs(metadata, now)
        self.phase = "registering"
        image = metadata.image
        metadata.subscribers.append(replicas.apply)
        self._follow_leaders(replicas, metadata)
        group_clock = steady_clock_ms()
        group_config = self._group_config(image)
        groups = self.groups = GroupService(
            group_config,
            LogGroupLog(
                self._offsets_log,
                group_clock,
                append_batch=self._append_offsets,
                replicated=self._offsets_replicated,
                leads=self._leads_offsets,
            ),
            now_ms=group_clock,
        )
        # Groups are served where their __consumer_offsets partition is led, and move with it.
        await groups.start(p for p in range(group_config.num_partitions) if self._leads_offsets(p))
        self._follow_offsets_partitions(metadata, group_config.num_partitions)
        self.state = NodeState(
            self.config, self.cluster_id, metadata, replicas, groups, clock=self.clock
        )
        dispatcher = self.dispatcher = build_dispatcher(self.state)
        self.forwarding = Forwarding(self.config, metadata)
        dispatcher.forwarder = self.forwarding.forward
        dispatcher.forwarded_apis = FORWARDED_APIS
        self.state.forwarding = self.forwarding
        if self._metrics_endpoint is not None:
            self._serve_metrics(replicas, self._metrics_endpoint)
            assert self.metrics is not None
            dispatcher.observer = self.metrics.request_done
        self.server = BrokerServer(self.config, dispatcher)
        self._apply_broker_configs()
        metadata.subscribers.append(self._follow_broker_configs)
        bound = await self.server.start(serve=False)
        by_name = {b.name: b for b in bound}
        for listener in self.config.advertised:
            port = listener.port or by_name[listener.name].port
            host = listener.host or "localhost"
            self.state.advertised[listener.name] = Endpoint(host, port)
        if "broker" in self.config.process_roles:
            self.lifecycle = BrokerLifecycle(
                self.config,
                metadata,
                self.cluster_id,
                log_dirs=self._online_directory_ids(),
                previous_broker_epoch=self.logs.previous_broker_epoch,
            )
            self.state.producer_ids = self.lifecycle.allocate_producer_ids
            self.lifecycle.wants_fence = self._every_log_dir_failed
            await self.lifecycle.start(
                {name: (e.host, e.port) for name, e in self.state.advertised.items()}
            )
        await self.server.serve()
        self._start_background(replicas)
        self.phase = "running"
        return bound

    async def _load_logs(self, metadata: MetadataService, now: int) -> ReplicaManager:
        """Load (recovering where needed) the logs of the partitions the metadata assigns
        here, and the replica manager that serves them."""
        image = metadata.image
        self.phase = "recovering"
        # On a thread: ten thousand logs take seconds to load, and the quorum (this node may
        # be a voter) goes on being served meanwhile. Nothing else touches the logs yet.
        await asyncio.to_thread(
            self.logs.startup,
            now_ms=now,
            configs={name: metadata.topic_log_config(name) for name in image.topics},
        )
        self._logs_loaded = True
        replicas = self.replicas = ReplicaManager(
            self.config.node_id,
            self.logs,
            image,
            metadata.topic_log_config,
            self.clock,
            create_in_background=True,
        )
        replicas.min_insync_replicas = metadata.min_insync_replicas
        replicas.rack_aware_reads = self.config.replica_selector_class is not None
        for topic in image.topics.values():
            for index, partition in topic.partitions.items():
                replicas.apply(PartitionChanged(topic, index, partition))
        replicas.remove_strays()
        return replicas

    def _online_directory_ids(self) -> tuple[uuid.UUID, ...]:
        """The directory ids this broker registers: its log dirs that are online."""
        return tuple(
            directory_id
            for log_dir, directory_id in self.directory_ids.items()
            if log_dir not in self.logs.offline_dirs
        )

    def _start_background(self, replicas: ReplicaManager) -> None:
        """The node's periodic work: housekeeping, ISR checks, compaction."""
        loop = asyncio.get_running_loop()
        self._housekeeping = loop.create_task(self._housekeep())
        if self.lifecycle is not None:
            metadata = self.metadata
            assert metadata is not None
            replicas.on_isr_change = IsrSender(
                replicas, lambda: metadata.image, self.lifecycle.alter_isr, self._spawn
            )
            self._isr_checks = loop.create_task(self._check_isr())
        if self.config.log_cleaner_enable:
            self._cleaner = loop.create_task(
                run_cleaner(
                    self.logs,
                    self.clock,
                    self._high_watermarks,
                    backoff_ms=self.config.log_cleaner_backoff_ms,
                )
            )

    def _follow_leaders(self, replicas: ReplicaManager, metadata: MetadataService) -> None:
        """Replica fetchers for the partitions this node follows, following the metadata."""
        config = self.config
        fetchers = self.fetchers = ReplicaFetchers(
            FetcherSettings(
                config.node_id,
                self.cluster_id,
                config.inter_broker_listener_name,
                wait_max_ms=config.replica_fetch_wait_max_ms,
                min_bytes=config.replica_fetch_min_bytes,
                max_bytes=config.replica_fetch_max_bytes,
                response_max_bytes=config.replica_fetch_response_max_bytes,
                backoff_ms=config.replica_fetch_backoff_ms,
            ),
            replicas,
            lambda: metadata.image,
        )
        replicas.on_role_change = fetchers.update
        replicas.replica_lag_time_max_ms = config.replica_lag_time_max_ms
        fetchers.update()

    def _controller_endpoint(self) -> tuple[str, str, int] | None:
        """This voter's controller listener (name, host, port), as `controller.quorum.voters`
        advertises it; None on a node that does not vote, or votes alone without one."""
        config = self.config
        if "controller" not in config.process_roles:
            return None
        voter = config.controller_quorum_voters.get(config.node_id)
        if voter is None or not config.controller_listener_names:
            return None
        return (config.controller_listener_names[0], voter[0], voter[1])

    def _follow_broker_configs(self, change: Change) -> None:
        if isinstance(change, ConfigChanged) and change.resource_type == BROKER_RESOURCE:
            self._apply_broker_configs()

    def _apply_broker_configs(self) -> None:
        """The dynamic broker configs this node acts on as they change."""
        self._apply_connection_limits()
        self._apply_replication_throttles()

    def _apply_replication_throttles(self) -> None:
        """`leader.replication.throttled.rate` and `follower.replication.throttled.rate`, in
        bytes per second: this broker's dynamic value over every broker's; unset, no limit."""
        assert self.metadata is not None
        assert self.replicas is not None
        dynamic = self.metadata.cluster_dynamic_configs | self.metadata.broker_dynamic_configs
        for name, quota in (
            ("leader.replication.throttled.rate", self.replicas.leader_quota),
            ("follower.replication.throttled.rate", self.replicas.follower_quota),
        ):
            value = dynamic.get(name)
            try:
                quota.limit = None if value is None else float(int(value))
            except ValueError:
                log.warning("%s=%r not applied: not a number of bytes", name, value)

    def _apply_connection_limits(self) -> None:
        """`max.connections`, `max.connections.per.ip` and its overrides, dynamic as in Kafka:
        this broker's dynamic value over every broker's over `server.properties`. They apply
        to connections accepted from now on; open ones stay."""
        assert self.metadata is not None
        assert self.server is not None
        dynamic = self.metadata.cluster_dynamic_configs | self.metadata.broker_dynamic_configs
        chosen = {name: dynamic[name] for name in _CONNECTION_LIMITS if name in dynamic}
        try:
            limits = BrokerConfig.from_properties(self.config.properties | chosen)
        except InvalidConfig as exc:
            log.warning("dynamic connection limits not applied: %s", exc)
            return
        quotas = self.server.admission.quotas
        quotas.max_connections = limits.max_connections
        quotas.max_per_ip = limits.max_connections_per_ip
        quotas.overrides = dict(limits.max_connections_per_ip_overrides)

    def _group_config(self, image: MetadataImage) -> GroupConfig:
        """The coordinator's settings. Once `__consumer_offsets` exists its partition count is
        what maps a group to its partition, whatever `offsets.topic.num.partitions` says now
        (as Kafka's coordinator reads it from the metadata at startup): a changed setting
        must not move groups away from their committed offsets."""
        config = GroupConfig.from_broker(self.config)
        offsets = image.topics.get(OFFSETS_TOPIC)
        if offsets is None or len(offsets.partitions) == config.num_partitions:
            return config
        log.warning(
            "%s has %d partitions and offsets.topic.num.partitions is %d: groups are mapped "
            "over the topic's %d partitions",
            OFFSETS_TOPIC,
            len(offsets.partitions),
            config.num_partitions,
            len(offsets.partitions),
        )
        return dataclasses.replace(config, num_partitions=len(offsets.partitions))

    async def _serve_http(self, host: str, port: int) -> None:
        """The HTTP listener, from before the logs load: a slow recovery answers `/livez` (so
        Kubernetes does not kill it) and says how far it has got (`/v1/state`). A port that
        is taken stops the node before anything is loaded."""
        self._metrics_endpoint = MetricsEndpoint(
            CollectorRegistry(),
            host,
            port,
            self._not_ready,
            routes={"/v1/state": self._state, "/v1/restart-verdict": self._restart_verdict},
        )
        try:
            bound = await self._metrics_endpoint.start()
        except OSError as exc:
            self._metrics_endpoint = None
            raise NodeError(
                f"gregor.metrics.listener=http://{host}:{port}: cannot listen: {exc}"
            ) from None
        log.info("serving Prometheus metrics on http://%s:%d/metrics", host or "0.0.0.0", bound)

    def _serve_metrics(self, replicas: ReplicaManager, endpoint: MetricsEndpoint) -> None:
        roles = self.config.process_roles
        metadata = self.metadata
        assert metadata is not None
        metrics = self.metrics = BrokerMetrics(
            replicas,
            active_controller=lambda: "controller" in roles and metadata.is_active_controller,
            metadata=metadata,
        )
        replicas.on_append = metrics.appended
        endpoint.registry = metrics.registry

    def _state(self, _query: Mapping[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """`/v1/state`: what the node is doing, and while it loads its logs how many are
        left."""
        state: dict[str, Any] = {
            "nodeId": self.config.node_id,
            "roles": sorted(self.config.process_roles),
            "state": self.phase,
        }
        if self.phase == "recovering":
            loading = self.logs.loading
            state["logs"] = {
                "loaded": loading.loaded,
                "total": loading.total,
                "left": max(loading.total - loading.loaded, 0),
                "recoveringDirs": list(loading.recovering),
            }
        return 200, state

    def _restart_verdict(self, query: Mapping[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """`/v1/restart-verdict?nodes=1,2`: whether those nodes may stop together now
        (`broker.restarts`); this node's own id when `nodes` is not given. 503 until the node
        is ready (`/readyz`): before, or while fenced or without a quorum leader, its
        metadata may be behind the cluster's."""
        try:
            nodes = [int(n) for v in query.get("nodes", []) for n in v.split(",") if n.strip()]
        except ValueError:
            return 400, {"error": "nodes: a comma-separated list of node ids"}
        not_ready = self._not_ready()
        if not_ready is not None or self.metadata is None:
            said = f"node {self.config.node_id} is not ready: {not_ready}"
            return 503, {"error": said, "safe": False}
        metadata = self.metadata
        return 200, restarts.verdict(
            lambda: restarts.partition_views(metadata.image, metadata.min_insync_replicas),
            self._quorum_view(metadata),
            nodes or [self.config.node_id],
        )

    def _quorum_view(self, metadata: MetadataService) -> restarts.QuorumView | None:
        driver = metadata.driver
        if not driver.voters:
            return None
        leader = driver.leader
        caught_up: frozenset[int] = frozenset()
        if driver.is_active and leader is not None:
            status = driver.status()
            caught_up = restarts.caught_up_voters(
                status.voters,
                leader=leader,
                high_watermark=status.high_watermark,
                now_ms=driver.now_ms(),
                fetch_timeout_ms=self.config.controller_quorum_fetch_timeout_ms,
            )
        return restarts.QuorumView(self.config.node_id, leader, tuple(driver.voters), caught_up)

    def _not_ready(self) -> str | None:
        """Why the node should not be sent clients or counted as up (`/readyz`), None when
        it should: the node has started (its logs loaded), a voter's quorum has a leader,
        and a broker is registered and unfenced.

        A broker-only node stays ready while the quorum elects a leader, as a Kafka broker
        keeps serving through a controller failover: otherwise restarting the active
        controller would take every broker out of its Service at once."""
        roles = self.config.process_roles
        starting = self.phase == "registering" and "broker" not in roles
        if starting or self.phase in (
            "starting",
            "recovering",
            "stopping",
            "pending-controlled-shutdown",
        ):
            return self._state_text()
        metadata = self.metadata
        if metadata is None or ("controller" in roles and metadata.driver.leader is None):
            return "the metadata quorum has no leader"
        if "broker" not in roles:
            return None
        lifecycle = self.lifecycle
        if lifecycle is None or lifecycle.broker_epoch < 0:
            return "not registered with the controller"
        if lifecycle.fenced:
            return "fenced by the controller"
        if self.server is None or not self.server.serving:
            return "not listening"
        return None

    def _state_text(self) -> str:
        if self.phase == "recovering":
            loading = self.logs.loading
            return f"recovering its logs: {loading.loaded} of {loading.total} loaded"
        return self.phase

    def _offsets_log(self, partition: int) -> Log | None:
        assert self.replicas is not None
        found = self.replicas.partitions.get((OFFSETS_TOPIC, partition))
        return None if found is None else found.log

    def _leads_offsets(self, partition: int) -> bool:
        assert self.replicas is not None
        found = self.replicas.partitions.get((OFFSETS_TOPIC, partition))
        return found is not None and found.is_leader

    def _append_offsets(self, partition: int, batch: bytes) -> int:
        """The group coordinator's write, as the partition's leader (acks=1: whether it is
        replicated is asked next, by `_offsets_replicated`). Refused where this node no
        longer leads the partition (GroupLogUnavailable: its groups move with the leadership);
        any other refusal is a `GroupLogWriteFailed`, and the partition is reloaded."""
        assert self.replicas is not None
        result = self.replicas.append(OFFSETS_TOPIC, partition, batch, acks=1)
        if result.error != ErrorCode.none or result.info is None:
            said = f"{result.error.name}{f': {result.message}' if result.message else ''}"
            if not self._leads_offsets(partition):
                raise GroupLogUnavailable(f"this node no longer leads it ({said})")
            raise GroupLogWriteFailed(f"{OFFSETS_TOPIC}-{partition}: {said}")
        return result.info.last_offset + 1

    async def _offsets_replicated(self, partition: int, end_offset: int) -> bool:
        """Kafka's coordinator writes with acks=all and answers once the ISR has it, within
        `offsets.commit.timeout.ms`."""
        assert self.replicas is not None
        error = await self.replicas.wait_for_replication(
            OFFSETS_TOPIC, partition, end_offset, self.config.offsets_commit_timeout_ms / 1000
        )
        return error == ErrorCode.none

    def _follow_offsets_partitions(self, metadata: MetadataService, partitions: int) -> None:
        """From now on, groups follow their partitions' leaders; those whose log is still
        being created (found missing at start) are served once it exists."""
        metadata.subscribers.append(self._follow_offsets_leaders)
        assert self.replicas is not None
        for partition in range(partitions):
            if self.replicas.being_created((OFFSETS_TOPIC, partition)):
                self._spawn(self._serve_offsets_partition(partition))

    def _follow_offsets_leaders(self, change: Change) -> None:
        """A `__consumer_offsets` partition led here now has its groups loaded (replayed from
        the log) and served; one led elsewhere now is unloaded, its members told
        NOT_COORDINATOR so that they find the new coordinator."""
        if not isinstance(change, PartitionChanged) or change.topic.name != OFFSETS_TOPIC:
            return
        self._spawn(self._serve_offsets_partition(change.partition))

    async def _serve_offsets_partition(self, partition: int) -> None:
        """Load or unload the partition's groups as its leadership is when this runs, not as
        it was when the change came: several changes applied at once (brokers stopping
        together) can move a leadership here and away again before a load would start."""
        groups = self.groups
        assert groups is not None
        assert self.replicas is not None
        await self.replicas.wait_created((OFFSETS_TOPIC, partition))
        leads, serves = self._leads_offsets(partition), groups.serves(partition)
        if leads and not serves:
            await groups.load(partition)
        elif serves and not leads:
            await groups.unload(partition)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _housekeep(self) -> None:
        """Retention, time-based flushes and checkpoints, on Kafka's cadences (compaction has a
        task of its own: `run_cleaner`)."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            try:
                self.logs.tick(self.clock())
            except Exception:
                log.exception("housekeeping failed; retrying on the next round")

    async def _check_isr(self) -> None:
        """Lagging followers leave the ISRs this node leads; checked at half the lag limit,
        as Kafka does."""
        assert self.replicas is not None
        while True:
            await asyncio.sleep(self.config.replica_lag_time_max_ms / 2000)
            try:
                self.replicas.check_isr()
            except Exception:
                log.exception("checking the ISRs failed; retrying on the next round")

    def _every_log_dir_failed(self) -> bool:
        """No replica can live here any more (a full or failed disk under every log dir):
        the broker asks to be fenced, so that its partitions get other leaders and ISRs at
        once (Kafka's brokers stop for good in that case; this one stays up and says why in
        DescribeLogDirs and its log)."""
        logs = self.logs
        failed = all(log_dir in logs.offline_dirs for log_dir in logs.log_dirs)
        if failed and not self._reported_all_failed:
            log.error(
                "every log dir of broker %d has failed (%s): asking to be fenced",
                self.config.node_id,
                "; ".join(f"{d}: {why}" for d, why in logs.offline_dirs.items()),
            )
        self._reported_all_failed = failed
        return failed

    def _high_watermarks(self) -> dict[TopicPartition, int]:
        assert self.state is not None
        return {key: p.high_watermark for key, p in self.state.replicas.partitions.items()}

    async def stop(self) -> None:
        self.phase = "pending-controlled-shutdown" if self.lifecycle is not None else "stopping"
        if self.lifecycle is not None:
            await self.lifecycle.shut_down()
        self.phase = "stopping"
        if self.metadata is not None:
            await self.metadata.resign()
        for task in (self._cleaner, self._housekeeping, self._isr_checks, *self._background):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._metrics_endpoint is not None:
            await self._metrics_endpoint.stop()
        if self.server is not None:
            await self.server.stop()
        if self.fetchers is not None:
            await self.fetchers.close()
        # What clients set off until the server stopped (an AlterPartition, a group load).
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.groups is not None:
            await self.groups.stop()
        if self.forwarding is not None:
            await self.forwarding.close()
        if self.metadata is not None:
            # Before the logs shut down: nothing applies committed metadata to them after.
            await self.metadata.close()
        if self.replicas is not None:
            await self.replicas.close()  # the logs it is creating, before the logs shut down
        if self.controller_server is not None:
            await self.controller_server.stop()
        if self._logs_loaded:
            epoch = -1 if self.lifecycle is None else self.lifecycle.broker_epoch
            self.logs.shutdown(now_ms=self.clock(), broker_epoch=epoch)
        else:
            self.logs.unlock()

    async def run_until_signalled(self, started: Callable[[], None] | None = None) -> None:
        """Start, call `started` once it serves, serve until SIGTERM or SIGINT, then stop
        cleanly. The signals are caught from before the start: one that arrives while the logs
        recover (a pod deleted during a slow start) lets the start finish and then stops the
        node cleanly, instead of killing it with its logs half-loaded and no clean-shutdown
        marker written."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        # A node waits for its quorum before it serves; a signal meanwhile stops it, rather
        # than leaving it waiting for voters that may never come (a misconfigured one).
        starting = loop.create_task(self.start())
        stopping = loop.create_task(stop.wait())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not starting.done():
            log.info("stopping node %d before it served", self.config.node_id)
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await self.stop()
            return
        try:
            bound = starting.result()
        except BaseException:
            # A start that failed halfway (a port taken after registering, a disk) leaves
            # nothing behind: the broker is let go, the quorum and the logs are closed.
            await self.stop()
            raise
        if started is not None:
            started()
        for listener in bound:
            log.info(
                "node %d serving %s on port %d", self.config.node_id, listener.name, listener.port
            )
        if self.banner:
            print(self.banner, flush=True)
        await stop.wait()
        log.info("stopping node %d", self.config.node_id)
        await self.stop()
