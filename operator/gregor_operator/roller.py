"""The roller: which pod of a `KafkaCluster` to restart next, if any, and what holds the roll.

What it owns: the rules below, decided from the pools the spec has, what Kubernetes shows of
their pods and what the nodes say of stopping each one (their restart verdicts, `Verdict`).
It is pure, as the planner is: the same inputs give the same step, and `tests/unit/operator`
tries random clusters against it. What it must never do: call Kubernetes or Kafka, read a
clock, or restart a pod the rules have not cleared. Strimzi's KafkaRoller is the reference;
where these rules differ, they say why.

A rolling restart follows these rules, one decision per reconciliation:

1. A pod is *due* when its StatefulSet revision is not the StatefulSet's update revision
   (its configuration, image or pod template changed), when a broker's address on an
   external listener is no longer the one it started with, when it carries the
   `gregor.dev/restart` annotation, or when it is a broker on a cordoned node (a drain:
   brokers' disruption budgets refuse every eviction, so a drain waits for the roll to
   move them, under the rules below). Only due pods are restarted.
2. Never more than one restart (one pod, or one batch of rule 10) at a time: while a pod
   is being deleted, nothing else is; and nothing at all while `spec.rollout.paused` is
   true.
3. Every pod the cluster should have must exist: a pod the StatefulSet has not (re)created
   yet, a restarted one among them, holds every restart. Counting only the pods that exist
   once let a roll restart a second controller while the first was still gone.
4. A due pod that is stuck (crash-looping, unable to pull its image or to be scheduled) is
   restarted first: it is not serving, and its new revision may fix it.
5. Otherwise every pod must be ready before the next restart, so each restart waits until
   the previous pod is back, and a node still recovering its logs is never restarted. One
   exception: a ready broker on a cordoned node may go while other pods are not ready (a
   drain evicts the node's controller too, which may not come back before the node does,
   and the drain would wait for ever); its verdict alone decides, as it weighs every ISR.
6. Controllers go first, then combined nodes, then brokers; within a pool, by ordinal, with
   the active controller last (its restart moves the leadership once, not at every step).
7. A node that is a broker is restarted only when a running broker's restart verdict clears
   its stop (`broker.restarts`: no partition would lose its last in-sync replica, nor fall
   or stay below `min.insync.replicas`; partitions no restart can keep writable, RF 1 or
   RF ≤ min ISR, do not hold it). A broker whose verdict
   blocks is passed over for the next one that is clear: one partition short of replicas
   holds only the brokers that have a replica of it, not the whole roll.
8. A voter (a controller or combined node) is restarted only when the quorum's leader says
   the other voters that have caught up are still a majority without it, and once every
   other voter has been ready for the cluster DNS's TTL (`dns_ttl_s`): a restarted pod has a
   new address, and the cluster DNS may hand out the old one that long. Voters are not
   passed over: the brokers wait for the quorum's roll to finish.
9. Each restart is a pod deletion: SIGTERM is the broker's controlled shutdown, and the
   StatefulSet recreates the pod at the update revision.
10. With `spec.rollout.maxParallel` above 1, the broker rule 7 cleared takes other due
   brokers of its rack (of the whole cluster, when the pods have no rack) with it, in the
   roll's order, each only when the verdict of the whole batch with it clears them all:
   what blocks a set blocks every larger one, so the batch grows one verified member at a
   time and is never larger than what a verdict proved. Combined nodes are voters and
   never join a batch. A verdict not asked yet is asked (`Step.asks`) before the batch
   grows by it; without an answer, the batch restarts as it is.

Besides the roll, a broker whose node refused its empty volume, and whose new volume the user
accepted (`gregor.dev/format-volumes`), is restarted at once (rule 2 still holds): its new pod
formats the volume (ADR 0023).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .objects import BROKER_ROLES, RESTART_ANNOTATION, VOTER_ROLES, Pool, Role
from .observed import BrokerFacts, Observed, PodState
from .volumes import FORMAT_ANNOTATION, says_not_formatted

__all__ = [
    "ASK_ROUNDS",
    "Ask",
    "Restart",
    "Step",
    "a_voter_is_due",
    "drained",
    "due",
    "next_step",
    "node_id",
    "outdated",
    "reason",
    "rollout_status",
    "verdicts_wanted",
    "whom_to_ask",
]

ROLE_ORDER: tuple[Role, ...] = ("controller", "combined", "broker")

ASK_ROUNDS = 16
"""At most this many rounds of restart verdicts per decision: the single pods' (one round),
then one for each broker a batch tries to grow by (rule 10); the batch is carried out as it
stands after the last."""


@dataclass(frozen=True, slots=True)
class Restart:
    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class Ask:
    """A restart verdict the roller needs: of stopping `nodes` (the pods `pods`) together,
    asked of the quorum's leader when `voter` (only it can judge the quorum), else of a
    running broker not among them."""

    nodes: tuple[int, ...]
    pods: tuple[str, ...]
    voter: bool


@dataclass(frozen=True, slots=True)
class Step:
    """What the roll does now: restart pods (one, or a batch of rule 10), or nothing (then
    `held` says why, and `settling` how soon a voter's wait for the DNS is over). `asks`:
    the verdicts that would let the batch grow, to ask before it is carried out."""

    restarts: tuple[Restart, ...] = ()
    held: str | None = None
    settling: tuple[float, str] | None = None
    asks: tuple[Ask, ...] = ()

    @property
    def restart(self) -> Restart | None:
        """The first pod it restarts (the only one, but for a batch)."""
        return self.restarts[0] if self.restarts else None


def node_id(pool: Pool, ordinal: int) -> int:
    return pool.node_id_base + ordinal


def outdated(pod: PodState, observed: Observed) -> bool:
    """Rule 1, for the revision."""
    statefulset = observed.statefulsets.get(pod.pool)
    return (
        statefulset is not None
        and statefulset.update_revision is not None
        and pod.revision != statefulset.update_revision
    )


def a_voter_is_due(observed: Observed, moved: Collection[str] = ()) -> bool:
    """Whether a voter is to be restarted: only then does the roll need to know which one
    is the active controller (rules 6 and 8), which costs asking each voter."""
    elsewhere = set(drained(observed)) | set(moved)
    return any(
        pod.pool in VOTER_ROLES
        and (outdated(pod, observed) or pod.name in elsewhere or pod.restart_requested)
        for pod in observed.pods
    )


def _order(facts: BrokerFacts | None) -> _Ordering:
    return _Ordering(None if facts is None else facts.active_controller)


@dataclass(frozen=True, slots=True)
class _Ordering:
    active_controller: str | None

    def __call__(self, pod: PodState) -> tuple[int, bool, int]:
        rank = ROLE_ORDER.index(pod.pool)
        return rank, self.active_controller == pod.name, pod.ordinal


def drained(observed: Observed) -> dict[str, str]:
    """Rule 1, for drains: each broker pod on a cordoned node, with why it is to restart.
    Its successor is scheduled elsewhere (or waits, unschedulable, for a node to take it:
    a volume bound to the drained node holds it there)."""
    return {
        pod.name: f"its node {pod.node} is cordoned (drained)"
        for pod in observed.pods
        if pod.pool in BROKER_ROLES and pod.node in observed.cordoned and not pod.deleting
    }


def due(observed: Observed, moved: Mapping[str, str]) -> list[PodState]:
    """Rule 1; `moved`: the pods whose external address moved, with why."""
    elsewhere = drained(observed) | dict(moved)
    return [
        pod
        for pod in observed.pods
        if outdated(pod, observed) or pod.name in elsewhere or pod.restart_requested
    ]


def reason(pod: PodState, observed: Observed, moved: Mapping[str, str]) -> str:
    """Why a due pod restarts (rule 1), as the Event and `status.rollout` say it."""
    elsewhere = drained(observed) | dict(moved)
    if pod.name in elsewhere:
        return elsewhere[pod.name]
    if outdated(pod, observed):
        if pod.stuck is not None:
            return f"it is stuck ({pod.stuck}) on an old revision"
        return "its configuration or image changed"
    return f"asked by the {RESTART_ANNOTATION} annotation"


def verdicts_wanted(
    pools: Sequence[Pool], observed: Observed, moved: Mapping[str, str], facts: BrokerFacts
) -> list[Ask]:
    """The verdicts rules 7 and 8 will weigh at this step, in the order they are tried: each
    outdated voter's while the quorum rolls (only the first is weighed), else each outdated
    broker's."""
    by_role = {pool.role: pool for pool in pools}
    waiting = sorted(due(observed, moved), key=_order(facts))
    if not all(pod.ready for pod in observed.pods):  # 5: only drained brokers may go
        leaving = drained(observed)
        waiting = [pod for pod in waiting if pod.name in leaving and pod.ready]
    voters = [pod for pod in waiting if pod.pool in VOTER_ROLES]
    chosen = voters[:1] or waiting
    return [
        Ask((node_id(by_role[pod.pool], pod.ordinal),), (pod.name,), pod.pool in VOTER_ROLES)
        for pod in chosen
        if pod.pool in by_role
    ]


def whom_to_ask(ask: Ask, observed: Observed, active_controller: str | None) -> list[str]:
    """The pods to ask for `ask`'s verdict, in order, until one answers: the quorum's leader
    for a voter (only it can judge the quorum); for a broker, a ready broker other than the
    ones asked about (any broker holds every partition's ISR), or that broker itself when it
    is the only one."""
    ready = sorted(pod.name for pod in observed.pods if pod.ready and not pod.deleting)
    if ask.voter:
        return [active_controller] if active_controller in ready else []
    brokers = [
        pod.name
        for pod in observed.pods
        if pod.pool in BROKER_ROLES and pod.name in ready and pod.name not in ask.pods
    ]
    alone = len(ask.pods) == 1 and ask.pods[0] in ready
    return sorted(brokers)[:2] or (list(ask.pods) if alone else [])


def next_step(
    pools: Sequence[Pool],
    expected: Sequence[str],
    observed: Observed,
    facts: BrokerFacts | None,
    *,
    dns_ttl_s: float,
    moved: Mapping[str, str],
    to_format: Collection[int] = (),
    paused: bool = False,
    max_parallel: int = 1,
) -> Step:
    """The rules of the module's docstring, in order; `expected`: the name of every pod the
    pools should have (rule 3)."""
    by_role = {pool.role: pool for pool in pools}
    deleting = [pod.name for pod in observed.pods if pod.deleting]
    if deleting:  # 2
        return Step(held=f"waiting for {', '.join(deleting)} to be deleted")
    if paused:  # 2
        return Step(held="paused (spec.rollout.paused)")
    for pod in observed.pods:
        pool = by_role.get(pod.pool)
        accepted = pool is not None and node_id(pool, pod.ordinal) in to_format
        if accepted and not pod.ready and says_not_formatted(pod):
            why = f"its new volume is to be formatted ({FORMAT_ANNOTATION})"
            return Step((Restart(pod.name, why),))
    waiting = due(observed, moved)  # 1
    if not waiting:
        return Step()
    present = {pod.name for pod in observed.pods}
    missing = [name for name in expected if name not in present]
    if missing:  # 3
        return Step(held=f"waiting for pods not created yet: {', '.join(missing)}")
    for pod in waiting:  # 4
        if pod.stuck is not None:
            return Step((Restart(pod.name, reason(pod, observed, moved)),))
    not_ready = [pod.name for pod in observed.pods if not pod.ready]
    if not_ready:  # 5
        leaving = drained(observed)
        waiting = [pod for pod in waiting if pod.name in leaving and pod.ready]
        if not waiting:
            return Step(held=f"waiting for {', '.join(sorted(not_ready))} to be ready")
    held: list[str] = []
    ordered = sorted(waiting, key=_order(facts))
    for pod in ordered:  # 6
        pool = by_role.get(pod.pool)
        if pool is None:
            continue
        blocked = _verdict_blocks(pool, node_id(pool, pod.ordinal), facts)  # 7, 8
        if blocked is not None:
            held.append(f"{pod.name}: {blocked}")
            if pool.is_controller:
                break
            continue
        if pool.is_controller:
            settling = _dns_settling(pod, observed, dns_ttl_s)  # 8
            if settling is not None:
                return Step(settling=settling, held=settling[1])
            return Step((Restart(pod.name, reason(pod, observed, moved)),))
        batch, asks = _batch(pod, ordered, by_role, facts, max_parallel)  # 10
        return Step(tuple(Restart(p.name, reason(p, observed, moved)) for p in batch), asks=asks)
    return Step(held="restarts held: " + "; ".join(held))


def _batch(
    first: PodState,
    ordered: Sequence[PodState],
    by_role: Mapping[Role, Pool],
    facts: BrokerFacts | None,
    max_parallel: int,
) -> tuple[list[PodState], tuple[Ask, ...]]:
    """Rule 10: `first` (cleared alone) and the due brokers of its rack that a verdict of
    the whole batch clears, in order; and the verdict to ask next, if the batch may grow."""
    batch = [first]
    ids: tuple[int, ...] = (node_id(by_role[first.pool], first.ordinal),)
    if facts is None:
        return batch, ()
    for pod in ordered:
        if len(batch) >= max_parallel:
            break
        if pod.name == first.name or pod.pool != "broker" or pod.rack != first.rack:
            continue
        alone = facts.verdicts.get((node_id(by_role[pod.pool], pod.ordinal),))
        if alone is not None and not alone.safe:
            continue  # what blocks it alone blocks it in any batch
        together = tuple(sorted((*ids, node_id(by_role[pod.pool], pod.ordinal))))
        verdict = facts.verdicts.get(together)
        if verdict is None:
            return batch, (Ask(together, (*(p.name for p in batch), pod.name), voter=False),)
        if verdict.safe:
            batch.append(pod)
            ids = together
    return batch, ()


def rollout_status(
    observed: Observed,
    moved: Mapping[str, str],
    facts: BrokerFacts | None,
    step: Step,
    *,
    paused: bool,
    recorded: Mapping[str, Any] | None,
    expected: Collection[str],
) -> dict[str, Any] | None:
    """`status.rollout`: the pods the roll restarts, in its order, the one it is restarting
    (kept `Restarting` from the record until it is back and ready, so an operator that
    restarts meanwhile still says so), and what holds the next. None when no roll is due.
    `expected`: the pods the cluster should have (a record of any other is dropped)."""
    present = {pod.name: pod for pod in observed.pods}
    now = {restart.pod for restart in step.restarts}
    attempts: dict[str, int] = {}
    for entry in (recorded or {}).get("pods") or []:
        name, tried = str(entry.get("pod")), int(entry.get("attempts") or 0)
        pod = present.get(name)
        undone = (  # recorded, then the operator stopped before it deleted the pod
            entry.get("state") == "Restarting"
            and pod is not None
            and pod.uid is not None
            and pod.uid == entry.get("uid")
            and not pod.deleting
        )
        attempts[name] = tried - 1 if undone else tried
    pods: list[dict[str, Any]] = []
    for entry in (recorded or {}).get("pods") or []:
        if entry.get("state") != "Restarting" or entry.get("pod") not in expected:
            continue
        if entry["pod"] in now or any(e["pod"] == entry["pod"] for e in pods):
            continue
        pod = present.get(entry["pod"])
        if pod is None or pod.deleting or not pod.ready:
            pods.append(
                {
                    "pod": entry["pod"],
                    "reason": str(entry.get("reason", "")),
                    "state": "Restarting",
                    "attempts": attempts.get(entry["pod"], 1),
                }
                | ({"uid": entry["uid"]} if entry.get("uid") else {})
            )
    pods += [
        {
            "pod": restart.pod,
            "reason": restart.reason,
            "state": "Restarting",
            "attempts": attempts.get(restart.pod, 0) + 1,
        }
        | ({"uid": uid} if (uid := getattr(present.get(restart.pod), "uid", None)) else {})
        for restart in step.restarts
    ]
    listed = {entry["pod"] for entry in pods}
    pods += [
        {
            "pod": pod.name,
            "reason": reason(pod, observed, moved),
            "state": "Pending",
            "attempts": attempts.get(pod.name, 0),
        }
        for pod in sorted(due(observed, moved), key=_order(facts))
        if pod.name not in listed
    ]
    if not pods:
        return None
    found: dict[str, Any] = {"paused": paused, "pods": pods}
    if step.held is not None:
        found["held"] = step.held
    return found


def _verdict_blocks(pool: Pool, node: int, facts: BrokerFacts | None) -> str | None:
    """Why rule 7 or 8 holds `node` (None: its verdict clears it)."""
    if facts is None:
        return "the brokers did not answer"
    verdict = facts.verdicts.get((node,))
    if verdict is None:
        return "no node could say whether it may stop"
    if verdict.safe:
        return None
    return verdict.why or "its restart verdict says it may not stop now"


def _dns_settling(pod: PodState, observed: Observed, dns_ttl_s: float) -> tuple[float, str] | None:
    voters = [o for o in observed.pods if o.name != pod.name and o.pool in VOTER_ROLES]
    newest = min(voters, key=lambda other: other.ready_for_s, default=None)
    if newest is None or newest.ready_for_s >= dns_ttl_s:
        return None
    wait = dns_ttl_s - newest.ready_for_s
    return (
        wait,
        f"restarting {pod.name} in {wait:.0f} s: {newest.name} was restarted "
        f"{newest.ready_for_s:.0f} s ago, and the cluster DNS may still give the "
        f"other voters its old address for up to {dns_ttl_s:.0f} s",
    )
