"""The roller over random clusters: a simulated cluster whose partitions, ISRs, quorum and
pods move as a real one's do (a deleted pod is gone a while, then starts, then catches up),
rolled step by step with restart verdicts computed by the broker's own rules from the
simulated state. Whatever the layout, racks, assignment, lag, stuck pods and
`spec.rollout.maxParallel`, no restart (nor batch of restarts) ever takes a partition below
`min.insync.replicas` or away from its last in-sync replica, nor the quorum below a
caught-up majority; and every roll finishes once the cluster heals."""

from __future__ import annotations

import dataclasses
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
    ASK_ROUNDS,
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
    rack: str | None = None
    """The rack (zone) it was told, with spec.rack."""
    drained: bool = False
    """Its Kubernetes node is cordoned (a drain); its successor runs on another."""
    incarnation: int = 0
    """How many times its pod was recreated (its uid changes with it)."""

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
    max_parallel: int = 1
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
                rack=n.rack,
                uid=f"{n.pod}/{n.incarnation}",
                node=f"node-of-{n.pod}-{n.revision}",
                ready_for_s=(self.step - n.since) * STEP_S if n.phase == "ready" else 0.0,
            )
            for n in self.nodes
            if n.phase != "missing"
        ]
        cordoned = frozenset(f"node-of-{n.pod}-{n.revision}" for n in self.nodes if n.drained)
        return Observed(statefulsets, pods, cordoned=cordoned)

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
        draining = any(n.drained and self.up(n) for n in self.nodes)
        if not all(self.up(n) for n in self.nodes) and not draining:
            return None  # the handler asks a cluster whose pods are all ready, or drained
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

    def decide(self, expected: list[str]) -> tuple[Observed, BrokerFacts | None, Step]:
        """One decision as the handler makes it: plan, ask the verdicts a batch wants, plan
        again, until none is wanted or `ASK_ROUNDS` are spent."""
        observed, facts = self.observed(), self.facts()

        def step_with(facts: BrokerFacts | None) -> Step:
            return next_step(
                self.pools,
                expected,
                observed,
                facts,
                dns_ttl_s=DNS_TTL_S,
                moved={},
                max_parallel=self.max_parallel,
            )

        step = step_with(facts)
        for _ in range(ASK_ROUNDS):
            if not step.asks or facts is None:
                break
            answers = {}
            for ask in step.asks:
                found = self.verdict(ask.nodes)
                if whom_to_ask(ask, observed, facts.active_controller) and found is not None:
                    answers[ask.nodes] = found
            if not answers:
                break
            facts = dataclasses.replace(facts, verdicts={**facts.verdicts, **answers})
            step = step_with(facts)
        return observed, facts, step

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
                node.asked = node.drained = False
                node.incarnation += 1
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
    if draw(st.booleans()):  # spec.rack: each node told a zone (the pods spread over them)
        zones = draw(st.sampled_from([("a",), ("a", "b"), ("a", "b", "c")]))
        for node in nodes:
            node.rack = zones[node.ordinal % len(zones)]
    rack_aware = draw(st.booleans())  # the controller's placement: a replica per rack
    partitions = []
    for _ in range(draw(st.integers(0, 12))):
        rf = draw(st.integers(1, min(3, len(brokers))))
        replicas = tuple(draw(st.permutations(brokers))[:rf])
        racks = [next(n.rack for n in nodes if n.id == r and n.broker) for r in replicas]
        if rack_aware and racks[0] is not None and len(set(racks)) < len(racks):
            replicas = replicas[:1]  # no room for more in distinct racks: RF 1 instead
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
    for node in nodes:  # some pods a user asked to restart, some brokers' nodes drained
        node.asked = draw(st.booleans()) and draw(st.booleans())
        node.drained = node.broker and draw(st.booleans()) and draw(st.booleans())
    return World(
        every_pool,
        nodes,
        partitions,
        caught_up,
        lag_steps=draw(st.integers(0, 4)),
        max_parallel=draw(st.sampled_from([1, 1, 2, 3, 6])),
    )


MAX_STEPS = 400
MAX_CRASHES = 5
"""How many times a roll's operator is killed at most (an operator killed at every step
never restarts anything, and no roll could finish)."""


def roll(world: World, chance: random.Random, max_crashes: int = MAX_CRASHES) -> list[list[str]]:
    """Roll `world` to the end, checking each step; the operator is killed at random (at
    most `max_crashes` times) between writing a step to `status.rollout` and deleting its
    pods. Returns the restarts, batch by batch."""
    expected = [n.pod for n in world.nodes]
    crashes = 0
    batches: list[list[str]] = []
    record: dict[str, Any] | None = None  # status.rollout, as the operator last wrote it
    for _ in range(MAX_STEPS):
        for node in world.nodes:  # a stuck pod is stuck until it is restarted
            if node.phase == "stuck" and node.revision == "new":
                node.phase, node.since = "starting", world.step
        observed, facts, step = world.decide(expected)
        record = rollout_status(
            observed, {}, facts, step, paused=False, recorded=record, expected=expected
        )
        if record is not None:
            listed = [entry["pod"] for entry in record["pods"]]
            assert len(listed) == len(set(listed)), record
            assert all(entry["attempts"] <= 1 for entry in record["pods"]), record
        if step.restarts and crashes < max_crashes and chance.random() < 0.2:
            crashes += 1
            step = Step()  # the operator died after recording the step, before the deletion
        batch = [world.node(restart.pod) for restart in step.restarts]
        if len(batch) > 1:  # rule 10: brokers of one rack, no more than allowed
            assert len(batch) <= world.max_parallel, step
            assert all(n.pool.role == "broker" for n in batch), step
            assert len({n.rack for n in batch}) == 1, step
        if batch:  # rule 2: nothing restarts while a restart is under way
            assert all(n.phase not in ("deleting", "missing") for n in world.nodes)
            batches.append([n.pod for n in batch])
        for node in batch:  # each stop is checked against what the ones before it left
            assert node.revision == "old" or node.asked or node.drained, f"{node.pod}: why?"
            world.stop(node)
            world.restarts.append(node.pod)
        done = all(
            n.revision == "new" and n.phase == "ready" and not n.asked and not n.drained
            for n in world.nodes
        )
        if done:
            break
        world.advance()
    else:
        raise AssertionError(f"the roll did not finish in {MAX_STEPS} steps: {world.nodes}")
    finished = rollout_status(
        world.observed(), {}, None, Step(), paused=False, recorded=record, expected=expected
    )
    assert finished is None, finished  # nothing left Restarting once every pod is back
    return batches


@settings(max_examples=300, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_a_roll_never_costs_availability_and_always_finishes(
    world: World, chance: random.Random
) -> None:
    """Whatever the operator's crashes, it decides again from what Kubernetes shows (the
    record only says what was under way), and no pod is ever restarted twice."""
    roll(world, chance)
    assert len(world.restarts) == len(set(world.restarts)), world.restarts
    restarted: set[Role] = {world.node(pod).pool.role for pod in world.restarts}
    assert restarted <= {pool.role for pool in world.pools}


def zoned(max_parallel: int, min_isr: int = 2) -> World:
    """3 controllers and 6 brokers over zones a, b, c (brokers 0 and 3 in a, ...), each
    partition with a replica in every zone (rack-aware placement), all of them in sync."""
    cluster = KafkaCluster.model_validate(
        {
            "apiVersion": "gregor.dev/v1alpha1",
            "kind": "KafkaCluster",
            "spec": {
                "controllers": {"replicas": 3, "storage": {}},
                "brokers": {"replicas": 6},
            },
        }
    )
    every_pool = pools(cluster.spec)
    nodes = [
        Node(f"gregor-{pool.role}-{i}", pool, i, rack="abc"[i % 3])
        for pool in every_pool
        for i in range(pool.spec.replicas)
    ]
    partitions = [
        Partition((a, b, c), min_isr, {a, b, c}) for a in (0, 3) for b in (1, 4) for c in (2, 5)
    ]
    voters = {n.id for n in nodes if n.voter}
    return World(every_pool, nodes, partitions, voters, lag_steps=1, max_parallel=max_parallel)


def test_with_rack_aware_placement_a_zone_of_brokers_restarts_at_a_time() -> None:
    """RF 3, min ISR 2, a replica in each zone: the two brokers of a zone share no
    partition, and one replica of each may stop, so `maxParallel: 2` rolls the six brokers
    in three batches, one zone each; the voters go one at a time first, the quorum's
    leader (controller 0) last."""
    batches = roll(zoned(max_parallel=2), random.Random(0), max_crashes=0)
    assert batches == [
        ["gregor-controller-1"],
        ["gregor-controller-2"],
        ["gregor-controller-0"],
        ["gregor-broker-0", "gregor-broker-3"],
        ["gregor-broker-1", "gregor-broker-4"],
        ["gregor-broker-2", "gregor-broker-5"],
    ]
    one_by_one = roll(zoned(max_parallel=1), random.Random(0), max_crashes=0)
    assert [len(batch) for batch in one_by_one] == [1] * 9


def test_a_batch_is_never_larger_than_what_the_verdicts_prove() -> None:
    """One partition placed without racks, on brokers 0 and 3 (both zone a) and 1: the two
    zone-a brokers may not stop together (one in-sync replica would stay, min ISR 2), so
    each goes alone; the other zones still go as pairs."""
    world = zoned(max_parallel=3)
    world.partitions.append(Partition((0, 3, 1), 2, {0, 3, 1}))
    batches = roll(world, random.Random(0), max_crashes=0)
    assert batches[3:] == [
        ["gregor-broker-0"],
        ["gregor-broker-1", "gregor-broker-4"],
        ["gregor-broker-2", "gregor-broker-5"],
        ["gregor-broker-3"],
    ]
