"""InitProducerId for idempotent producers, answered by the broker a producer asks.

Ids come in blocks the active controller hands each broker (AllocateProducerIds, KIP-730,
committed as a ProducerIdsRecord), so no id is ever given twice, across brokers and restarts,
and a producer's start costs the controller one request per thousand producers. The next
block is asked for once nine tenths of the current one are used, as Kafka's brokers do; a
broker that cannot get one answers COORDINATOR_LOAD_IN_PROGRESS, which producers retry.

Without a transactional id every request gets a fresh id at epoch 0, whatever id and epoch it
names, as Kafka's transaction coordinator answers: handing back a named id with its epoch
bumped would let any client fence any other producer. Transactions are not supported yet: a
transactional id is refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients report
as fatal rather than retrying."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.kraft import NotController
from broker.metadata import QuorumController
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["InitProducerId"]

PREFETCH_AT = 0.9
"""The share of a block used when the next one is asked for."""


class InitProducerId:
    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._block: range = range(0)
        self._next = 0
        self._spare: range | None = None
        """The next block, once handed out."""
        self._asking: asyncio.Task[bool] | None = None

    async def _new_id(self) -> int | None:
        while self._next >= self._block.stop:
            if self._spare is not None:
                self._block, self._spare = self._spare, None
                self._next = self._block.start
                continue
            if not await asyncio.shield(self._ask()):
                return None
        producer_id = self._next
        self._next += 1
        block = self._block
        if self._spare is None and self._next >= block.start + len(block) * PREFETCH_AT:
            self._ask()  # in the background: this block lasts a while yet
        return producer_id

    def _ask(self) -> asyncio.Task[bool]:
        """The request for the next block: the one under way, or a new one."""
        if self._asking is None:
            self._asking = asyncio.get_running_loop().create_task(self._allocate())
        return self._asking

    async def _allocate(self) -> bool:
        try:
            state = self._state
            if state.producer_ids is not None:
                block = await state.producer_ids()
            else:  # a node without a broker lifecycle: the active controller itself

                def decide(controller: QuorumController) -> tuple[list[Any], range]:
                    return controller.allocate_producer_ids(
                        state.node_id, state.metadata.broker_epoch
                    )

                try:
                    block = await state.metadata.propose(decide)
                except NotController:
                    return False
        finally:
            self._asking = None
        if not block:
            return False
        self._spare = block
        return True

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.INIT_PRODUCER_ID, context.header.api_version)
        error = ErrorCode.none
        producer_id, epoch = -1, -1
        if request.transactional_id is not None:
            error = ErrorCode.transactional_id_authorization_failed
        else:
            new = await self._new_id()
            if new is None:
                error = ErrorCode.coordinator_load_in_progress
            else:
                producer_id, epoch = new, 0
        response: ResponseBody = build(
            schema.InitProducerIdResponse,
            throttle_time=NO_THROTTLE,
            error_code=error,
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        return response
