"""The roller over random clusters: a simulated cluster whose partitions, ISRs, quorum and
pods move as a real one's do (a deleted pod is gone a while, then starts, then catches up),
rolled step by step with restart verdicts computed by the broker's own rules from the
simulated state. Whatever the layout, assignment, lag and stuck pods, no restart ever takes a
partition below `min.insync.replicas` or away from its last in-sync replica, nor the quorum
below a caught-up majority; and every roll finishes once the cluster heals."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.restarts import PartitionView, QuorumView, partitions_at_risk, quorum_at_risk
from gregor_operator.models import KafkaCluster
from gregor_operator.objects import VOTER_ROLES, Pool, Role, pools
from gregor_operator.observed import (
    BrokerFacts,
    Observed,
    PodState,
    StatefulSetState,
    Verdict,
)
from gregor_operator.roller import (
    Step,
    next_step,
    node_id,
    rollout_status,
    verdicts_wanted,
    whom_to_ask,
)

STEP_S = 10.0
"""Simulated time between reconciliations."""

DNS_TTL_S = 30.0


@dataclass
class Node:
    pod: str
    pool: Pool
    ordinal: int
    revision: str = "old"
    phase: str = "ready"
    """ready, deleting, missing, starting, stuck."""
    since: int = 0
    """The step the phase began."""
    asked: bool = False
    """Its pod carries the `gregor.dev/restart` annotation (the pod replacing it does not)."""

    @property
    def id(self) -> int:
        return node_id(self.pool, self.ordinal)

    @property
    def voter(self) -> bool:
        return self.pool.role in VOTER_ROLES

    @property
    def broker(self) -> bool:
        return self.pool.is_broker


@dataclass
class Partition:
    replicas: tuple[int, ...]
    min_isr: int
    isr: set[int]


@dataclass
class World:
    pools: list[Pool]
    nodes: list[Node]
    partitions: list[Partition]
    caught_up: set[int]
    """Voters caught up with the quorum's leader."""
    lag_steps: int
    """How long a node that is back takes to rejoin its ISRs and catch up."""
    step: int = 0
    restarts: list[str] = field(default_factory=list)

    def node(self, pod: str) -> Node:
        return next(n for n in self.nodes if n.pod == pod)

    def up(self, node: Node) -> bool:
        return node.phase == "ready"

    def observed(self) -> Observed:
        statefulsets = {
            pool.role: StatefulSetState(pool.spec.replicas, "new", None) for pool in self.pools
        }
        pods = [
            PodState(
                n.pod,
                n.pool.role,
                n.ordinal,
                ready=n.phase == "ready",
                revision=n.revision,
                deleting=n.phase == "deleting",
                stuck="CrashLoopBackOff" if n.phase == "stuck" else None,
                restart_requested=n.asked,
                ready_for_s=(self.step - n.since) * STEP_S if n.phase == "ready" else 0.0,
            )
            for n in self.nodes
            if n.phase != "missing"
        ]
        return Observed(statefulsets, pods)

    def views(self) -> list[PartitionView]:
        return [
            PartitionView("t", i, p.replicas, tuple(sorted(p.isr)), p.min_isr)
            for i, p in enumerate(self.partitions)
        ]

    def quorum(self) -> QuorumView | None:
        voters = [n for n in self.nodes if n.voter]
        leaders = sorted(n.id for n in voters if self.up(n) and n.id in self.caught_up)
        if not leaders:
            return None
        return QuorumView(
            leaders[0], leaders[0], tuple(n.id for n in voters), frozenset(self.caught_up)
        )

    def verdict(self, nodes: tuple[int, ...]) -> Verdict | None:
        blockers = partitions_at_risk(self.views(), nodes)
        quorum = self.quorum()
        voting = any(n.voter and n.id in nodes for n in self.nodes)
        if voting and quorum is None:
            return None  # no leader to ask
        risk = quorum_at_risk(quorum, nodes) if voting and quorum is not None else None
        return Verdict(
            nodes,
            safe=not blockers and risk is None,
            blocking=tuple(f"t-{b.view.partition} ({b.rule})" for b in blockers),
            quorum_risk=risk,
        )

    def facts(self) -> BrokerFacts | None:
        if not all(self.up(n) for n in self.nodes):
            return None  # the handler asks only a cluster whose pods are all ready
        leader = self.quorum()
        active = next((n.pod for n in self.nodes if leader and n.id == leader.leader), None)
        facts = BrokerFacts(
            {n.id: "Unfenced" for n in self.nodes if n.broker}, 0, active_controller=active
        )
        verdicts = {}
        observed = self.observed()
        for ask in verdicts_wanted(self.pools, observed, {}, facts):  # as the handler asks
            if not whom_to_ask(ask, observed, active):
                continue
            found = self.verdict(ask.nodes)
            if found is not None:
                verdicts[ask.nodes] = found
                if found.safe:
                    break
        return BrokerFacts(facts.brokers, 0, active, verdicts)

    def stop(self, node: Node) -> None:
        """The pod is deleted: check what its stop costs first, by the rules' own terms."""
        if self.up(node):
            for p in self.partitions:
                if node.id not in p.replicas or not p.isr:
                    continue
                after = p.isr - {node.id}
                if len(p.replicas) > 1:
                    assert after, f"{node.pod} was the last in-sync replica of {p}"
                if len(p.replicas) > p.min_isr:
                    assert len(p.isr) >= p.min_isr, f"{node.pod} stopped, {p} under min ISR"
                    assert len(after) >= p.min_isr, f"{node.pod} took {p} below min ISR"
            if node.voter:
                voters = {n.id for n in self.nodes if n.voter}
                staying = self.caught_up - {node.id}
                one_of_two = len(voters) <= 2 and staying == voters - {node.id}
                assert len(staying) > len(voters) // 2 or one_of_two, (
                    f"{node.pod} left the quorum {staying} of {voters}"
                )
        for p in self.partitions:
            p.isr.discard(node.id)
        self.caught_up.discard(node.id)
        node.phase, node.since = "deleting", self.step

    def advance(self) -> None:
        """One step of time: deleted pods go, come back at the new revision, start, and
        catch up `lag_steps` after they are ready; lagging replicas of ready nodes do too."""
        self.step += 1
        for node in self.nodes:
            age = self.step - node.since
            if node.phase == "deleting" and age >= 1:
                node.phase, node.since = "missing", self.step
            elif node.phase == "missing" and age >= 1:
                node.phase, node.since, node.revision = "starting", self.step, "new"
                node.asked = False
            elif node.phase == "starting" and age >= 2:
                node.phase, node.since = "ready", self.step
            elif node.phase == "ready" and age >= self.lag_steps:
                for p in self.partitions:
                    if node.id in p.replicas:
                        p.isr.add(node.id)
                if node.voter:
                    self.caught_up.add(node.id)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    combined = draw(st.booleans())
    if combined:
        spec = {"combined": {"replicas": draw(st.sampled_from([1, 2, 3])), "storage": {}}}
    else:
        spec = {
            "controllers": {"replicas": draw(st.sampled_from([1, 3])), "storage": {}},
            "brokers": {"replicas": draw(st.integers(1, 6))},
        }
    cluster = KafkaCluster.model_validate(
        {"apiVersion": "gregor.dev/v1alpha1", "kind": "KafkaCluster", "spec": spec}
    )
    every_pool = pools(cluster.spec)
    nodes = [
        Node(f"gregor-{pool.role}-{i}", pool, i)
        for pool in every_pool
        for i in range(pool.spec.replicas)
    ]
    brokers = [n.id for n in nodes if n.broker]
    partitions = []
    for _ in range(draw(st.integers(0, 12))):
        rf = draw(st.integers(1, min(3, len(brokers))))
        replicas = tuple(draw(st.permutations(brokers))[:rf])
        isr = {r for r in replicas if draw(st.booleans())} or {replicas[0]}
        partitions.append(Partition(replicas, draw(st.integers(1, 2)), isr))
    voters = [n.id for n in nodes if n.voter]
    caught_up = {v for v in voters if draw(st.booleans())} | {voters[0]}
    for node in nodes:  # some pods start out stuck, some not ready yet
        node.phase = draw(st.sampled_from(["ready", "ready", "ready", "starting", "stuck"]))
        if node.phase != "ready":
            for p in partitions:
                p.isr.discard(node.id)
            caught_up.discard(node.id)
    if draw(st.booleans()):  # a partial roll left behind: some pods already at the new one
        for node in nodes:
            node.revision = draw(st.sampled_from(["old", "new"]))
    for node in nodes:  # some pods a user asked to restart
        node.asked = draw(st.booleans()) and draw(st.booleans())
    return World(every_pool, nodes, partitions, caught_up, lag_steps=draw(st.integers(0, 4)))


MAX_STEPS = 400
MAX_CRASHES = 5
"""How many times a roll's operator is killed at most (an operator killed at every step
never restarts anything, and no roll could finish)."""


@settings(max_examples=300, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_a_roll_never_costs_availability_and_always_finishes(
    world: World, chance: random.Random
) -> None:
    """The operator is also killed at random between writing a step to `status.rollout` and
    deleting its pod: the next one decides again from what Kubernetes shows (the record only
    says what was under way), and no pod is ever restarted twice."""
    expected = [n.pod for n in world.nodes]
    crashes = 0
    record: dict[str, Any] | None = None  # status.rollout, as the operator last wrote it
    for _ in range(MAX_STEPS):
        for node in world.nodes:  # a stuck pod is stuck until it is restarted
            if node.phase == "stuck" and node.revision == "new":
                node.phase, node.since = "starting", world.step
        observed, facts = world.observed(), world.facts()
        step = next_step(world.pools, expected, observed, facts, dns_ttl_s=DNS_TTL_S, moved={})
        record = rollout_status(
            observed, {}, facts, step, paused=False, recorded=record, expected=expected
        )
        if record is not None:
            listed = [entry["pod"] for entry in record["pods"]]
            assert len(listed) == len(set(listed)), record
        if step.restart is not None and crashes < MAX_CRASHES and chance.random() < 0.2:
            crashes += 1
            step = Step()  # the operator died after recording the step, before the deletion
        if step.restart is not None:
            node = world.node(step.restart.pod)
            assert node.revision == "old" or node.asked, f"{node.pod} restarted for nothing"
            assert all(n.phase not in ("deleting", "missing") for n in world.nodes)
            world.stop(node)
            world.restarts.append(node.pod)
        done = all(n.revision == "new" and n.phase == "ready" and not n.asked for n in world.nodes)
        if done:
            break
        world.advance()
    else:
        raise AssertionError(f"the roll did not finish in {MAX_STEPS} steps: {world.nodes}")
    finished = rollout_status(
        world.observed(), {}, None, Step(), paused=False, recorded=record, expected=expected
    )
    assert finished is None, finished  # nothing left Restarting once every pod is back
    assert len(world.restarts) == len(set(world.restarts)), world.restarts
    restarted: set[Role] = {world.node(pod).pool.role for pod in world.restarts}
    assert restarted <= {pool.role for pool in world.pools}
