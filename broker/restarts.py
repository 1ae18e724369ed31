"""Whether nodes may stop now without costing availability: the restart verdict an operator
reads before it restarts a node (`GET /v1/restart-verdict?nodes=…` on the HTTP listener), and
what a node is doing (`GET /v1/state`).

What it owns: the rules below, as pure functions of the metadata a node already holds (every
partition's replicas and ISR, each topic's `min.insync.replicas`) and of the quorum as its
leader sees it. Nothing here asks another node, reads a clock or touches a log.

A set of nodes may stop together unless one of these holds for a partition with a replica
among them (Strimzi's availability rule, for a set of nodes rather than one):

P1. Every in-sync replica would stop, and the partition has more than one replica: it would
    have no leader until one of them returned. Restarted one at a time, or once the others
    have caught up, they keep it online. (An ISR that is already empty has nothing left to
    lose: P1 does not hold its replicas, though P2 may.)
P2. The partition is already below `min.insync.replicas` and one of its replicas would stop:
    that replica may be the one it is waiting for.
P3. An in-sync replica would stop and fewer than `min.insync.replicas` in-sync replicas would
    stay: producers with `acks=all` would be refused until it returned.

P2 and P3 never block a partition with no more replicas than `min.insync.replicas` (nor does
P1 a single replica): no restart of its replicas can keep it writable with
`acks=all`, waiting does not change that, and blocking would stall every roll (a complaint
Strimzi's users file).

For the metadata quorum, only its leader knows how far each voter has got:

Q1. A voter may stop only while the voters that stay, and have caught up, are still a
    majority of all voters. A voter has caught up when its log reached the high watermark at
    a fetch within `controller.quorum.fetch.timeout.ms` (the leader counts itself). A quorum
    of one or two voters loses its majority with any one voter, and no wait changes that: one
    of its voters may stop once the other, if any, has caught up (Strimzi's rule for two).
Q2. A node that does not lead the quorum says which node does, and gives no quorum verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.metadata.image import MetadataImage

__all__ = [
    "Blocker",
    "PartitionView",
    "QuorumView",
    "caught_up_voters",
    "partition_views",
    "partitions_at_risk",
    "quorum_at_risk",
    "verdict",
]


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_isr: int


@dataclass(frozen=True, slots=True)
class Blocker:
    """A partition the stop would cost, and the rule that says so."""

    view: PartitionView
    rule: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.view.topic,
            "partition": self.view.partition,
            "replicas": list(self.view.replicas),
            "isr": list(self.view.isr),
            "minIsr": self.view.min_isr,
            "rule": self.rule,
            "reason": self.reason,
        }


def blocker(view: PartitionView, stopping: frozenset[int]) -> Blocker | None:
    """Why stopping `stopping` together would cost `view`'s availability (None: it would
    not)."""
    if stopping.isdisjoint(view.replicas):
        return None
    staying_isr = [r for r in view.isr if r not in stopping]
    if view.isr and not staying_isr and len(view.replicas) > 1:
        return Blocker(view, "P1", "every in-sync replica would stop")
    if len(view.replicas) <= view.min_isr:
        return None
    if len(view.isr) < view.min_isr:
        return Blocker(
            view,
            "P2",
            f"already below min.insync.replicas ({len(view.isr)} of {view.min_isr} in sync)",
        )
    if not stopping.isdisjoint(view.isr) and len(staying_isr) < view.min_isr:
        return Blocker(
            view,
            "P3",
            f"{len(staying_isr)} in-sync replica(s) would stay, "
            f"min.insync.replicas is {view.min_isr}",
        )
    return None


def partitions_at_risk(
    partitions: Iterable[PartitionView], stopping: Iterable[int]
) -> list[Blocker]:
    """Every partition that blocks stopping the nodes `stopping` together (P1–P3)."""
    nodes = frozenset(stopping)
    return [found for view in partitions if (found := blocker(view, nodes)) is not None]


@dataclass(frozen=True, slots=True)
class QuorumView:
    """The quorum as this node sees it."""

    node_id: int
    leader: int | None
    voters: tuple[int, ...]
    caught_up: frozenset[int]
    """The voters that have caught up, as the leader sees them (empty elsewhere)."""

    @property
    def leads(self) -> bool:
        return self.leader is not None and self.leader == self.node_id


def quorum_at_risk(view: QuorumView, stopping: Iterable[int]) -> str | None:
    """Why stopping `stopping` would leave the quorum without a caught-up majority (Q1); None
    when it would not. Only meaningful where `view.leads` (Q2)."""
    nodes = frozenset(stopping)
    voters = frozenset(view.voters)
    if nodes.isdisjoint(voters):
        return None
    staying = sorted((view.caught_up & voters) - nodes)
    majority = len(voters) // 2 + 1
    lagging = sorted(voters - nodes - view.caught_up)
    unavoidable = len(voters) <= 2 and len(nodes & voters) == 1
    if len(staying) >= majority or (unavoidable and not lagging):
        return None
    said = f"; not caught up: {', '.join(map(str, lagging))}" if lagging else ""
    return (
        f"{len(staying)} caught-up voter(s) would stay ({', '.join(map(str, staying)) or 'none'}), "
        f"a majority of {len(voters)} is {majority}{said}"
    )


def caught_up_voters(
    progress: Mapping[int, tuple[int, int]],
    *,
    leader: int,
    high_watermark: int,
    now_ms: int,
    fetch_timeout_ms: int,
) -> frozenset[int]:
    """The voters whose log reached the high watermark at a fetch no older than
    `fetch_timeout_ms` (the leader's own progress has no fetch time: it counts)."""
    return frozenset(
        voter
        for voter, (end, fetched) in progress.items()
        if voter == leader
        or (end >= high_watermark and fetched >= 0 and now_ms - fetched <= fetch_timeout_ms)
    )


def verdict(
    partitions: Callable[[], Iterable[PartitionView]],
    quorum: QuorumView | None,
    stopping: Iterable[int],
) -> dict[str, Any]:
    """The JSON answer of `/v1/restart-verdict`: `safe` is true only when no partition blocks
    and, where the stopping nodes include a voter, the quorum was judged here and does not."""
    nodes = sorted(set(stopping))
    blockers = partitions_at_risk(partitions(), nodes)
    answer: dict[str, Any] = {
        "nodes": nodes,
        "partitions": [found.as_json() for found in blockers],
    }
    voting = quorum is not None and not set(nodes).isdisjoint(quorum.voters)
    quorum_ok = True
    if quorum is not None and voting:
        judged = quorum.leads or len(quorum.voters) <= 1
        risk = quorum_at_risk(quorum, nodes) if judged else None
        answer["quorum"] = {
            "leader": quorum.leader,
            "voters": sorted(quorum.voters),
            "judged": judged,
            "caughtUp": sorted(quorum.caught_up),
            "risk": risk,
        }
        quorum_ok = judged and risk is None
    answer["safe"] = not blockers and quorum_ok
    return answer


def partition_views(
    image: MetadataImage, min_insync_replicas: Callable[[str], int]
) -> Iterator[PartitionView]:
    """Every partition of `image`, internal topics included, with its topic's
    `min.insync.replicas` as `min_insync_replicas` resolves it."""
    for topic in image.topics.values():
        min_isr = min_insync_replicas(topic.name)
        for index, state in topic.partitions.items():
            yield PartitionView(topic.name, index, state.replicas, state.isr, min_isr)
