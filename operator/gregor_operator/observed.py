"""What the operator sees of a `KafkaCluster` before it decides anything: its pods,
StatefulSets and Services as Kubernetes shows them, and what its brokers say of themselves.

What it owns: the shapes of those observations, which `kube` and `kafka` fill in and the
planner, the roller, `listeners` and `volumes` read. It depends on none of them, so none of
them depends on another for its inputs. What it must never do: decide, or ask anyone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .objects import Claims, Role

__all__ = [
    "STUCK_REASONS",
    "BrokerFacts",
    "LiveConfig",
    "Observed",
    "PodState",
    "ServiceState",
    "StatefulSetState",
    "Verdict",
]

STUCK_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "Unschedulable",
    }
)
"""Why a pod may never become ready on its own (Strimzi's KafkaRoller calls these stuck)."""


@dataclass(frozen=True, slots=True)
class PodState:
    name: str
    pool: Role
    ordinal: int
    ready: bool
    revision: str | None
    """The pod's `controller-revision-hash` label."""
    deleting: bool = False
    stuck: str | None = None
    """A reason from STUCK_REASONS, when the pod has one."""
    ready_for_s: float = float("inf")
    """How long the pod has been ready (its Ready condition's age; 0 when not ready)."""
    running_for_s: float = float("inf")
    """How long its container has been running (0 when it is not)."""
    last_error: str | None = None
    """What its node said when it last refused to start (`gregor: …`, without the prefix)."""
    uid: str | None = None
    ip: str | None = None
    host_ip: str | None = None
    """The address of the node it runs on."""
    node: str | None = None
    """The name of the Kubernetes node it was scheduled to."""
    rack: str | None = None
    """Its `gregor.dev/rack` annotation: the rack the operator told it (spec.rack)."""
    restart_requested: bool = False
    """It carries the `gregor.dev/restart` annotation: a user asked for it to restart (the
    pod that replaces it does not carry it)."""


@dataclass(frozen=True, slots=True)
class StatefulSetState:
    replicas: int
    update_revision: str | None
    claims: Claims
    """The volume claim it was created with."""
    template_hash: str | None = None
    """The hash of the pod template the operator wrote (its `gregor.dev/template-hash`)."""
    image: str | None = None
    """Its pods' image."""


@dataclass(frozen=True, slots=True)
class ServiceState:
    listener: str | None = None
    """The external listener it serves (its `gregor.dev/listener` label), if any."""
    node_port: int | None = None
    """The node port Kubernetes allocated, if it is a NodePort or LoadBalancer Service."""
    owner: str | None = None
    """The uid of the object that controls it (its KafkaCluster's, if the operator made it)."""
    ingress: tuple[str, ...] = ()
    """Its load balancer's addresses (IP or host name), once the cloud has made one."""


@dataclass(frozen=True, slots=True)
class Observed:
    statefulsets: Mapping[Role, StatefulSetState] = field(default_factory=dict)
    pods: Sequence[PodState] = ()
    services: Mapping[str, ServiceState] = field(default_factory=dict)
    """The cluster's Services, by name."""
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """The labels of the Kubernetes nodes the cluster's pods were scheduled to, by name
    (read only with spec.rack)."""
    nodes_refused: str | None = None
    """What the API server said when it would not show the operator a node."""
    properties: Mapping[Role, Mapping[str, str]] = field(default_factory=dict)
    """Each pool's `server.properties`, as its ConfigMap holds it."""
    cordoned: frozenset[str] = frozenset()
    """Those of the nodes that are cordoned (`spec.unschedulable`: `kubectl cordon`, the
    first step of `kubectl drain`)."""


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """A broker config a running node applies when it is set for it alone
    (`LIVE_PER_BROKER_CONFIGS`), as that broker's DescribeConfigs says it."""

    value: str | None
    """What it runs with now."""
    dynamic: str | None = None
    """The value set for this broker alone (IncrementalAlterConfigs), if any."""
    static: str | None = None
    """The value in the `server.properties` it started with, if any."""


@dataclass(frozen=True, slots=True)
class BrokerFacts:
    """What the cluster's own Admin API says (None: the operator could not ask it)."""

    brokers: Mapping[int, str] = field(default_factory=dict)
    """Registered brokers by node id, and their state as the controller sees it."""
    under_replicated: int = 0
    """Partitions whose ISR is smaller than their replica set."""
    active_controller: str | None = None
    """The pod of the quorum's leader, when the operator asked the voters."""
    verdicts: Mapping[tuple[int, ...], Verdict] = field(default_factory=dict)
    """What the nodes said of stopping each set of node ids the roller asked about."""
    configs: Mapping[int, Mapping[str, LiveConfig]] = field(default_factory=dict)
    """Each broker's live configs, by node id (empty when they could not be read)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a node's `/v1/restart-verdict` said of stopping `nodes` together."""

    nodes: tuple[int, ...]
    safe: bool
    blocking: tuple[str, ...] = ()
    """Each partition that blocks it, as `topic-partition (rule: reason)`."""
    quorum_risk: str | None = None
    """Why the quorum would lose its caught-up majority, when it would."""
    judged_quorum: bool = True
    """False when the node asked does not lead the quorum, so could not judge a voter."""

    @property
    def why(self) -> str:
        """What blocks it, in a sentence (empty when it is safe)."""
        said = list(self.blocking[:3])
        if len(self.blocking) > 3:
            said.append(f"and {len(self.blocking) - 3} more partition(s)")
        if self.quorum_risk:
            said.append(f"the metadata quorum: {self.quorum_risk}")
        elif not self.judged_quorum:
            said.append("the quorum's leader could not be asked")
        return "; ".join(said)
