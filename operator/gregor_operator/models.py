"""The custom resources: `KafkaCluster`, `Topic` and `User` (group `gregor.dev`, `v1alpha1`).

What it owns: the shape of each resource's spec and status, their defaults, and every rule
that can be checked from the resource alone (ranges, enums, config keys, rules across fields).
The CustomResourceDefinitions in `crds/` are generated from these models (`crds`), so the API
server enforces the same rules at admission that the operator checks when it reads a resource;
a rule the schema cannot state is checked here and reported as a condition. What it must never
do: talk to Kubernetes or Kafka, or know how a resource is reconciled.

Field names are the resources' own (camelCase on the wire); docstrings become the schema's
descriptions, so they are written for the user who runs `kubectl explain`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .kafka_configs import BrokerConfig, TopicConfig, cel_field

__all__ = [
    "RESERVED_PORTS",
    "Condition",
    "KafkaCluster",
    "KafkaClusterSpec",
    "KafkaClusterStatus",
    "Listener",
    "NodePool",
    "RetentionAudit",
    "Storage",
    "Topic",
    "TopicSpec",
    "TopicStatus",
    "User",
    "UserSpec",
    "UserStatus",
    "VoterPool",
    "problems",
]


def problems(exc: ValidationError) -> str:
    """What is wrong with a resource, for a condition's message: each problem with the
    field it is in (`spec.brokers.replicas: Input should be greater than or equal to 1`)."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


# -- shared pieces ---------------------------------------------------------------------------

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes resource quantity (`10Gi`, `500m`, `1.5`), as the API server parses one."""

Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)]

PRESERVED_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
"""A Kubernetes type passed through to the pods as written (affinity, security context): the
API server checks it where the operator puts it, in the StatefulSet."""

PRESERVED_LIST = {"type": "array", "items": PRESERVED_OBJECT}


class Condition(Model):
    """A condition as Kubernetes API conventions describe it: keyed by `type`."""

    type: str
    """`Ready`, `Reconciling`, or a specific condition such as `InvalidSpec`."""
    status: Literal["True", "False", "Unknown"]
    reason: str
    """CamelCase: why the condition is what it is, for machines."""
    message: str
    """Why, for people (may be empty)."""
    last_transition_time: str
    """When `status` last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The generation of the spec this condition was computed from."""


Conditions = Annotated[
    list[Condition],
    Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    ),
]


class Status(Model):
    """What every resource's status opens with, as Kubernetes API conventions have it."""

    observed_generation: int | None = None
    conditions: Conditions | None = None


class CustomResource(Model):
    """A resource's envelope; each kind adds its `kind`, `spec` and `status`."""

    api_version: Literal["gregor.dev/v1alpha1"] = "gregor.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)


# -- KafkaCluster ----------------------------------------------------------------------------

RESERVED_PORTS = frozenset({9091, 9093, 9404})
"""The replication listener (9091), the controller listener (9093, as in the broker image)
and the metrics and probes endpoint (9404), on every pod."""


class Storage(Model):
    """Where a node keeps its log dir."""

    type: Literal["persistent-claim", "ephemeral"] = "persistent-claim"
    """`persistent-claim`: a PersistentVolumeClaim per pod, kept across restarts and
    formatted for a new node only. `ephemeral`: an emptyDir, lost with the pod and formatted
    anew at every start; brokers only (each start is a new directory, its replicas fetched
    again)."""
    size: Annotated[Quantity, StringConstraints(pattern=r"^[0-9]")] = "10Gi"
    """The claim's size, a Kubernetes quantity."""
    storage_class: str | None = None
    """The claim's StorageClass; the cluster's default if unset."""


class Resources(Model):
    """CPU and memory for the node's container, as in a Pod's `resources`."""

    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class NodePool(Model):
    """A StatefulSet of nodes with one set of roles."""

    replicas: Annotated[int, Field(ge=1, le=100)]
    """How many nodes. Each gets a stable node id from its pod's ordinal."""
    storage: Storage = Storage()
    resources: Resources | None = None


EPHEMERAL_VOTERS = (
    "ephemeral storage is for brokers only: a voter's metadata log is lost with its pod, and "
    "the quorum cannot tell a replaced voter from the one it replaced (use persistent-claim)"
)


class VoterPool(NodePool):
    """A StatefulSet of nodes that are voters of the metadata quorum (controllers, or
    combined nodes): their storage must outlive their pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.storage) || !has(self.storage.type) "
                    "|| self.storage.type != 'ephemeral'",
                    "message": EPHEMERAL_VOTERS,
                }
            ]
        }
    )

    @model_validator(mode="after")
    def _persistent(self) -> VoterPool:
        if self.storage.type == "ephemeral":
            raise ValueError(EPHEMERAL_VOTERS)
        return self


RESERVED_LISTENER_NAMES = ("bootstrap", "broker", "combined", "controller", "node", "nodes")
"""Words in the names of the objects of a cluster: a listener named so could give one of its
Services the name of another cluster's object."""
_RESERVED = "listener names " + ", ".join(RESERVED_LISTENER_NAMES) + " are reserved"


class Listener(Model):
    """A listener clients connect to."""

    name: Annotated[
        str,
        StringConstraints(pattern=r"^[a-z][a-z0-9]{0,13}$"),
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        "rule": f"!(self in {list(RESERVED_LISTENER_NAMES)})",
                        "message": _RESERVED,
                    }
                ]
            }
        ),
    ]
    """Lower case letters and digits; Kafka's listener name is its upper-case form. Not one
    of `bootstrap`, `broker`, `combined`, `controller`, `node`, `nodes`: the operator names
    Services after it."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_LISTENER_NAMES:
            raise ValueError(_RESERVED)
        return name

    port: Annotated[int, Field(ge=1024, le=65535)]
    """The container port; 9091, 9093 and 9404 are the operator's own."""
    type: Literal["internal", "nodeport", "loadbalancer"] = "internal"
    """`internal`: inside the Kubernetes cluster, through the bootstrap Service and each pod's
    DNS name. `nodeport`: from outside, through a NodePort Service per broker (and one to
    bootstrap from); each broker advertises the address of the node it runs on. `loadbalancer`:
    from outside, through a LoadBalancer Service per broker (and one to bootstrap from); each
    broker advertises its Service's address once the load balancer has one. A cluster needs
    at least one internal listener."""
    tls: bool = False
    """Reserved: TLS listeners come with the security work; `true` is refused for now."""
    authentication: Literal["scram-sha-512", "tls"] | None = None
    """Reserved: client authentication comes with the security work; refused for now."""


def _listeners_schema() -> dict[str, Any]:
    return {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "maxItems": 8,
        "x-kubernetes-validations": [
            {
                "rule": "self.all(l, self.exists_one(m, m.port == l.port))",
                "message": "listener ports must differ",
            },
            {
                "rule": f"self.all(l, !(l.port in {sorted(RESERVED_PORTS)}))",
                "message": "ports 9091, 9093 and 9404 are the operator's own",
            },
            {
                "rule": "self.all(l, !l.tls && !has(l.authentication))",
                "message": "TLS and authentication on listeners are not supported yet",
            },
            {
                "rule": "self.exists(l, !has(l.type) || l.type == 'internal')",
                "message": "a cluster needs an internal listener (the operator uses it)",
            },
        ],
    }


class PodTemplate(Model):
    """What every pod of the cluster gets on top of what the operator sets."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    affinity: Annotated[dict[str, Any] | None, WithJsonSchema(PRESERVED_OBJECT)] = None
    """A Pod's `affinity`, as written."""
    tolerations: Annotated[list[dict[str, Any]] | None, WithJsonSchema(PRESERVED_LIST)] = None
    topology_spread_constraints: Annotated[
        list[dict[str, Any]] | None, WithJsonSchema(PRESERVED_LIST)
    ] = None
    priority_class_name: str | None = None
    security_context: Annotated[dict[str, Any] | None, WithJsonSchema(PRESERVED_OBJECT)] = None
    """A Pod's `securityContext`; the operator's default runs as user 10001, not root."""


class Rack(Model):
    """Rack awareness: each broker's `broker.rack` is the value of a label of the Kubernetes
    node its pod landed on (the operator reads the node and tells the pod; the pod needs no
    access to nodes), and every pool's pods spread over that label's values (a topology
    spread constraint, added to the template's own unless it already spreads over the key).
    The controller then puts each partition's replicas in distinct racks."""

    topology_key: str = "topology.kubernetes.io/zone"
    """The node label whose value is the rack."""


class Rollout(Model):
    """How the operator rolls the cluster's pods when they must restart."""

    paused: bool = False
    """Restart no pod until it is false again, stuck ones and volume formatting included
    (what is due stays listed in `status.rollout`); objects are still applied. A pod that
    Kubernetes itself recreates meanwhile (an eviction, a drain) comes back at the new
    revision, as the StatefulSet has it."""

    max_parallel: Annotated[int, Field(ge=1, le=100)] = 1
    """How many brokers of one rack (of the whole cluster, without `spec.rack`) may restart
    together, when their restart verdicts clear them as a set: with rack-aware placement, RF
    3 and min ISR 2, a zone at a time. Controllers and combined nodes, the quorum's voters,
    always restart one at a time."""


class Metrics(Model):
    enabled: bool = True
    """Serve Prometheus metrics on port 9404 of every pod."""


DURATION_PATTERN = r"^[1-9][0-9]*(ms|s|m|h|d|w)$"
"""A duration as `gregor audit retention` takes one: `90m`, `1d`, `30d`."""
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN)]
CRON_PATTERN = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4}\S+)$"
"""A CronJob's `schedule`: five fields, or one of its `@` macros."""
LabelValue = Annotated[
    str, StringConstraints(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)
]


class SparkPods(Model):
    """CPU and memory of the audit's Spark pods."""

    cores: Annotated[int, Field(ge=1, le=64)] = 1
    memory: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*[kmgt]$")] = "1g"
    """The JVM's heap, as Spark writes it (`512m`, `1g`); the pod asks for this plus Spark's
    overhead."""
    request_cores: Quantity | None = None
    """The CPU the pod asks the scheduler for (`500m`); `cores` if unset."""


class SparkExecutors(SparkPods):
    instances: Annotated[int, Field(ge=1, le=100)] = 1


class AuditReports(Model):
    """Where each run's report (`summary.json` and the Parquet detail) goes: a volume claim
    the operator makes, or a Hadoop-compatible URI."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.uri) || (!has(self.size) && !has(self.storageClass))",
                    "message": "give either a claim's size and storageClass, or a uri",
                }
            ]
        }
    )

    size: Annotated[Quantity, StringConstraints(pattern=r"^[0-9]")] | None = None
    """The reports claim's size (`1Gi` if unset)."""
    storage_class: str | None = None
    """The reports claim's StorageClass; the cluster's default if unset."""
    uri: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9+.-]*://\S+$")] | None = None
    """A Hadoop-compatible URI (`s3a://bucket/audits`): each run writes under it, and no claim
    is made."""

    @model_validator(mode="after")
    def _one_place(self) -> AuditReports:
        if self.uri is not None and (self.size is not None or self.storage_class is not None):
            raise ValueError("give either a claim's size and storageClass, or a uri")
        return self


class RetentionAudit(Model):
    """Retention audits: a Spark application, run on Kubernetes on a schedule and on request,
    that reads the audited topics and checks what their retention and compaction really
    deliver; verdicts go to each `Topic`'s status."""

    schedule: Annotated[str, StringConstraints(pattern=CRON_PATTERN)] = "@daily"
    """A CronJob's schedule (`0 3 * * *`, `@daily`), in the controller manager's time zone."""
    suspend: bool = False
    """No scheduled runs; a requested one still runs."""
    topics: list[Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9._-]{1,249}$")]] | None = (
        None
    )
    """Kafka topic names to audit. With neither this nor `topicSelector`: every `Topic` of the
    cluster."""
    topic_selector: dict[str, LabelValue] | None = None
    """Audit the `Topic`s of the cluster that carry all of these labels (added to `topics`)."""
    max_age: Duration | None = None
    """No record may be older (`30d`); if unset, each topic is held to what its own
    configuration promises (`retention.ms` with a segment's roll and a retention check, or
    `max.compaction.lag.ms`)."""
    future_skew: Duration = "1h"
    """How far ahead of the audit's clock a record's timestamp may be."""
    driver: SparkPods = SparkPods()
    executors: SparkExecutors = SparkExecutors()
    reports: AuditReports = AuditReports()
    deadline_seconds: Annotated[int, Field(ge=60, le=86_400)] = 3600
    """How long a run may take, its driver included, before it is stopped (by Kubernetes for a
    Job, by the operator for a SparkApplication)."""
    history_limit: Annotated[int, Field(ge=1, le=20)] = 3
    """How many finished runs (and their results) are kept, of each outcome."""
    image: str | None = None
    """The `gregor-spark` image; the one released with the operator if unset."""
    launcher: Literal["Auto", "Job", "SparkApplication"] = "Auto"
    """How runs are launched: `Job` (a CronJob whose Jobs run spark-submit), `SparkApplication`
    (a ScheduledSparkApplication of the Kubeflow Spark Operator, with its webhook, watching this
    namespace), or `Auto`: SparkApplication where its CRD is installed, else Job."""


def _default_listeners() -> list[Listener]:
    return [Listener(name="plain", port=9092)]


class KafkaClusterSpec(Model):
    """A Gregor cluster: its KRaft controllers and its brokers, or combined nodes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.combined) != (has(self.controllers) || has(self.brokers))",
                    "message": "give either combined, or controllers and brokers",
                },
                {
                    "rule": "has(self.controllers) == has(self.brokers)",
                    "message": "controllers and brokers go together",
                },
            ]
        }
    )

    image: str | None = None
    """The broker image; the one released with the operator if unset."""
    version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] | None = None
    """The Gregor version the image runs, for status and upgrades (informational for now)."""
    combined: VoterPool | None = None
    """Nodes that are both controller and broker (`process.roles=broker,controller`): small
    clusters. An odd number (1 or 3) keeps the quorum's majority meaningful. Voters: their
    storage cannot be `ephemeral`."""
    controllers: VoterPool | None = None
    """Dedicated KRaft controllers (`process.roles=controller`), with `brokers`. Voters: their
    storage cannot be `ephemeral`."""
    brokers: NodePool | None = None
    """Broker-only nodes (`process.roles=broker`), with `controllers`."""
    listeners: list[Listener] = Field(
        default_factory=_default_listeners,
        json_schema_extra=_listeners_schema(),
        min_length=1,
    )
    """Where clients connect; `plain` on 9092 if unset."""
    config: BrokerConfig | None = None
    template: PodTemplate | None = None
    rack: Rack | None = None
    metrics: Metrics = Metrics()
    rollout: Rollout = Rollout()
    retention_audit: RetentionAudit | None = None
    """Audit the cluster's topics' retention with Spark on Kubernetes (off if unset). The
    annotation `gregor.dev/audit-retention` (any new value) on the cluster, or on a `Topic`
    for that topic alone, requests a run now."""
    delete_claims: bool = False
    """Delete the nodes' PersistentVolumeClaims with the cluster; kept by default."""

    @model_validator(mode="after")
    def _roles(self) -> KafkaClusterSpec:
        if (self.combined is None) == (self.controllers is None and self.brokers is None):
            raise ValueError("give either combined, or controllers and brokers")
        if (self.controllers is None) != (self.brokers is None):
            raise ValueError("controllers and brokers go together")
        ports = [listener.port for listener in self.listeners]
        if len(set(ports)) != len(ports):
            raise ValueError("listener ports must differ")
        if set(ports) & RESERVED_PORTS:
            raise ValueError("ports 9091, 9093 and 9404 are the operator's own")
        names = [listener.name for listener in self.listeners]
        if len(set(names)) != len(names):
            raise ValueError("listener names must differ")
        if any(listener.tls or listener.authentication for listener in self.listeners):
            raise ValueError("TLS and authentication on listeners are not supported yet")
        if not any(listener.type == "internal" for listener in self.listeners):
            raise ValueError("a cluster needs an internal listener (the operator uses it)")
        return self


class ListenerStatus(Model):
    name: str
    type: Literal["internal", "nodeport", "loadbalancer"] | None = None
    bootstrap_servers: str
    """`host:port,…` a client bootstraps from: inside the Kubernetes cluster for an internal
    listener, from outside for the others (empty until the addresses are known)."""


class NodeStatus(Model):
    node_id: int
    roles: list[Literal["broker", "controller"]]
    pod: str
    ready: bool
    broker_state: str | None = None
    """As the controller sees the broker: `Unfenced`, `Fenced`, `ControlledShutdown`."""
    pod_uid: str | None = None
    addresses: dict[str, str] | None = None
    """The address the broker advertises on each external listener, as its pod (`podUid`)
    started with it."""
    formatted: bool | None = None
    """The node has run on its formatted volume: if that volume is lost, the operator formats
    no new one (the node does not start) unless told to by the `gregor.dev/format-volumes`
    annotation, for brokers only."""
    rack: str | None = None
    """With `spec.rack`: the broker's `broker.rack`, its node's label as its pod was told."""


class AuditRunStatus(Model):
    """The cluster's retention audits as the operator last saw them."""

    schedule: str | None = None
    active: str | None = None
    """The run (a Job or a SparkApplication) now running, if any."""
    last_run: str | None = None
    """The latest run whose result the operator read."""
    last_run_time: str | None = None
    last_success_time: str | None = None
    """When the latest run that judged every topic it was asked to finished (RFC 3339)."""
    handled_request: str | None = None
    """The value of the cluster's `gregor.dev/audit-retention` annotation last acted on."""
    pending: list[str] | None = None
    """Requests waiting for the active run to end."""
    error: str | None = None
    """Why the latest run judged nothing, or why none can run."""
    launcher: str | None = None
    """`Job` or `SparkApplication`: how runs are launched now."""
    note: str | None = None
    """Why `launcher: Auto` launches Jobs though SparkApplications are served."""


class RolloutPodStatus(Model):
    pod: str
    reason: str
    """Why it is to restart: its configuration or image changed, its external address moved,
    it is stuck on an old revision, the `gregor.dev/restart` annotation, a new volume."""
    state: Literal["Pending", "Restarting"]
    """Restarting: deleted by the operator, not back and ready yet."""
    attempts: int = 0
    """How many times the operator has deleted it in this roll."""
    uid: str | None = None
    """The uid of the pod the operator was deleting (Restarting): if the same pod is still
    there after an operator restart, the deletion never happened."""


class RolloutStatus(Model):
    paused: bool = False
    pods: list[RolloutPodStatus] = []
    """The pods to restart, in the order the roll takes them."""
    held: str | None = None
    """What holds the next restart, when something does."""
    held_since: str | None = None
    """Since when that has held it (RFC 3339)."""


class DryRunRestart(Model):
    pod: str
    reason: str


class DryRunConfig(Model):
    config: str
    value: str | None = None
    """The new value (absent: the config goes back to its default)."""


class DryRunStatus(Model):
    """What the spec would do were it applied (`gregor.dev/dry-run` on the resource)."""

    generation: int | None = None
    """The spec's generation this describes."""
    summary: str
    restarts: list[DryRunRestart] = []
    """The pods it would restart, in no particular order, and why."""
    without_restart: list[DryRunConfig] = []
    """Configs it would set on the running brokers, restarting none."""
    adds: list[str] = []
    """Pods it would add."""
    refused: list[str] = []
    """Changes it asks for that would be refused (`ChangeRefused`), the current value kept."""


class KafkaClusterStatus(Status):
    cluster_id: str | None = None
    rollout: RolloutStatus | None = None
    """The rolling restart under way, written before each restart (absent when none is)."""
    dry_run: DryRunStatus | None = None
    """Present while the resource carries `gregor.dev/dry-run`: the spec is not applied."""
    retention_audit: AuditRunStatus | None = None
    listeners: list[ListenerStatus] | None = None
    nodes: list[NodeStatus] | None = None
    ready_nodes: str | None = None
    """`ready/desired`, for `kubectl get kc`."""


class KafkaCluster(CustomResource):
    """A Gregor cluster: KRaft controllers and brokers (or combined nodes), their listeners,
    storage and configuration."""

    kind: Literal["KafkaCluster"] = "KafkaCluster"
    spec: KafkaClusterSpec
    status: KafkaClusterStatus | None = None


# -- Topic -----------------------------------------------------------------------------------

TOPIC_NAME_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
"""Kafka's legal topic names."""


def _immutable(field: str) -> dict[str, Any]:
    return {
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": f"{field} cannot be changed"}
        ]
    }


_MIN_INSYNC = cel_field("min.insync.replicas")


class TopicSpec(Model):
    """A Kafka topic, created and kept as written here."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "!has(self.replicas) || !has(self.config) || "
                        f"!has(self.config.{_MIN_INSYNC}) || "
                        f"self.config.{_MIN_INSYNC} < self.replicas"
                    ),
                    "message": "min.insync.replicas must be below replicas",
                },
                {
                    "rule": "has(self.topicName) == has(oldSelf.topicName)",
                    "message": "topicName cannot be added or removed",
                },
            ]
        }
    )

    cluster: Annotated[str, Field(json_schema_extra=_immutable("cluster"))]
    """The `KafkaCluster` (in this namespace) the topic lives in."""
    topic_name: (
        Annotated[
            str,
            StringConstraints(pattern=TOPIC_NAME_PATTERN),
            Field(json_schema_extra=_immutable("topicName")),
        ]
        | None
    ) = None
    """The topic's name in Kafka; the resource's name if unset (Kubernetes names cannot hold
    `_` or upper case, Kafka's can)."""
    partitions: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """The broker's `num.partitions` if unset. May grow; a decrease is refused."""
    replicas: Annotated[int, Field(ge=1, le=32_767)] | None = None
    """The replication factor; the broker's `default.replication.factor` if unset."""
    config: TopicConfig | None = None
    deletion_policy: Literal["delete", "retain"] = "delete"
    """`delete`: deleting the resource deletes the topic; `retain`: the topic stays."""

    @model_validator(mode="after")
    def _min_insync(self) -> TopicSpec:
        value = None if self.config is None else self.config.properties().get("min.insync.replicas")
        if self.replicas is not None and value is not None and int(value) >= self.replicas:
            raise ValueError("min.insync.replicas must be below replicas")
        return self


class TopicStatus(Status):
    topic_name: str | None = None
    topic_id: str | None = None
    partitions: int | None = None
    replicas: int | None = None
    config: dict[str, str] | None = None
    """The topic's configs that differ from the broker's defaults, as Kafka reports them."""
    retention_audit: TopicAuditStatus | None = None


class FindingCount(Model):
    code: str
    count: int


class TopicAuditStatus(Model):
    """The topic's latest retention audit."""

    run: str | None = None
    """The run (a Job or a SparkApplication of the cluster's audit) that judged it."""
    time: str | None = None
    """When that run read the topic (RFC 3339)."""
    verdict: Literal["Compliant", "Violations", "Error"] | None = None
    reason: str | None = None
    """Why the topic could not be audited (verdict `Error`)."""
    oldest_record_age_seconds: int | None = None
    max_age_seconds: int | None = None
    """The bound it was held to."""
    findings: list[FindingCount] | None = None
    """The finding codes (`RecordsOlderThanMaxAge`, `FutureTimestamps`, …), each with how
    many findings it has (one per partition, or one for the topic's configuration)."""
    records_past_bound: int | None = None
    bytes_past_bound: int | None = None
    report: str | None = None
    """Where the run's full report is (`summary.json` and the Parquet detail)."""
    handled_request: str | None = None
    """The value of the topic's `gregor.dev/audit-retention` annotation last acted on."""


class Topic(CustomResource):
    """A Kafka topic in a Gregor cluster, with its partitions, replicas and configs."""

    kind: Literal["Topic"] = "Topic"
    spec: TopicSpec
    status: TopicStatus | None = None


# -- User ------------------------------------------------------------------------------------


class Authentication(Model):
    type: Literal["scram-sha-512", "tls"]
    """`scram-sha-512`: a generated password in a Secret; `tls`: a client certificate."""


class AclResource(Model):
    type: Literal["topic", "group", "cluster", "transactionalId"]
    name: str = "*"
    pattern_type: Literal["literal", "prefix"] = "literal"


class Acl(Model):
    type: Literal["allow", "deny"] = "allow"
    resource: AclResource
    operations: Annotated[
        list[
            Literal[
                "All",
                "Read",
                "Write",
                "Create",
                "Delete",
                "Alter",
                "Describe",
                "ClusterAction",
                "DescribeConfigs",
                "AlterConfigs",
                "IdempotentWrite",
            ]
        ],
        Field(min_length=1),
    ]
    host: str = "*"


class Authorization(Model):
    type: Literal["simple"] = "simple"
    acls: list[Acl] = Field(default_factory=list)


class Quotas(Model):
    producer_byte_rate: Annotated[int, Field(ge=0)] | None = None
    consumer_byte_rate: Annotated[int, Field(ge=0)] | None = None
    request_percentage: Annotated[int, Field(ge=0, le=100)] | None = None


class UserSpec(Model):
    """A Kafka user: its credentials, ACLs and quotas. Reconciled with the security work; the
    operator accepts and validates it today."""

    cluster: str
    """The `KafkaCluster` (in this namespace) the user belongs to."""
    authentication: Authentication | None = None
    authorization: Authorization | None = None
    quotas: Quotas | None = None


class UserStatus(Status):
    username: str | None = None
    secret: str | None = None
    """The Secret that holds the user's credentials."""


class User(CustomResource):
    """A Kafka user of a Gregor cluster: its credentials, ACLs and quotas."""

    kind: Literal["User"] = "User"
    spec: UserSpec
    status: UserStatus | None = None
