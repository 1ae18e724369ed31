"""InitProducerId for idempotent producers: ids come in blocks the controller hands out
(ProducerIdsRecord), so a restarted node never reuses one. Without a transactional id every
request gets a fresh id at epoch 0, whatever id and epoch it names, as Kafka's transaction
coordinator answers: handing back a named id with its epoch bumped would let any client fence
any other producer. Transactions are not supported yet: a transactional id is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients report as fatal rather than retrying."""

from __future__ import annotations

from typing import Any

from broker.metadata import QuorumController
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["InitProducerId"]


class InitProducerId:
    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._block: range = range(0)
        self._next = 0

    async def _new_id(self) -> int:
        if self._next >= self._block.stop:
            state = self._state

            def decide(controller: QuorumController) -> tuple[list[Any], range]:
                return controller.allocate_producer_ids(state.node_id, state.metadata.broker_epoch)

            self._block = await state.metadata.propose(decide)
            self._next = self._block.start
        producer_id = self._next
        self._next += 1
        return producer_id

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.INIT_PRODUCER_ID, context.header.api_version)
        error = ErrorCode.none
        producer_id, epoch = -1, -1
        if request.transactional_id is not None:
            error = ErrorCode.transactional_id_authorization_failed
        else:
            producer_id, epoch = await self._new_id(), 0
        response: ResponseBody = build(
            schema.InitProducerIdResponse,
            throttle_time=NO_THROTTLE,
            error_code=error,
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        return response
