"""The kopf handlers: thin shells that gather what the planner needs, carry out its plan and
write the status it computed.

What it owns: when a resource is reconciled (at once when its spec changes, then on a timer
that repairs drift and moves a rolling restart along), one reconciliation at a time per
resource, the operator's own metrics, and Kubernetes Events for what it did. What it must
never do: decide anything the planner decides.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client, config
from prometheus_client import Counter, Gauge, Histogram
from pydantic import ValidationError

from broker.node import new_cluster_id

from . import GROUP, VERSION
from .audits import AUDIT_ANNOTATION, AUDIT_CONDITION, DEFAULT_SPARK_IMAGE, TopicRef, plan_audits
from .kafka import (
    active_controller,
    admin,
    alter_broker_configs,
    broker_facts,
    carry_out,
    delete_topic,
    describe_topic,
    restart_verdict,
)
from .kube import Kube
from .models import KafkaCluster
from .objects import (
    DEFAULT_IMAGE,
    DRY_RUN_ANNOTATION,
    METRICS_PORT,
    VOTER_ROLES,
    Target,
    bootstrap_address,
    bracketed,
)
from .planner import (
    DNS_TTL_S,
    Ask,
    BrokerFacts,
    ConditionState,
    Observed,
    Plan,
    Verdict,
    a_voter_is_due,
    merge_conditions,
    plan,
)
from .roller import ASK_ROUNDS, drained, whom_to_ask
from .topics import TopicPlan, cluster_serves_topics, plan_topic, topic_name

__all__ = ["Settings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settings:
    """The operator's settings, from its environment (the chart sets them)."""

    image: str = field(default_factory=lambda: os.environ.get("GREGOR_BROKER_IMAGE", DEFAULT_IMAGE))
    """The broker image of clusters that name none: the one released with the operator."""
    cluster_domain: str = field(
        default_factory=lambda: os.environ.get("GREGOR_CLUSTER_DOMAIN", "cluster.local")
    )
    interval_s: float = field(
        default_factory=lambda: float(os.environ.get("GREGOR_RECONCILE_INTERVAL_S", "10"))
    )
    """How often every resource is reconciled again: drift is put back and a rolling restart
    moves on within this."""
    dns_ttl_s: float = field(
        default_factory=lambda: float(os.environ.get("GREGOR_DNS_TTL_S", str(DNS_TTL_S)))
    )
    """How long the cluster DNS may give out a restarted pod's old address (CoreDNS's `ttl`):
    a rolling restart waits that long between two voters."""
    spark_image: str = field(
        default_factory=lambda: os.environ.get("GREGOR_SPARK_IMAGE", DEFAULT_SPARK_IMAGE)
    )
    """The `gregor-spark` image of retention audits that name none."""


SETTINGS = Settings()

# -- the operator's own metrics ---------------------------------------------------------------

RECONCILIATIONS = Counter(
    "gregor_operator_reconciliations",
    "Reconciliations, by resource kind and result (ok, error).",
    ["resource", "result"],
)
DURATION = Histogram(
    "gregor_operator_reconciliation_duration_seconds",
    "How long reconciliations take, by resource kind.",
    ["resource"],
)
IN_FLIGHT = Gauge(
    "gregor_operator_reconciliations_in_flight",
    "Reconciliations running now, by resource kind.",
    ["resource"],
)
_STARTED: dict[tuple[str, str, str], float] = {}
_STARTED_LOCK = threading.Lock()


def _oldest(resource: str) -> float:
    now = time.monotonic()
    with _STARTED_LOCK:
        ages = [now - t for (kind, _, _), t in _STARTED.items() if kind == resource]
    return max(ages, default=0.0)


OLDEST = Gauge(
    "gregor_operator_oldest_reconciliation_seconds",
    "How long the oldest reconciliation still running has been running, by resource kind: a "
    "stuck one shows here before anyone wonders why nothing happens.",
    ["resource"],
)
for _kind in ("kafkacluster", "topic"):
    OLDEST.labels(_kind).set_function(functools.partial(_oldest, _kind))

# The retention audit's verdicts, as of each topic's latest audit: alerts need nothing new.
_TOPIC = ["namespace", "cluster", "topic"]
AUDIT_OLDEST = Gauge(
    "gregor_retention_audit_oldest_record_age_seconds",
    "The age of the oldest readable record of a topic when it was last audited.",
    _TOPIC,
)
AUDIT_RECORDS = Gauge(
    "gregor_retention_audit_records_past_bound",
    "Records of a topic still readable past their bound (its maximum age, compaction lag or "
    "delete retention) when it was last audited.",
    _TOPIC,
)
AUDIT_BYTES = Gauge(
    "gregor_retention_audit_bytes_past_bound",
    "Bytes (keys and values) of the records past their bound when the topic was last audited.",
    _TOPIC,
)
AUDIT_COMPLIANT = Gauge(
    "gregor_retention_audit_compliant",
    "1 when a topic's latest audit found nothing, 0 when it found violations or could not "
    "judge it.",
    _TOPIC,
)
AUDIT_FINDINGS = Gauge(
    "gregor_retention_audit_findings",
    "Findings of a topic's latest audit, by code (one per partition, or per topic for its "
    "configuration).",
    [*_TOPIC, "code"],
)
AUDIT_LAST_SUCCESS = Gauge(
    "gregor_retention_audit_last_success_timestamp_seconds",
    "When the latest audit of a cluster that judged its topics ran (Unix time).",
    ["namespace", "cluster"],
)
_AUDIT_SERIES: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

_LOCKS: dict[tuple[str, str, str], threading.Lock] = {}


@contextmanager
def _reconciling(kind: str, namespace: str, name: str) -> Iterator[bool]:
    """One reconciliation of a resource at a time (the timer and a spec change may meet);
    yields False, doing nothing, when one is already running."""
    key = (kind, namespace, name)
    with _STARTED_LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    if not lock.acquire(blocking=False):
        yield False
        return
    started = time.monotonic()
    with _STARTED_LOCK:
        _STARTED[key] = started
    IN_FLIGHT.labels(kind).inc()
    result = "error"
    try:
        yield True
        result = "ok"
    finally:
        IN_FLIGHT.labels(kind).dec()
        with _STARTED_LOCK:
            _STARTED.pop(key, None)
        DURATION.labels(kind).observe(time.monotonic() - started)
        RECONCILIATIONS.labels(kind, result).inc()
        lock.release()


# -- wiring -----------------------------------------------------------------------------------

_KUBE: Kube | None = None


def kube() -> Kube:
    global _KUBE  # noqa: PLW0603 -- one API client per process, made on first use
    if _KUBE is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        _KUBE = Kube(client.ApiClient())
    return _KUBE


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # The operator posts its own Events, for what it did; not one per log line.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- KafkaCluster -----------------------------------------------------------------------------


def _bootstrap(body: Mapping[str, Any], namespace: str) -> str:
    """Where the cluster's first internal listener answers, read from the resource as it is
    (its spec is checked only later, by the planner)."""
    listeners = body.get("spec", {}).get("listeners") or [{"port": 9092}]
    port = int((_internal(listeners) or listeners)[0].get("port", 9092))
    return bootstrap_address(body["metadata"]["name"], namespace, SETTINGS.cluster_domain, port)


def _internal(listeners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The internal listeners of a spec or a status, as the resource has them."""
    return [item for item in listeners if item.get("type", "internal") == "internal"]


def _with_active_controller(facts: BrokerFacts | None, observed: Observed) -> BrokerFacts | None:
    """The facts, with the quorum's leader when a voter is to be restarted (the roll leaves
    it last); the voters are asked only then."""
    if facts is None or not a_voter_is_due(observed):
        return facts
    addresses = {
        pod.name: f"{bracketed(pod.ip)}:{METRICS_PORT}"
        for pod in observed.pods
        if pod.pool in VOTER_ROLES and pod.ip
    }
    return dataclasses.replace(facts, active_controller=active_controller(addresses))


def _verdicts(
    asks: list[Ask], observed: Observed, facts: BrokerFacts
) -> dict[tuple[int, ...], Verdict]:
    """The restart verdicts the roll wants, from the pods `whom_to_ask` names, in the roll's
    order until a broker is cleared (the roll restarts that one). The quorum's leader is
    looked up here if the facts lack it (a voter due because its address moved). A verdict
    nobody could give is left out, and the roller holds what it concerns."""
    addresses = {pod.name: f"{bracketed(pod.ip)}:{METRICS_PORT}" for pod in observed.pods if pod.ip}
    leader = facts.active_controller
    if leader is None and any(ask.voter for ask in asks):
        leader = active_controller(
            {
                pod.name: addresses[pod.name]
                for pod in observed.pods
                if pod.pool in VOTER_ROLES and pod.name in addresses
            }
        )
    found: dict[tuple[int, ...], Verdict] = {}
    for ask in asks:
        for name in whom_to_ask(ask, observed, leader):
            verdict = restart_verdict(addresses[name], ask.nodes) if name in addresses else None
            if verdict is not None:
                found[ask.nodes] = verdict
                break
        if ask.nodes in found and found[ask.nodes].safe:
            break
    return found


AGAIN_PASSES = 3
"""At most this many reconciliations in a row when the plan asks to look again sooner than
the timer would (a node port just allocated, a restart a few seconds away)."""


def reconcile_cluster(body: kopf.Body) -> Plan | None:
    """Reconcile, and again at once while the plan wants another look sooner than the timer
    would give it. None when another reconciliation of the same cluster is already running."""
    metadata = body["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    with _reconciling("kafkacluster", namespace, name) as running:
        if not running:
            return None
        found = _reconcile_once(body)
        if found.applied:  # a dry run launches no audit either
            _reconcile_audits(body)
        for _ in range(AGAIN_PASSES - 1):
            wait = found.requeue_after
            if wait is None or wait >= SETTINGS.interval_s:
                break
            time.sleep(wait)
            fresh = kube().custom_object(namespace, "kafkaclusters", name)
            if fresh is None:
                break
            found = _reconcile_once(kopf.Body(fresh))  # type: ignore[arg-type]
        return found


def _reconcile_once(body: kopf.Body) -> Plan:
    """Observe, plan, apply, write the status, then restart what the plan says (one pod, or
    a batch of brokers)."""
    metadata = body["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    adapter = kube()
    status = body.get("status") or {}
    cluster_id = adapter.cluster_id(namespace, name) or status.get("clusterId")
    cluster_id = cluster_id or new_cluster_id()
    observed = adapter.observe(namespace, name)
    everyone_ready = bool(observed.pods) and all(p.ready for p in observed.pods)
    # The brokers are asked when the roll may go on: every pod ready, or a drain under way.
    askable = everyone_ready or bool(drained(observed))
    facts = broker_facts(_bootstrap(body, namespace)) if askable else None
    facts = _with_active_controller(facts, observed)
    planning = functools.partial(
        plan,
        body,
        namespace=namespace,
        cluster_id=cluster_id,
        observed=observed,
        image=SETTINGS.image,
        cluster_domain=SETTINGS.cluster_domain,
        dns_ttl_s=SETTINGS.dns_ttl_s,
    )
    found = planning(facts=facts)
    for _ in range(ASK_ROUNDS):
        if not found.asks or facts is None:
            break
        answers = _verdicts(found.asks, observed, facts)
        if not answers:
            break  # nobody could say: the roll holds (or restarts the batch it has)
        facts = dataclasses.replace(facts, verdicts={**facts.verdicts, **answers})
        found = planning(facts=facts)
    for document in found.objects:
        adapter.apply(document)
    for kind, gone in found.deletions:
        if kind == "Service":
            adapter.delete_service(namespace, gone)
    for pod, told in found.pod_annotations.items():
        adapter.annotate_pod(namespace, pod, told)
    for node, changes in found.config_updates.items():
        try:
            alter_broker_configs(_bootstrap(body, namespace), node, changes)
        except Exception as exc:  # what Kafka answered; the next reconciliation tries again
            log.warning("%s/%s: configs of broker %d not set: %s", namespace, name, node, exc)
            kopf.event(body, type="Warning", reason="ConfigUpdateFailed", message=str(exc))
    # The status (status.rollout names the pod) before the restart: an operator stopped in
    # between finds the roll where it was.
    _write_status(body, "kafkaclusters", found)
    for restart in found.restarts:
        adapter.delete_pod(namespace, restart.pod)
    if found.annotations:
        adapter.patch_annotations("kafkaclusters", namespace, name, found.annotations)
    return found


def _reconcile_audits(body: kopf.Body) -> None:
    """The cluster's retention audits: their objects, a requested run, and each topic's
    latest verdict in its status, conditions, Events and the operator's metrics. A failure
    here is logged and told, and never holds up the cluster's own reconciliation."""
    metadata = body["metadata"]
    key = (metadata["namespace"], metadata["name"])
    try:
        _audits_once(body)
    except Exception as exc:
        log.exception("retention audit of %s/%s", *key)
        told = _api_said(exc)[:500]
        if _AUDIT_ERRORS.get(key) != told:  # once, not at every reconciliation
            kopf.event(body, type="Warning", reason="RetentionAuditError", message=told)
        _AUDIT_ERRORS[key] = told
    else:
        _AUDIT_ERRORS.pop(key, None)


_AUDIT_ERRORS: dict[tuple[str, str], str] = {}


def _api_said(exc: Exception) -> str:
    """What went wrong, in a line: the API server's own message for a refused call."""
    if isinstance(exc, client.ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except ValueError:
            message = None
        return f"{exc.status} {exc.reason}: {message or exc.body}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _cluster_topics(namespace: str, cluster: str) -> dict[str, dict[str, Any]]:
    return {
        t["metadata"]["name"]: t
        for t in kube().custom_objects(namespace, "topics")
        if (t.get("spec") or {}).get("cluster") == cluster
        and not t["metadata"].get("deletionTimestamp")
    }


def _audits_once(body: kopf.Body) -> None:
    metadata = body["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    try:
        cluster = KafkaCluster.model_validate(dict(body) | {"status": None})
    except ValidationError:
        return  # the planner says why
    status = body.get("status") or {}
    adapter = kube()
    audit = cluster.spec.retention_audit
    if audit is None:
        if status.get("retentionAudit"):
            _audit_off(namespace, name)
        return
    bodies = _cluster_topics(namespace, name)
    topics = [
        TopicRef(
            name=resource,
            kafka_name=topic_name(t),
            labels=t["metadata"].get("labels") or {},
            request=(t["metadata"].get("annotations") or {}).get(AUDIT_ANNOTATION),
            status=(t.get("status") or {}).get("retentionAudit") or {},
            conditions=(t.get("status") or {}).get("conditions") or [],
        )
        for resource, t in bodies.items()
    ]
    target = Target(
        namespace=namespace,
        name=name,
        uid=metadata["uid"],
        cluster_id=status.get("clusterId") or "",
        cluster_domain=SETTINGS.cluster_domain,
    )
    internal = [listener for listener in cluster.spec.listeners if listener.type == "internal"]
    found = plan_audits(
        cluster,
        target,
        topics=topics,
        found=adapter.audit_runs(namespace, name),
        cluster_request=(metadata.get("annotations") or {}).get(AUDIT_ANNOTATION),
        status=status.get("retentionAudit") or {},
        image=SETTINGS.spark_image,
        listener_port=internal[0].port,
    )
    assert found is not None
    for document in found.objects:
        adapter.apply(document)
    if found.claim is not None:
        adapter.create(found.claim)
    # The other launcher's schedule goes once this one's is in place.
    for api_version, kind, retired in found.retired:
        adapter.delete_schedule(api_version, kind, namespace, retired)
    # Before the statuses say its requests were handled (its name is the request's).
    if found.job is not None and adapter.create(found.job):
        started = f"started {found.job['metadata']['name']}"
        kopf.event(body, type="Normal", reason="RetentionAuditRequested", message=started)
    for update in found.topics:
        topic = bodies[update.name]
        _write_topic_audit(topic, update.status, update.condition)
        if update.event is not None:
            kind, reason, message = update.event
            kopf.event(kopf.Body(topic), type=kind, reason=reason, message=message)  # type: ignore[arg-type]
    for stop in found.stops:
        if stop.result is not None:
            adapter.create(stop.result)
        if stop.driver is not None:
            adapter.delete_pod(namespace, stop.driver)
        else:
            adapter.delete_spark_application(namespace, stop.run)
        message = f"{stop.run}: past its deadline ({audit.deadline_seconds} s)"
        kopf.event(body, type="Warning", reason="RetentionAuditStopped", message=message)
    # After the topics' statuses took what the pruned runs' results said.
    for run in found.pruned:
        adapter.delete_spark_application(namespace, run)
    for kind, reason, message in found.events:
        kopf.event(body, type=kind, reason=reason, message=message)
    shown = {key: value for key, value in found.status.items() if value is not None}
    if shown != (status.get("retentionAudit") or {}):  # no write (and no watch event) for nothing
        adapter.patch_status("kafkaclusters", namespace, name, {"retentionAudit": found.status})
    _set_audit_metrics(namespace, name, found.shown, found.last_success)


def _write_topic_audit(
    topic: Mapping[str, Any], audit: dict[str, Any] | None, wanted: ConditionState | None
) -> None:
    """A topic's `status.retentionAudit` and its condition (None: both go); a topic deleted
    meanwhile is skipped."""
    metadata = topic["metadata"]
    current = (topic.get("status") or {}).get("conditions") or []
    conditions = [c for c in current if c.get("type") != AUDIT_CONDITION]
    if wanted is not None:
        generation = metadata.get("generation")
        conditions += merge_conditions(current, [wanted], now=_now(), generation=generation)
    try:
        kube().patch_status(
            "topics",
            metadata["namespace"],
            metadata["name"],
            {"retentionAudit": audit, "conditions": conditions},
        )
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def _audit_off(namespace: str, cluster: str) -> None:
    """`spec.retentionAudit` was removed: its objects and runs go, and so do the verdicts in
    the topics' statuses and the metrics."""
    kube().delete_audit(namespace, cluster)
    for topic in _cluster_topics(namespace, cluster).values():
        if (topic.get("status") or {}).get("retentionAudit"):
            _write_topic_audit(topic, None, None)
    kube().patch_status("kafkaclusters", namespace, cluster, {"retentionAudit": None})
    _set_audit_metrics(namespace, cluster, {}, None)


def _set_audit_metrics(
    namespace: str, cluster: str, shown: Mapping[str, Mapping[str, Any]], success: str | None
) -> None:
    """The gauges of a cluster's judged topics, as their statuses show them; a topic no longer
    shown (or a cluster whose audit is off, or gone) leaves no stale series behind."""
    series: set[tuple[Gauge, tuple[str, ...]]] = set()

    def put(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
        if value is not None:
            gauge.labels(*labels).set(value)
            series.add((gauge, labels))

    for topic, status in shown.items():
        labels: tuple[str, ...] = (namespace, cluster, topic)
        put(AUDIT_OLDEST, labels, status.get("oldestRecordAgeSeconds"))
        put(AUDIT_RECORDS, labels, status.get("recordsPastBound"))
        put(AUDIT_BYTES, labels, status.get("bytesPastBound"))
        put(AUDIT_COMPLIANT, labels, 1.0 if status.get("verdict") == "Compliant" else 0.0)
        for finding in status.get("findings") or []:
            put(AUDIT_FINDINGS, (*labels, finding["code"]), finding["count"])
    if success is not None:
        moment = datetime.datetime.fromisoformat(success)
        put(AUDIT_LAST_SUCCESS, (namespace, cluster), moment.timestamp())
    for gauge, labels in _AUDIT_SERIES.get((namespace, cluster), set()) - series:
        gauge.remove(*labels)
    _AUDIT_SERIES[(namespace, cluster)] = series


def _write_status(body: kopf.Body, plural: str, found: Plan | TopicPlan) -> None:
    metadata = body["metadata"]
    current = (body.get("status") or {}).get("conditions") or []
    generation = metadata.get("generation")
    known = {(c.get("reason"), c.get("message")) for c in current}
    for kind, reason, message in found.events:
        if kind == "Normal" or (reason, message) not in known:  # a refusal is told once
            kopf.event(body, type=kind, reason=reason, message=message)
    status = dict(found.status)
    rollout = status.get("rollout")
    if rollout is not None and rollout.get("held"):
        before = (body.get("status") or {}).get("rollout") or {}
        same = before.get("held") == rollout["held"] and before.get("heldSince")
        status["rollout"] = rollout | {"heldSince": before["heldSince"] if same else _now()}
    if getattr(found, "applied", True):
        status["observedGeneration"] = generation
    # A dry run observes a generation without carrying it out: the last applied one stays.
    status["conditions"] = merge_conditions(
        current, found.conditions, now=_now(), generation=generation
    )
    # The audit's condition is the audit's to write (_reconcile_audits).
    status["conditions"] += [c for c in current if c.get("type") == AUDIT_CONDITION]
    kube().patch_status(plural, metadata["namespace"], metadata["name"], status)


@kopf.on.event(GROUP, VERSION, "kafkaclusters")
def cluster_changed(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
    """A new cluster, or a new generation of its spec: reconcile at once (status writes and
    the operator's own annotations do not count)."""
    if event.get("type") == "DELETED":
        _set_audit_metrics(body["metadata"]["namespace"], body["metadata"]["name"], {}, None)
        return
    status = body.get("status") or {}
    generation = body["metadata"].get("generation")
    dry_run = DRY_RUN_ANNOTATION in (body["metadata"].get("annotations") or {})
    reported = (status.get("dryRun") or {}).get("generation")
    if dry_run:
        if reported != generation:  # a new spec to report on (not our own status write)
            reconcile_cluster(body)
    elif status.get("dryRun") is not None or status.get("observedGeneration") != generation:
        reconcile_cluster(body)  # the dry run ended, or a new spec to carry out


@kopf.timer(GROUP, VERSION, "kafkaclusters", interval=SETTINGS.interval_s, sharp=False)
def cluster_timer(body: kopf.Body, **_: Any) -> None:
    reconcile_cluster(body)


# -- Topic ------------------------------------------------------------------------------------


def _cluster_of(namespace: str, name: str) -> tuple[bool | None, str | None]:
    """Whether the topic's KafkaCluster exists and takes topic changes (None: no such
    cluster), and where its brokers answer."""
    cluster = kube().custom_object(namespace, "kafkaclusters", name)
    if cluster is None:
        return None, None
    status = cluster.get("status") or {}
    ready = cluster_serves_topics(status.get("conditions") or [])
    internal = _internal(status.get("listeners") or [])
    return ready, internal[0]["bootstrapServers"] if internal else None


def reconcile_topic(body: kopf.Body) -> TopicPlan | None:
    metadata = body["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    with _reconciling("topic", namespace, name) as running:
        if not running:
            return None
        cluster = (body.get("spec") or {}).get("cluster", "")
        ready, bootstrap = _cluster_of(namespace, cluster)
        found = None
        client = admin(bootstrap) if ready and bootstrap is not None else None
        if client is not None:
            try:
                found = describe_topic(client, topic_name(body))
            except Exception as exc:  # the cluster stopped answering: wait, as if not ready
                log.info("topic %s/%s: describing failed: %s", namespace, name, exc)
                ready = False
        planned = plan_topic(body, cluster_ready=ready, found=found)
        for action in planned.actions:
            assert client is not None  # actions come only for a cluster that answered
            carry_out(client, action)
        _write_status(body, "topics", planned)
        return planned


@kopf.on.event(GROUP, VERSION, "topics")
def topic_changed(event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
    if event.get("type") == "DELETED" or body["metadata"].get("deletionTimestamp"):
        return
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"].get("generation"):
        reconcile_topic(body)


@kopf.timer(GROUP, VERSION, "topics", interval=SETTINGS.interval_s * 3, sharp=False)
def topic_timer(body: kopf.Body, **_: Any) -> None:
    """Drift made in Kafka is found and put back within this; a topic whose cluster was not
    ready is tried again."""
    reconcile_topic(body)


@kopf.on.delete(GROUP, VERSION, "topics")
def topic_deleted(body: kopf.Body, **_: Any) -> None:
    """`deletionPolicy: delete` deletes the topic in Kafka before the resource goes; with
    `retain`, or when its cluster is gone, the resource simply goes."""
    spec = body.get("spec") or {}
    if spec.get("deletionPolicy", "delete") != "delete":
        return
    ready, bootstrap = _cluster_of(body["metadata"]["namespace"], spec.get("cluster", ""))
    if ready is None:
        return
    if not ready or bootstrap is None:
        raise kopf.TemporaryError("the cluster is not ready to delete the topic", delay=10)
    delete_topic(admin(bootstrap), topic_name(body))
