"""A request that carries many items (1000 topics of a CreateTopics) is turned into Python
objects in turns, so that the other clients of the event loop are served in between."""

from __future__ import annotations

import asyncio
import itertools

from broker.handlers.context import ITEMS_PER_TURN, in_turns


def test_other_clients_are_served_between_turns() -> None:
    order: list[str] = []

    def double(number: int) -> int:
        order.append("item")
        return 2 * number

    async def main() -> list[int]:
        async def another_client() -> None:
            while True:
                order.append("other")
                await asyncio.sleep(0)

        other = asyncio.create_task(another_client())
        await asyncio.sleep(0)
        try:
            return await in_turns(double, range(10 * ITEMS_PER_TURN))
        finally:
            other.cancel()

    assert asyncio.run(main()) == [2 * n for n in range(10 * ITEMS_PER_TURN)]
    runs = [len(list(run)) for who, run in itertools.groupby(order) if who == "item"]
    assert runs == [ITEMS_PER_TURN] * 10, f"items done without a turn for others: {runs}"
