"""Rack awareness and safe rolls on a cluster of three zones (`make cluster`: a
control plane and a worker in each of zone-a, zone-b, zone-c; ADR 0027), the operator
installed with Helm, one `KafkaCluster` of 3 controllers and 6 brokers with
`spec.rack.topologyKey: topology.kubernetes.io/zone` and `rollout.maxParallel: 2`.

Each scenario runs an idempotent `acks=all` producer (RF 3, min ISR 2) and a consumer group
from a client pod in zone-c throughout, and ends with every acknowledged record read back
exactly once and no error the clients could not retry; faults go to zone-a and zone-b. The
scenarios share the cluster (starting it is the slow part), so they run in order:

(d) every partition, internal ones included, has a replica in each zone, and each broker runs
    with its node's zone as `broker.rack`; (h) a consumer with `client.rack=zone-a` fetches
    from the zone-a replicas; (b) a config a running broker takes is set on every broker and
    restarts nothing; (a) one that needs a restart rolls every pod, the controllers one at a
    time, the brokers a zone at a time, and with `maxParallel: 1` one pod at a time; (c) the
    operator killed in the middle of a roll: it resumes and restarts no pod twice; (e)
    `kubectl drain` of zone-b's worker; (f) zone-b's node stopped for two minutes and started
    again; (g) zone-a cut off from the others for a minute and joined again.

Figures (the roll's time, per restart and in all, how many pods went at once) are printed and
kept in `var/e2e/timings.json` for docs/."""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e import nodes
from e2e.client_pod import client_pod, record, run_client
from e2e.conftest import Kubectl, collect_artifacts
from e2e.helm import Release
from e2e.resources import eventually, get, ready
from localkube.build import ensure_binaries

pytestmark = pytest.mark.timeout(2400)

CLUSTER = "zoned"
ZONE = nodes.ZONE_LABEL
CLIENT_ZONE = "zone-c"
"""Where the client pod and the operator run: the faults go to the other two zones."""
READY_WITHIN_S = 600.0
ROLL_WITHIN_S = 900.0
BROKERS = 6
CONTROLLERS = 3
SPEC: dict[str, Any] = {
    "rack": {"topologyKey": ZONE},
    "rollout": {"maxParallel": 2},
    "controllers": {"replicas": CONTROLLERS, "storage": {"size": "1Gi"}},
    "brokers": {"replicas": BROKERS, "storage": {"size": "2Gi"}},
    "listeners": [{"name": "plain", "port": 9092}],
    "config": {
        "default.replication.factor": 3,
        "min.insync.replicas": 2,
        "offsets.topic.replication.factor": 3,
        "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector",
    },
}
INFORMATIONAL = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "Broker transport failure", "brokers down")
"""What librdkafka tells a consumer of a broker it lost while it reconnects on its own: not an
error the application must handle."""


@dataclass
class Zoned:
    release: Release
    apps: str
    zones: dict[str, list[str]]
    """zone -> its nodes' names."""
    bootstrap: str


@pytest.fixture(scope="module")
def zoned(
    request: pytest.FixtureRequest,
    kubectl: Kubectl,
    kubeconfig: Path,
    broker_image: str,
    operator_image: str,
) -> Iterator[Zoned]:
    by_zone = nodes.zones(kubectl)
    if sorted(by_zone) != ["zone-a", "zone-b", "zone-c"]:
        pytest.skip(f"needs the three-zone kind cluster (make cluster); zones: {by_zone}")
    helm = str(ensure_binaries(log=lambda _: None, only=["helm"]).helm)
    suffix = secrets.token_hex(2)
    system, apps = f"e2e-zones-system-{suffix}", f"e2e-zones-apps-{suffix}"
    for name in (system, apps):
        kubectl("create", "namespace", name)
    release = Release(helm, kubeconfig, f"gregor-{suffix}", system, apps)
    release.adopt_crds(kubectl)
    release.run(
        "install",
        # No retention audit runs here: the broker image stands in for Spark's.
        *release.values(broker_image, operator_image, broker_image),
        f"--set=nodeSelector.topology\\.kubernetes\\.io/zone={CLIENT_ZONE}",
        "--wait",
        "--timeout=3m",
    )
    document = {
        "apiVersion": "gregor.dev/v1alpha1",
        "kind": "KafkaCluster",
        "metadata": {"name": CLUSTER},
        "spec": SPEC,
    }
    started = time.monotonic()
    kubectl("apply", "--server-side", "-f", "-", namespace=apps, stdin=json.dumps(document))
    cluster = eventually(
        "the zoned KafkaCluster to be Ready",
        functools.partial(ready, kubectl, apps, "kafkacluster", CLUSTER),
        timeout=READY_WITHIN_S,
    )
    record("kafkacluster_3_6_zoned_ready_s", time.monotonic() - started)
    bootstrap = cluster["status"]["listeners"][0]["bootstrapServers"]
    client_pod(kubectl, apps, bootstrap, broker_image, zone=CLIENT_ZONE)
    yield Zoned(release, apps, by_zone, bootstrap)
    if request.session.testsfailed:
        for name in (system, apps):
            collect_artifacts(name, kubectl)
    kubectl("delete", "topics,kafkaclusters", "--all", "--timeout=180s", namespace=apps)
    release.run("uninstall", "--wait", "--timeout=2m")
    for name in (apps, system):
        kubectl("delete", "namespace", name, "--wait=false")


def _in_client(kubectl: Kubectl, namespace: str, script: str) -> str:
    return kubectl("exec", "client", "--", "sh", "-c", script, namespace=namespace)


def _topic(kubectl: Kubectl, namespace: str, name: str) -> None:
    """A Topic of 6 partitions, RF 3, min ISR 2, Ready."""
    document = {
        "apiVersion": "gregor.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": {
            "cluster": CLUSTER,
            "partitions": 6,
            "replicas": 3,
            "config": {"min.insync.replicas": 2},
        },
    }
    kubectl("apply", "--server-side", "-f", "-", namespace=namespace, stdin=json.dumps(document))
    eventually(
        f"the Topic {name} to be Ready", functools.partial(ready, kubectl, namespace, "topic", name)
    )


@contextlib.contextmanager
def traffic(kubectl: Kubectl, zoned: Zoned, name: str) -> Iterator[None]:
    """An idempotent acks=all producer and a consumer group on a topic of their own, from
    before the scenario until after it; then every acknowledged record must be in the topic
    exactly once, the group must have read each, and neither client may have been told of
    an error it could not retry."""
    apps, topic = zoned.apps, f"traffic-{name}"
    _topic(kubectl, apps, topic)
    client = "python3 /client/kafka_client.py"
    _in_client(
        kubectl,
        apps,
        f"rm -f /tmp/{name}.*; "
        f"nohup {client} produce-until {topic} /tmp/{name}.stop /tmp/{name}.acked "
        f"> /tmp/{name}.producer 2>&1 & "
        f"nohup {client} group-until {topic} /tmp/{name}.drain /tmp/{name}.read "
        f"> /tmp/{name}.group 2>&1 &",
    )
    time.sleep(5)
    yield
    time.sleep(5)
    _in_client(kubectl, apps, f"touch /tmp/{name}.stop")
    producer = eventually(
        "the producer to finish",
        lambda: _last_json(kubectl, apps, f"/tmp/{name}.producer"),
        timeout=300,
    )
    # The group reads on to each partition's end once nothing more comes.
    _in_client(kubectl, apps, f"touch /tmp/{name}.drain")
    group = eventually(
        "the group to finish", lambda: _last_json(kubectl, apps, f"/tmp/{name}.group"), timeout=300
    )
    assert (producer["errors"], producer["unsent"]) == ([], 0), producer
    acked = {int(v) for v in _in_client(kubectl, apps, f"cat /tmp/{name}.acked").split()}
    assert len(acked) == producer["acknowledged"] > 0, producer
    unhandled = [e for e in group["errors"] if not any(i in e for i in INFORMATIONAL)]
    assert unhandled == [], group
    read = {int(v) for v in _in_client(kubectl, apps, f"cat /tmp/{name}.read").split() if v}
    assert not acked - read, (
        f"the group missed {len(acked - read)} acknowledged records"
        f" (read to every partition's end: {group.get('at_end')})"
    )
    everything = run_client(kubectl, apps, "consume", topic)
    assert everything["count"] == len(everything["values"]), "a record is in the topic twice"
    assert not acked - set(everything["values"]), "an acknowledged record is lost"
    print(f"{name}: {len(acked)} records acknowledged, read back once each")


def _last_json(kubectl: Kubectl, namespace: str, path: str) -> Any:
    text = _in_client(kubectl, namespace, f"cat {path} 2>/dev/null || true").strip()
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


@dataclass
class PodView:
    uid: str
    ready: bool
    node: str | None


def _pods(kubectl: Kubectl, namespace: str) -> dict[str, PodView]:
    found = json.loads(
        kubectl("get", "pods", "-l", f"gregor.dev/cluster={CLUSTER}", "-o", "json",
                namespace=namespace)
    )  # fmt: skip
    pods = {}
    for pod in found["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = pod.get("status", {}).get("conditions") or []
        up = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        pods[pod["metadata"]["name"]] = PodView(
            pod["metadata"]["uid"], up, pod["spec"].get("nodeName")
        )
    return pods


@dataclass
class Watch:
    """What the pods did while a scenario ran, looked at every second: each pod's uids in
    order; and at each look, the pods being replaced (deleted, their successor not ready
    yet) and the pods not ready for any reason (a voter waiting for its quorum's new
    leader, a node gone)."""

    started: float = field(default_factory=time.monotonic)
    uids: dict[str, list[str]] = field(default_factory=dict)
    last_ready: dict[str, str] = field(default_factory=dict)
    timeline: list[tuple[int, list[str], list[str]]] = field(default_factory=list)
    """(seconds in, replacing, not ready), at each look where any pod was either."""
    replaced_from: dict[str, float] = field(default_factory=dict)
    replaced_until: dict[str, float] = field(default_factory=dict)

    def look(self, pods: dict[str, PodView]) -> None:
        moment = time.monotonic() - self.started
        for name, seen_now in pods.items():
            seen = self.uids.setdefault(name, [seen_now.uid])
            if seen[-1] != seen_now.uid:
                seen.append(seen_now.uid)
            if seen_now.ready:
                self.last_ready.setdefault(name, seen_now.uid)
        replacing, down = [], []
        for name in sorted(self.uids):
            view = pods.get(name)
            if view is not None and view.ready:
                # Ready in this look: no longer being replaced, even if the operator deleted
                # the next pod between the last look and this one.
                self.last_ready[name] = view.uid
            if view is None or view.uid != self.last_ready.get(name):
                replacing.append(name)
                self.replaced_from.setdefault(name, moment)
            elif name in self.replaced_from:
                self.replaced_until.setdefault(name, moment)
            if view is None or not view.ready:
                down.append(name)
        if replacing or down:
            self.timeline.append((round(moment), replacing, down))

    @property
    def restarted(self) -> dict[str, int]:
        return {name: len(uids) - 1 for name, uids in self.uids.items()}

    @property
    def most_replaced_at_once(self) -> int:
        return max((len(replacing) for _, replacing, _ in self.timeline), default=0)


def _watch(
    kubectl: Kubectl,
    zoned: Zoned,
    until: Any,
    *,
    watch: Watch | None = None,
    timeout: float = ROLL_WITHIN_S,
) -> Watch:
    """Look at the pods every second until `until(watch)` is true and the cluster is Ready;
    `watch`: one that looked before the scenario began."""
    watch = watch or Watch()
    while True:
        watch.look(_pods(kubectl, zoned.apps))
        if until(watch) and ready(kubectl, zoned.apps, "kafkacluster", CLUSTER):
            return watch
        assert time.monotonic() - watch.started < timeout, f"not done: {watch.timeline[-5:]}"
        time.sleep(1)


def _zones_down(watch: Watch, racks: dict[int, str]) -> list[tuple[int, set[str]]]:
    """The moments brokers of more than one zone were not ready at once."""
    return [
        (moment, zones)
        for moment, _, down in watch.timeline
        if len(zones := {racks[int(n.rsplit("-", 1)[1])] for n in down if "-broker-" in n}) > 1
    ]


def _rack_of(zoned: Zoned, kubectl: Kubectl) -> dict[int, str]:
    found = get(kubectl, zoned.apps, "kafkacluster", CLUSTER) or {}
    return {
        n["nodeId"]: n["rack"]
        for n in (found.get("status") or {}).get("nodes") or []
        if "broker" in n["roles"] and "rack" in n
    }


def _patch(kubectl: Kubectl, zoned: Zoned, spec: dict[str, Any]) -> None:
    kubectl(
        "patch", "kc", CLUSTER, "--type=merge", "-p", json.dumps({"spec": spec}),
        namespace=zoned.apps,
    )  # fmt: skip


# -- (d) placement ------------------------------------------------------------------------------


def test_every_partition_has_a_replica_in_each_zone_and_each_broker_its_nodes_zone(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    with traffic(kubectl, zoned, "placement"):
        pods = _pods(kubectl, zoned.apps)
        node_zones = {
            node.name: node.zone for node in nodes.nodes(kubectl) if node.zone is not None
        }
        racks = _rack_of(zoned, kubectl)
        assert sorted(racks) == list(range(BROKERS)), racks
        for node_id, rack in racks.items():
            pod = f"{CLUSTER}-broker-{node_id}"
            assert rack == node_zones[pods[pod].node or ""], (pod, rack)
            command = kubectl(
                "exec", pod, "--", "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline",
                namespace=zoned.apps,
            )  # fmt: skip
            assert f"broker.rack={rack}" in command, command
        assert sorted(racks.values()) == sorted(["zone-a", "zone-b", "zone-c"] * 2)
        # Controllers spread too: a zone holds one of the three voters.
        voters = [pods[f"{CLUSTER}-controller-{i}"].node for i in range(CONTROLLERS)]
        assert sorted(node_zones[v or ""] for v in voters) == ["zone-a", "zone-b", "zone-c"]

        def with_offsets() -> dict[str, list[int]] | None:
            found: dict[str, list[int]] = run_client(kubectl, zoned.apps, "replicas")
            return found if any(p.startswith("__consumer_offsets-") for p in found) else None

        replicas = eventually("__consumer_offsets and the traffic topic", with_offsets)
        spread = {p: sorted(racks[r] for r in rs) for p, rs in replicas.items()}
        wrong = {p: zs for p, zs in spread.items() if zs != ["zone-a", "zone-b", "zone-c"]}
        assert not wrong, wrong


# -- (h) follower fetching ------------------------------------------------------------------------


def test_a_consumer_in_zone_a_fetches_from_the_zone_a_replicas(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    _topic(kubectl, zoned.apps, "near")
    produced = run_client(kubectl, zoned.apps, "produce", "near", "600")
    assert produced == {"acknowledged": 600, "errors": [], "unsent": 0}, produced
    racks = _rack_of(zoned, kubectl)
    zone_a = {node for node, rack in racks.items() if rack == "zone-a"}
    said = run_client(kubectl, zoned.apps, "fetched-from", "near", "zone-a")
    assert said["count"] == 600, said
    fetched = {p: set(brokers) for p, brokers in said["fetchedFrom"].items()}
    assert len(fetched) == 6, said
    # Each partition has one zone-a replica: the consumer ends up fetching from it, even
    # where the leader is elsewhere (it starts at the leader, which points it there).
    assert all(brokers & zone_a for brokers in fetched.values()), (said, zone_a)
    elsewhere = [p for p, leader in said["leaders"].items() if leader not in zone_a]
    assert elsewhere, f"every leader is in zone-a: {said}"
    for partition in elsewhere:
        assert fetched[partition] - {said["leaders"][partition]} <= zone_a, said


# -- (b) a change without a restart ----------------------------------------------------------------


def test_a_config_running_brokers_take_is_set_on_each_and_restarts_nothing(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    with traffic(kubectl, zoned, "dynamic"):
        before = {name: view.uid for name, view in _pods(kubectl, zoned.apps).items()}
        _patch(kubectl, zoned, {"config": {"log.retention.ms": 3_600_000}})

        def everywhere() -> bool:
            return all(
                run_client(kubectl, zoned.apps, "broker-config", str(n), "log.retention.ms")[
                    "value"
                ]
                == "3600000"
                for n in range(BROKERS)
            )

        eventually("log.retention.ms on every broker", everywhere, timeout=120)
        eventually(
            "the cluster Ready",
            functools.partial(ready, kubectl, zoned.apps, "kafkacluster", CLUSTER),
        )
        time.sleep(10)
        after = {name: view.uid for name, view in _pods(kubectl, zoned.apps).items()}
        assert after == before, "a pod restarted for a change the brokers take running"
        events = kubectl(
            "get", "events", "--field-selector", "reason=ConfigUpdated", "-o", "json",
            namespace=zoned.apps,
        )  # fmt: skip
        messages = [e["message"] for e in json.loads(events)["items"]]
        assert any("log.retention.ms=3600000" in m for m in messages), messages


# -- (a) a roll ------------------------------------------------------------------------------------


def test_a_config_that_needs_a_restart_rolls_voters_one_by_one_and_brokers_a_zone_at_a_time(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    watch = _roll(kubectl, zoned, "roll", {"config": {"group.initial.rebalance.delay.ms": 1000}})
    assert watch.most_replaced_at_once == 2, watch.timeline


def test_with_max_parallel_one_the_same_roll_restarts_one_pod_at_a_time(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    spec = {"rollout": {"maxParallel": 1}, "config": {"group.initial.rebalance.delay.ms": 2000}}
    try:
        watch = _roll(kubectl, zoned, "serial", spec)
    finally:
        _patch(kubectl, zoned, {"rollout": SPEC["rollout"]})
    assert watch.most_replaced_at_once == 1, watch.timeline


def _roll(kubectl: Kubectl, zoned: Zoned, name: str, spec: dict[str, Any]) -> Watch:
    """Patch `spec` (a change that needs a restart) while the clients run, watch every pod
    restart once, check the gates held at every look, and record the roll's figures as
    `zoned_<name>_3_6_*`."""
    with traffic(kubectl, zoned, name):
        watch = Watch()
        watch.look(_pods(kubectl, zoned.apps))
        before = set(watch.uids)
        _patch(kubectl, zoned, spec)
        _watch(kubectl, zoned, lambda w: all(n >= 1 for n in w.restarted.values()), watch=watch)
    assert watch.restarted == dict.fromkeys(before, 1), watch.uids
    racks = _rack_of(zoned, kubectl)
    for moment, replacing, _ in watch.timeline:
        brokers = [int(n.rsplit("-", 1)[1]) for n in replacing if "-broker-" in n]
        controllers = [n for n in replacing if "-controller-" in n]
        assert len(controllers) <= 1, (moment, replacing)
        assert len({racks[b] for b in brokers}) <= 1, f"two zones at once at {moment}s: {replacing}"
        assert not (brokers and controllers), (moment, replacing)
    assert not _zones_down(watch, racks), _zones_down(watch, racks)
    restarts = [watch.replaced_until[n] - watch.replaced_from[n] for n in watch.replaced_until]
    record(f"zoned_{name}_3_6_total_s", max(watch.replaced_until.values()))
    record(f"zoned_{name}_3_6_restart_mean_s", sum(restarts) / len(restarts))
    record(f"zoned_{name}_3_6_most_pods_at_once", watch.most_replaced_at_once)
    return watch


# -- (c) the operator killed mid-roll -------------------------------------------------------------


def test_an_operator_killed_mid_roll_resumes_it_and_restarts_no_pod_twice(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    apps, system = zoned.apps, zoned.release.system
    with traffic(kubectl, zoned, "resume"):
        brokers = [f"{CLUSTER}-broker-{i}" for i in range(BROKERS)]
        watch = Watch()
        watch.look(_pods(kubectl, apps))
        for pod in brokers:
            kubectl("annotate", "pod", pod, "gregor.dev/restart=e2e", namespace=apps)

        def restarting() -> bool:
            watch.look(_pods(kubectl, apps))
            found = get(kubectl, apps, "kafkacluster", CLUSTER) or {}
            rollout = (found.get("status") or {}).get("rollout") or {}
            return any(p["state"] == "Restarting" for p in rollout.get("pods") or [])

        eventually("the roll to restart its first brokers", restarting, timeout=120)
        kubectl(
            "delete", "pod", "-l", "app.kubernetes.io/name=gregor-operator", "--grace-period=0",
            "--force", namespace=system,
        )  # fmt: skip
        _watch(
            kubectl, zoned, lambda w: all(w.restarted.get(p, 0) >= 1 for p in brokers), watch=watch
        )
    assert {p: watch.restarted[p] for p in brokers} == dict.fromkeys(brokers, 1), watch.uids
    controllers = [n for n in watch.uids if "-controller-" in n]
    assert all(watch.restarted[c] == 0 for c in controllers), watch.uids
    assert not _zones_down(watch, _rack_of(zoned, kubectl)), watch.timeline


# -- (e) a drain -----------------------------------------------------------------------------------


def test_a_drained_worker_gives_up_its_brokers_only_as_their_verdicts_allow(
    zoned: Zoned, kubectl: Kubectl
) -> None:
    (worker,) = zoned.zones["zone-b"]
    with traffic(kubectl, zoned, "drain"):
        started = time.monotonic()
        try:
            nodes.drain(kubectl, worker, timeout="300s")
            record("zoned_drain_s", time.monotonic() - started)
            on_worker = [n for n, v in _pods(kubectl, zoned.apps).items() if v.node == worker]
            assert on_worker == [], on_worker
        finally:
            nodes.uncordon(kubectl, worker)
        _watch(kubectl, zoned, lambda w: True)
    events = json.loads(
        kubectl("get", "events", "--field-selector", "reason=RollingRestart", "-o", "json",
                namespace=zoned.apps)
    )  # fmt: skip
    moved = [
        e["message"] for e in events["items"] if f"its node {worker} is cordoned" in e["message"]
    ]
    assert len(moved) == 2, moved


# -- (f) a node stopped ---------------------------------------------------------------------------


def test_a_zones_node_stopped_for_two_minutes_loses_nothing(zoned: Zoned, kubectl: Kubectl) -> None:
    (worker,) = zoned.zones["zone-b"]
    with traffic(kubectl, zoned, "stopped"):
        nodes.stop_node(kubectl, worker, wait=False)
        try:
            time.sleep(120)
        finally:
            nodes.start_node(kubectl, worker)
        _watch(kubectl, zoned, lambda w: True)


# -- (g) a zone cut off ---------------------------------------------------------------------------


def test_a_zone_cut_off_for_a_minute_loses_nothing(zoned: Zoned, kubectl: Kubectl) -> None:
    with traffic(kubectl, zoned, "cut"):
        cut = nodes.cut_off_zone(kubectl, "zone-a")
        try:
            time.sleep(60)
        finally:
            nodes.join_zone(cut)
        _watch(kubectl, zoned, lambda w: True)
