"""A broker's life as the active controller sees it (KIP-631): it registers, is unfenced once
it has caught up with the metadata log, keeps its session with a heartbeat every
`broker.heartbeat.interval.ms`, and on SIGTERM asks to shut down and waits to be told it may.

The active controller may be this very node (combined mode, `make run`): then the requests go
to it in process; otherwise to the controller listener of the voter that leads, as
BrokerRegistration and BrokerHeartbeat requests. A controller that moves, refuses
(NOT_CONTROLLER) or does not answer is retried after `RETRY_BACKOFF_S`. The partitions this
broker leads change their ISR through it too (AlterPartition), and its idempotent producers get
their ids from blocks it hands out (AllocateProducerIds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from broker.config import SECURITY_PROTOCOL_IDS, BrokerConfig
from broker.kraft import MetadataService, NotController
from broker.metadata.brokers import Heartbeat, HeartbeatAnswer, Registration, RegistrationAnswer
from broker.metadata.elections import IsrAnswer, IsrChange
from broker.metadata.records import BrokerEndpoint
from broker.peer import ActiveControllerPeers, PeerUnavailable
from broker.protocol import ApiKey, ErrorCode, build, request_type
from broker.protocol.messages import request_module

__all__ = ["BrokerLifecycle"]

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.1
REGISTRATION_VERSION = 4
HEARTBEAT_VERSION = 1
ALTER_PARTITION_VERSION = 3
ALLOCATE_PRODUCER_IDS_VERSION = 0


PEERS_CLOSE_TIMEOUT_S = 2.0
"""How long a controlled shutdown waits for its connections to the controller to close."""


class BrokerLifecycle:
    def __init__(
        self,
        config: BrokerConfig,
        metadata: MetadataService,
        cluster_id: str,
        *,
        log_dirs: tuple[uuid.UUID, ...] = (),
        previous_broker_epoch: int = -1,
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._cluster_id = cluster_id
        self.incarnation_id = uuid.uuid4()
        self.broker_epoch = -1
        self.fenced = True
        self._unfenced = asyncio.Event()
        self._heartbeats: asyncio.Task[None] | None = None
        self._peers = ActiveControllerPeers(
            config.controller_quorum_voters, f"broker-{config.node_id}"
        )
        self._stopping = False
        self._request: Registration | None = None
        self.log_dirs = log_dirs
        """This broker's online log dirs' directory ids (KIP-858), told in its registration."""
        self.previous_broker_epoch = previous_broker_epoch
        """The epoch of its last clean stop, as its clean-shutdown markers say (KIP-966), -1
        after a crash or with a new disk: told in its registration."""
        self.wants_fence: Callable[[], bool] = lambda: False
        """Whether this broker asks to be fenced in its heartbeats: it can hold no replica
        (every log dir failed), so its leaderships and ISR places must go to other brokers
        now, not once its session runs out."""

    # -- what the node does ------------------------------------------------------------------

    async def start(self, endpoints: dict[str, tuple[str, int]]) -> None:
        """Register this broker, then keep heartbeating; returns once it is unfenced."""
        config = self._config
        listeners = tuple(
            BrokerEndpoint(
                name,
                host,
                port,
                SECURITY_PROTOCOL_IDS.get(config.listener_security_protocol_map.get(name, name), 0),
            )
            for name, (host, port) in sorted(endpoints.items())
        )
        self._request = Registration(
            config.node_id,
            self.incarnation_id,
            self._cluster_id,
            listeners,
            config.broker_rack,
            log_dirs=self.log_dirs,
            previous_broker_epoch=self.previous_broker_epoch,
        )
        await self._register_until_done()
        self._heartbeats = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        await self._unfenced.wait()

    async def _register_until_done(self) -> None:
        request = self._request
        assert request is not None
        while True:
            try:
                answer = await self._register(request)
            except Exception:
                log.exception("registering broker %d failed; retrying", request.broker_id)
                answer = None
            if answer is not None and answer.error == ErrorCode.none:
                break
            if answer is not None and answer.error == ErrorCode.duplicate_broker_registration:
                log.warning(
                    "broker %d waits for the session of its previous process to run out "
                    "(the controller still counts it alive)",
                    request.broker_id,
                )
                await asyncio.sleep(1)
            elif answer is not None:
                log.error(
                    "the controller refused to register broker %d: %s (%s); retrying",
                    request.broker_id,
                    answer.error.name,
                    answer.message,
                )
                await asyncio.sleep(1)
            else:
                await asyncio.sleep(RETRY_BACKOFF_S)
        self.broker_epoch = self._metadata.broker_epoch = answer.broker_epoch
        log.info("broker %d registered with epoch %d", request.broker_id, self.broker_epoch)

    async def shut_down(self, timeout_s: float = 10.0) -> None:
        """Controlled shutdown: ask the active controller to let this broker go, and wait
        until it says so (or `timeout_s` passed: the controller may be gone too)."""
        self._stopping = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        try:
            async with asyncio.timeout(timeout_s):
                if self.broker_epoch < 0 and self._request is not None:
                    # Stopped while registering: the registration may have been committed, so
                    # learn its epoch (a retry of the same process is answered with it) and
                    # leave cleanly rather than leave a session behind.
                    registered = await self._register(self._request)
                    if registered is not None and registered.error == ErrorCode.none:
                        self.broker_epoch = registered.broker_epoch
                while self.broker_epoch >= 0:
                    answer = await self._heartbeat(want_shut_down=True)
                    if answer is not None and answer.should_shut_down:
                        log.info("the controller let broker %d shut down", self._config.node_id)
                        break
                    await asyncio.sleep(RETRY_BACKOFF_S)
        except TimeoutError:
            log.warning("no controller answered the controlled shutdown; stopping anyway")
        try:
            # Bounded too: a connection to a controller that stopped answering (SIGSTOP) may
            # not close, and a node told to stop must stop.
            async with asyncio.timeout(PEERS_CLOSE_TIMEOUT_S):
                await self._peers.close()
        except TimeoutError:
            log.warning(
                "the connections to the controller did not close within %.0f s; stopping anyway",
                PEERS_CLOSE_TIMEOUT_S,
            )

    async def _heartbeat_loop(self) -> None:
        interval = self._config.broker_heartbeat_interval_ms / 1000
        session_s = self._config.broker_session_timeout_ms / 1000
        answered_at, unanswered = time.monotonic(), False
        while not self._stopping:
            try:
                answer = await self._heartbeat(want_shut_down=False)
            except Exception:
                log.exception("heartbeat of broker %d failed", self._config.node_id)
                answer = None
            if answer is None:
                silent_s = time.monotonic() - answered_at
                if silent_s > session_s and not unanswered:
                    unanswered = True
                    log.warning(
                        "no controller has answered broker %d's heartbeats for %.0f s "
                        "(leader: %s): it is fenced by now",
                        self._config.node_id,
                        silent_s,
                        self._metadata.driver.leader,
                    )
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            answered_at = time.monotonic()
            if unanswered:
                unanswered = False
                log.info("broker %d's heartbeats are answered again", self._config.node_id)
            if answer.error == ErrorCode.stale_broker_epoch:
                # Its registration is gone (replaced, or unregistered): register again.
                log.warning(
                    "the controller no longer knows broker %d at epoch %d: registering again",
                    self._config.node_id,
                    self.broker_epoch,
                )
                await self._register_until_done()
                continue
            if answer.error != ErrorCode.none:
                log.warning(
                    "heartbeat of broker %d refused: %s", self._config.node_id, answer.error.name
                )
                await asyncio.sleep(interval)
                continue
            if self.fenced != answer.is_fenced:
                log.info(
                    "broker %d is %s",
                    self._config.node_id,
                    "fenced" if answer.is_fenced else "unfenced",
                )
            self.fenced = answer.is_fenced
            if not answer.is_fenced:
                self._unfenced.set()
            # Fenced (catching up): ask again soon rather than in a whole interval.
            catching_up = answer.is_fenced and not self.wants_fence()
            await asyncio.sleep(RETRY_BACKOFF_S if catching_up else interval)

    async def alter_isr(self, changes: list[IsrChange]) -> tuple[ErrorCode, list[IsrAnswer]] | None:
        """AlterPartition for partitions this broker leads; None when no controller answered
        (the caller asks again later)."""
        metadata = self._metadata
        if metadata.is_active_controller:
            try:
                return await metadata.alter_isr(self._config.node_id, self.broker_epoch, changes)
            except NotController:
                return None
        schema = request_module(ApiKey.ALTER_PARTITION, ALTER_PARTITION_VERSION)
        by_topic: dict[uuid.UUID, list[Any]] = {}
        for change in changes:
            by_topic.setdefault(change.topic_id, []).append(
                build(
                    schema.PartitionData,
                    partition_index=change.partition,
                    leader_epoch=change.leader_epoch,
                    new_isr_with_epochs=tuple(
                        build(schema.BrokerState, broker_id=member, broker_epoch=epoch)
                        for member, epoch in change.new_isr
                    ),
                    leader_recovery_state=0,
                    partition_epoch=change.partition_epoch,
                )
            )
        body = build(
            schema.AlterPartitionRequest,
            broker_id=self._config.node_id,
            broker_epoch=self.broker_epoch,
            topics=tuple(
                build(schema.TopicData, topic_id=topic_id, partitions=tuple(partitions))
                for topic_id, partitions in by_topic.items()
            ),
        )
        response = await self._send(ApiKey.ALTER_PARTITION, ALTER_PARTITION_VERSION, body)
        if response is None or response.error_code == ErrorCode.not_controller:
            return None
        answers = {
            (topic.topic_id, p.partition_index): IsrAnswer(
                _error(p.error_code), p.leader_id, p.leader_epoch, tuple(p.isr), p.partition_epoch
            )
            for topic in response.topics
            for p in topic.partitions
        }
        missing = IsrAnswer(ErrorCode.unknown_server_error)
        return _error(response.error_code), [
            answers.get((c.topic_id, c.partition), missing) for c in changes
        ]

    async def allocate_producer_ids(self) -> range | None:
        """The next block of producer ids for this broker's idempotent producers
        (AllocateProducerIds); None when no controller handed one out (the producer retries)."""
        metadata = self._metadata
        if metadata.is_active_controller:
            try:
                error, block = await metadata.allocate_producer_ids(
                    self._config.node_id, self.broker_epoch
                )
            except NotController:
                return None
        else:
            body = build(
                request_type(ApiKey.ALLOCATE_PRODUCER_IDS, ALLOCATE_PRODUCER_IDS_VERSION),
                broker_id=self._config.node_id,
                broker_epoch=self.broker_epoch,
            )
            response = await self._send(
                ApiKey.ALLOCATE_PRODUCER_IDS, ALLOCATE_PRODUCER_IDS_VERSION, body
            )
            if response is None:
                return None
            error = _error(response.error_code)
            start = response.producer_id_start
            block = range(start, start + response.producer_id_len)
        if error != ErrorCode.none:
            log.warning("the controller handed out no producer ids: %s", error.name)
            return None
        return block

    # -- requests to the active controller ---------------------------------------------------

    async def _register(self, request: Registration) -> RegistrationAnswer | None:
        metadata = self._metadata
        if metadata.is_active_controller:
            try:
                return await metadata.register(request)
            except NotController:
                return None
        body = build(
            request_type(ApiKey.BROKER_REGISTRATION, REGISTRATION_VERSION),
            broker_id=request.broker_id,
            cluster_id=request.cluster_id,
            incarnation_id=request.incarnation_id,
            listeners=tuple(
                build(
                    request_module(ApiKey.BROKER_REGISTRATION, REGISTRATION_VERSION).Listener,
                    name=e.name,
                    host=e.host,
                    port=e.port,
                    security_protocol=e.security_protocol,
                )
                for e in request.listeners
            ),
            features=(),
            rack=request.rack,
            log_dirs=request.log_dirs,
            previous_broker_epoch=request.previous_broker_epoch,
        )
        response = await self._send(ApiKey.BROKER_REGISTRATION, REGISTRATION_VERSION, body)
        if response is None or response.error_code == ErrorCode.not_controller:
            return None
        return RegistrationAnswer(_error(response.error_code), None, response.broker_epoch)

    async def _heartbeat(self, *, want_shut_down: bool) -> HeartbeatAnswer | None:
        metadata = self._metadata
        request = Heartbeat(
            self._config.node_id,
            self.broker_epoch,
            metadata.driver.applied - 1,
            want_fence=not want_shut_down and self.wants_fence(),
            want_shut_down=want_shut_down,
        )
        if metadata.is_active_controller:
            try:
                return await metadata.heartbeat(request)
            except NotController:
                return None
        body = build(
            request_type(ApiKey.BROKER_HEARTBEAT, HEARTBEAT_VERSION),
            broker_id=request.broker_id,
            broker_epoch=request.broker_epoch,
            current_metadata_offset=request.metadata_offset,
            want_fence=request.want_fence,
            want_shut_down=want_shut_down,
            offline_log_dirs=(),
        )
        response = await self._send(ApiKey.BROKER_HEARTBEAT, HEARTBEAT_VERSION, body)
        if response is None or response.error_code == ErrorCode.not_controller:
            return None
        return HeartbeatAnswer(
            _error(response.error_code),
            bool(response.is_caught_up),
            bool(response.is_fenced),
            bool(response.should_shut_down),
        )

    async def _send(self, api_key: ApiKey, version: int, body: Any) -> Any:
        """The request to the leader of the metadata quorum, over its controller listener;
        None when there is none known or it did not answer."""
        peer = self._peers.to(self._metadata.driver.leader)
        if peer is None:
            return None
        timeout_s = self._config.controller_quorum_request_timeout_ms / 1000
        with contextlib.suppress(PeerUnavailable, TimeoutError):
            return await peer.request(api_key, version, body, timeout_s=timeout_s)
        return None


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error
