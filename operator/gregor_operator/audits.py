"""Retention audits of a `KafkaCluster`: the objects that run them, when a requested run
starts, and what each `Topic`'s status says of the latest result.

What it owns: from `spec.retentionAudit`, the audit's ServiceAccount with a Role holding only
what Spark on Kubernetes needs, the reports' volume claim, and a CronJob whose Job runs
`gregor_audit.submit` from the `gregor-spark` image (spark-submit in cluster mode: the driver
and its executors are pods, owned by the Job). A request (the `gregor.dev/audit-retention`
annotation on the cluster, or on a `Topic` for that topic) becomes a Job owned by the CronJob,
started only when no run is active, so one audit runs per cluster at a time and a request
during a run waits; a cluster's request covers its topics' requests. Each run's driver leaves a
compact result in a ConfigMap owned by its run (gregor_audit.result); each topic's status
shows the newest result that judged it, with the `RetentionCompliant` condition and an Event
when its verdict changes. Where the Kubeflow Spark Operator runs (`launcher: Auto` once one
takes up the schedule, or `SparkApplication`), the schedule is a ScheduledSparkApplication and
a request a SparkApplication of its own, and the operator does what a Job's deadline and the
CronJob's history did (ADR 0026). It is pure, like the planners. What it must never do: call
Kubernetes, or judge a topic itself (the audit does).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .models import KafkaCluster, RetentionAudit
from .objects import Target, bootstrap_address, cluster_labels, owned_metadata
from .planner import ConditionState

__all__ = [
    "AUDIT_ANNOTATION",
    "AUDIT_CONDITION",
    "DEFAULT_SPARK_IMAGE",
    "REQUEST_ANNOTATION",
    "RESULT_KEY",
    "RESULT_LABEL",
    "RUN_LABEL",
    "AuditPlan",
    "AuditRuns",
    "Launcher",
    "Run",
    "Stop",
    "TopicRef",
    "TopicUpdate",
    "audit_name",
    "launcher_of",
    "plan_audits",
    "spark_run",
]

AUDIT_ANNOTATION = "gregor.dev/audit-retention"
"""On a `KafkaCluster` or a `Topic`: any new value requests an audit now."""
AUDIT_CONDITION = "RetentionCompliant"
RUN_LABEL = "gregor.dev/retention-audit"
"""On the audit's objects, its runs' Jobs and pods and their results: the cluster's name."""
RESULT_KEY = "result.json"
"""Where a run's result is in its ConfigMap (gregor_audit.result writes it; the operator does
not import the audit, which the broker's image does not hold)."""
RESULT_LABEL = "gregor.dev/audit-result"
"""On a run's result ConfigMap, `true` (gregor_audit.submit labels it so)."""
REQUEST_ANNOTATION = "gregor.dev/audit-request"
"""On a requested run's Job: what requested it."""
DEFAULT_SPARK_IMAGE = "gregor-spark:dev"
REPORTS_MOUNT = "/reports"
DEFAULT_REPORTS_SIZE = "1Gi"
SUBMITTER_GRACE_S = 120
"""How much longer than the driver's deadline its submitter may run (spark-submit's start and
its wait for the driver's end)."""
MAX_NAME = 52
"""A CronJob's name, with the 11 characters of its Jobs' suffix, must fit in a label value."""

_VERBS = ["create", "get", "list", "watch", "patch", "update", "delete", "deletecollection"]
SPARK_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
        "verbs": _VERBS,
    },
    # spark-submit applies the driver's NetworkPolicy server-side (a PATCH).
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _VERBS},
]
"""What spark-submit and its driver do in the namespace: make and watch the driver's and the
executors' pods, the driver's Service, ConfigMap and NetworkPolicy (Spark 4.2 makes one per
driver), executors' claims when asked, and the run's result (a ConfigMap)."""


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A `Topic` of the cluster, as the audit sees it."""

    name: str
    """The resource's name."""
    kafka_name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    request: str | None = None
    """Its `gregor.dev/audit-retention` annotation."""
    status: Mapping[str, Any] = field(default_factory=dict)
    """Its `status.retentionAudit`."""
    conditions: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True, slots=True)
class Run:
    """A run of the cluster's audit (a Job or a SparkApplication), and its result if the
    driver left one."""

    name: str
    created: str
    """When the Job was made (RFC 3339: sorts as it reads)."""
    active: bool
    failed: bool = False
    result: Mapping[str, Any] | None = None
    requested: bool = False
    """Made by the operator for a request, not by the CronJob's schedule."""
    kind: str = "Job"
    """`Job` or `SparkApplication`."""
    uid: str | None = None
    age_s: float = 0.0
    """How long ago it was made."""
    state: str | None = None
    """A SparkApplication's `status.applicationState.state` (`""`: no Spark operator has
    taken it up yet)."""
    why: str | None = None
    """How it failed, when its launcher says (a SparkApplication's `errorMessage`)."""


@dataclass(frozen=True, slots=True)
class AuditRuns:
    """What the API server holds of a cluster's audit: its schedules and its runs."""

    runs: list[Run] = field(default_factory=list)
    cron_job_uid: str | None = None
    spark_served: bool = False
    """Whether the operator may use SparkApplications here (their CRDs are installed, and it
    may list them)."""
    spark_problem: str | None = None
    """Why it may not, when the CRDs are there."""
    scheduled_uid: str | None = None
    """Its ScheduledSparkApplication's, when it has one."""
    scheduled_state: str = ""
    """That one's `status.scheduleState`: empty until a Spark operator takes it up."""
    scheduled_age_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TopicUpdate:
    """A topic's new `status.retentionAudit` and its condition, from a newer result."""

    name: str
    status: dict[str, Any]
    condition: ConditionState | None
    event: tuple[str, str, str] | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """An overdue SparkApplication (a SparkApplication has no deadline of its own): its driver
    pod to delete (the Spark operator then fails the run), or, when no Spark operator took it up,
    the run itself; and the result saying why, unless the run left one."""

    run: str
    driver: str | None
    result: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class AuditPlan:
    objects: list[dict[str, Any]]
    """What to apply: the ServiceAccount, Role, RoleBinding and CronJob."""
    claim: dict[str, Any] | None
    """The reports' claim, made if missing (a claim's spec cannot change)."""
    job: dict[str, Any] | None
    """A requested run to start now."""
    status: dict[str, Any]
    """The cluster's `status.retentionAudit`."""
    topics: list[TopicUpdate]
    events: list[tuple[str, str, str]]
    """For the cluster."""
    shown: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each judged topic's `status.retentionAudit` once the updates are written, by Kafka
    name: what the metrics show (a result goes with its run's Job; the status stays)."""
    last_success: str | None = None
    retired: list[tuple[str, str, str]] = field(default_factory=list)
    """`(apiVersion, kind, name)`: the other launcher's schedule, to delete (with its runs)."""
    stops: list[Stop] = field(default_factory=list)
    """Overdue SparkApplications."""
    pruned: list[str] = field(default_factory=list)
    """Finished SparkApplications past the history limit, to delete (the Spark operator
    prunes only when its schedule starts a run)."""


def audit_name(cluster: str) -> str:
    return f"{cluster}-audit"


def _labels(target: Target) -> dict[str, str]:
    """The audit's labels: the cluster's, but for `gregor.dev/cluster`, by which the operator
    finds the cluster's own pods and Services (Kube.observe)."""
    labels = {k: v for k, v in cluster_labels(target).items() if k != "gregor.dev/cluster"}
    return labels | {"app.kubernetes.io/component": "retention-audit", RUN_LABEL: target.name}


def _metadata(target: Target, name: str, *, owned: bool = True) -> dict[str, Any]:
    metadata = owned_metadata(target, name, cluster_labels(target) | _labels(target))
    if not owned:
        del metadata["ownerReferences"]
    return metadata


def _rbac(target: Target) -> list[dict[str, Any]]:
    name = audit_name(target.name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(target, name),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(target, name),
            "rules": SPARK_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(target, name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": target.namespace}],
        },
    ]


def _claim_name(target: Target) -> str:
    return f"{audit_name(target.name)}-reports"


def _claim(target: Target, audit: RetentionAudit, delete_claims: bool) -> dict[str, Any] | None:
    """The reports' claim: kept with the cluster's own claims (`deleteClaims`)."""
    if audit.reports.uri is not None:
        return None
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": audit.reports.size or DEFAULT_REPORTS_SIZE}},
    }
    if audit.reports.storage_class is not None:
        spec["storageClassName"] = audit.reports.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(target, _claim_name(target), owned=delete_claims),
        "spec": spec,
    }


def _audit_arguments(
    audit: RetentionAudit, bootstrap: str, topics: Sequence[str], *, run: str = "$(JOB_NAME)"
) -> list[str]:
    """`gregor audit retention`'s arguments; `run` is the run's name, as its container's
    environment gives it (Kubernetes expands `$(NAME)` in a container's arguments)."""
    where = (
        f"{audit.reports.uri.rstrip('/')}/{run}"
        if audit.reports.uri is not None
        else f"{REPORTS_MOUNT}/{run}"
    )
    line = ["--bootstrap-server", bootstrap]
    for topic in topics:
        line += ["--topic", topic]
    line += ["--output", where, "--future-skew", audit.future_skew]
    if audit.max_age is not None:
        line += ["--max-age", audit.max_age]
    return line


def _job_spec(
    target: Target, audit: RetentionAudit, image: str, bootstrap: str, topics: Sequence[str]
) -> dict[str, Any]:
    name = audit_name(target.name)
    submit = [
        "python", "-m", "gregor_audit.submit",
        "--image", image,
        "--service-account", name,
        "--name", name,
        "--label", f"{RUN_LABEL}={target.name}",
        "--label", "app.kubernetes.io/component=retention-audit",
        "--label", f"app.kubernetes.io/instance={target.name}",
        "--owner-job", "$(JOB_NAME)",
        "--owner-uid", "$(JOB_UID)",
        "--deadline-seconds", str(audit.deadline_seconds),
        "--driver-cores", str(audit.driver.cores),
        "--driver-memory", audit.driver.memory,
        "--executors", str(audit.executors.instances),
        "--executor-cores", str(audit.executors.cores),
        "--executor-memory", audit.executors.memory,
    ]  # fmt: skip
    for role, pods in (("driver", audit.driver), ("executor", audit.executors)):
        if pods.request_cores is not None:
            submit += [f"--{role}-request-cores", pods.request_cores]
    if audit.reports.uri is None:
        submit += ["--report-claim", _claim_name(target), "--report-mount", REPORTS_MOUNT]
    labels = _labels(target)
    return {
        "backoffLimit": 0,
        "activeDeadlineSeconds": audit.deadline_seconds + SUBMITTER_GRACE_S,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": name,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "submit",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": ["--", *submit, "--", *_audit_arguments(audit, bootstrap, topics)],
                        "env": [
                            _from_label("JOB_NAME", "batch.kubernetes.io/job-name"),
                            _from_label("JOB_UID", "batch.kubernetes.io/controller-uid"),
                        ],
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "384Mi"},
                            "limits": {"memory": "768Mi"},
                        },
                    }
                ],
            },
        },
    }


def _from_label(variable: str, label: str) -> dict[str, Any]:
    return {
        "name": variable,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}},
    }


def _cron_job(
    target: Target,
    audit: RetentionAudit,
    image: str,
    bootstrap: str,
    topics: Sequence[str],
    *,
    hold: bool,
) -> dict[str, Any]:
    """`hold`: a requested run is active. The CronJob's controller counts only the Jobs it
    made itself as active, so `Forbid` alone would start a scheduled run beside it."""
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _metadata(target, audit_name(target.name)),
        "spec": {
            "schedule": audit.schedule,
            # Nothing to audit yet (a run would only fail), or a requested run is active.
            "suspend": audit.suspend or not topics or hold,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 300,
            "successfulJobsHistoryLimit": audit.history_limit,
            "failedJobsHistoryLimit": audit.history_limit,
            "jobTemplate": {
                "metadata": {"labels": _labels(target)},
                "spec": _job_spec(target, audit, image, bootstrap, topics),
            },
        },
    }


def _requested_name(target: Target, request: str) -> str:
    digest = hashlib.sha256(request.encode()).hexdigest()[:7]
    return f"{audit_name(target.name)}-r{digest}"


def _requested_job(
    target: Target,
    audit: RetentionAudit,
    image: str,
    bootstrap: str,
    topics: Sequence[str],
    *,
    owner_uid: str,
    request: str,
) -> dict[str, Any]:
    """A run made now, as `kubectl create job --from=cronjob/…` makes one: owned by the
    CronJob, so that it counts among its active runs and goes with its history. Its name comes
    from the request, so a request is never run twice."""
    name = audit_name(target.name)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": _requested_name(target, request),
            "namespace": target.namespace,
            "labels": _labels(target),
            "annotations": {
                "cronjob.kubernetes.io/instantiate": "manual",
                REQUEST_ANNOTATION: request,
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    # Setting it needs `update` on cronjobs/finalizers where admission
                    # enforces owner references (OpenShift); nothing needs it here.
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": _job_spec(target, audit, image, bootstrap, topics),
    }


# The Kubeflow Spark Operator's launches ----------------------------------------------------

SPARK_API = "sparkoperator.k8s.io/v1beta2"
SPARK_VERSION = "4.2.0"
"""PySpark's version in the `gregor-spark` image (pyproject.toml pins it)."""
APPLICATION = "local:///opt/gregor/retention_audit.py"
"""The audit as spark-submit's Python application, inside the `gregor-spark` image."""
LOGGING = "/opt/gregor/log4j2.properties"
"""The audit's logging for Spark's JVMs, inside the `gregor-spark` image."""
SCHEDULED_LABEL = "sparkoperator.k8s.io/scheduled-app-name"
"""On a ScheduledSparkApplication's runs: the Spark operator counts those it carries for
`Forbid` and prunes them to the history limits, so a requested run carries it too."""
APP_NAME_LABEL = "sparkoperator.k8s.io/app-name"
"""On a SparkApplication's driver and executor pods: the application's name."""
RESULT_ENV = "GREGOR_AUDIT_RESULT"
"""The driver's environment variable naming where it leaves its result (gregor_audit.result)."""
REPORT_GROUP = 10001
"""The `gregor-spark` image's group: the report claim's files belong to it (`fsGroup`)."""
MAX_SPARK_NAME = 36
"""The scheduled runs are named `<cluster>-audit-<19 digits>`, and their drivers
`<run>-driver`, which must fit in 63 characters."""
UNCLAIMED_S = 300
"""How long a SparkApplication may go without a state before the cluster's status asks
whether a Spark operator watches its namespace."""
_FINISHED = frozenset({"COMPLETED", "FAILED"})


def _spark_pods(target: Target, audit: RetentionAudit, role: str) -> dict[str, Any]:
    pods = audit.driver if role == "driver" else audit.executors
    spec: dict[str, Any] = {"cores": pods.cores, "memory": pods.memory, "labels": _labels(target)}
    if pods.request_cores is not None:
        spec["coreRequest"] = pods.request_cores
    if audit.reports.uri is None:
        spec["volumeMounts"] = [{"name": "report", "mountPath": REPORTS_MOUNT}]
        spec["podSecurityContext"] = {
            "fsGroup": REPORT_GROUP,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
    if role == "executor":
        return spec | {"instances": audit.executors.instances}
    result = {
        "namespace": target.namespace,
        "labels": _labels(target) | {RESULT_LABEL: "true"},
        "owner": {"apiVersion": SPARK_API, "kind": "SparkApplication"},
    }
    return spec | {
        "serviceAccount": audit_name(target.name),
        # The Spark operator's webhook puts `env` into the pod, as it puts the pod's owner.
        "env": [
            {"name": "GREGOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            _from_label("GREGOR_RUN", APP_NAME_LABEL),
        ],
        "envVars": {RESULT_ENV: json.dumps(result, separators=(",", ":"), sort_keys=True)},
    }


def _spark_application_spec(
    target: Target, audit: RetentionAudit, image: str, bootstrap: str, topics: Sequence[str]
) -> dict[str, Any]:
    """A run as a SparkApplication: what `gregor_audit.submit` gives spark-submit, in the
    Spark operator's terms. The driver finds its run's name in `$(GREGOR_RUN)` and, through its
    pod's owner, the SparkApplication its result belongs to."""
    spec: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "mainApplicationFile": APPLICATION,
        "arguments": _audit_arguments(audit, bootstrap, topics, run="$(GREGOR_RUN)"),
        "sparkVersion": SPARK_VERSION,
        "restartPolicy": {"type": "Never"},
        "sparkConf": {
            "spark.ui.enabled": "false",
            "spark.sql.debug.maxToStringFields": "200",
            "spark.kubernetes.driver.service.deleteOnTermination": "true",
            "spark.kubernetes.executor.deleteOnTermination": "true",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOGGING}",
            "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOGGING}",
        },
        "driver": _spark_pods(target, audit, "driver"),
        "executor": _spark_pods(target, audit, "executor"),
    }
    if audit.reports.uri is None:
        spec["volumes"] = [
            {"name": "report", "persistentVolumeClaim": {"claimName": _claim_name(target)}}
        ]
    return spec


def _scheduled_application(
    target: Target,
    audit: RetentionAudit,
    image: str,
    bootstrap: str,
    topics: Sequence[str],
    *,
    hold: bool,
) -> dict[str, Any]:
    """`hold`: a requested run is starting or active (the Spark operator's `Forbid` counts it,
    from a cache that may not have it yet)."""
    return {
        "apiVersion": SPARK_API,
        "kind": "ScheduledSparkApplication",
        # Without `gregor.dev/cluster`: its runs, and their pods, carry its labels.
        "metadata": owned_metadata(target, audit_name(target.name), _labels(target)),
        "spec": {
            "schedule": audit.schedule,
            "suspend": audit.suspend or not topics or hold,
            "concurrencyPolicy": "Forbid",
            "successfulRunHistoryLimit": audit.history_limit,
            "failedRunHistoryLimit": audit.history_limit,
            "template": _spark_application_spec(target, audit, image, bootstrap, topics),
        },
    }


def _requested_application(
    target: Target,
    audit: RetentionAudit,
    image: str,
    bootstrap: str,
    topics: Sequence[str],
    *,
    owner_uid: str,
    request: str,
) -> dict[str, Any]:
    """A requested run as its ScheduledSparkApplication's own: owned by it and labelled as its
    runs are, so that `Forbid` holds its schedule while it runs and its history keeps it."""
    name = audit_name(target.name)
    return {
        "apiVersion": SPARK_API,
        "kind": "SparkApplication",
        "metadata": {
            "name": _requested_name(target, request),
            "namespace": target.namespace,
            "labels": _labels(target) | {SCHEDULED_LABEL: name},
            "annotations": {REQUEST_ANNOTATION: request},
            "ownerReferences": [
                {
                    "apiVersion": SPARK_API,
                    "kind": "ScheduledSparkApplication",
                    "name": name,
                    "uid": owner_uid,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": _spark_application_spec(target, audit, image, bootstrap, topics),
    }


def spark_run(
    application: Mapping[str, Any], result: Mapping[str, Any] | None, *, age_s: float
) -> Run:
    """A SparkApplication of the cluster's audit as a run."""
    metadata = application["metadata"]
    state = (application.get("status") or {}).get("applicationState") or {}
    name = str(metadata["name"])
    now = str(state.get("state") or "")
    return Run(
        name=name,
        created=str(metadata.get("creationTimestamp") or ""),
        active=now not in _FINISHED and not metadata.get("deletionTimestamp"),
        failed=now == "FAILED",
        result=result,
        requested=REQUEST_ANNOTATION in (metadata.get("annotations") or {}),
        kind="SparkApplication",
        uid=metadata.get("uid"),
        age_s=age_s,
        state=now,
        why=_shortened(str(state.get("errorMessage") or "")) or None,
    )


def _shortened(message: str, limit: int = 600) -> str:
    """A message fit for a status: spark-submit's whole stderr can be the Spark operator's
    `errorMessage`; its start and its end say what failed."""
    words = " ".join(message.split())
    if len(words) <= limit:
        return words
    return f"{words[: limit // 3]} … {words[-(2 * limit) // 3 :]}"


def _stop(target: Target, run: Run, deadline_s: int) -> Stop:
    why = f"the audit's driver ran past its deadline ({deadline_s} s) and was stopped"
    if run.state == "":
        why = f"no Spark operator took the run up within its deadline ({deadline_s} s)"
    result = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{run.name}-result",
            "namespace": target.namespace,
            "labels": _labels(target) | {RESULT_LABEL: "true"},
            "ownerReferences": [
                {
                    "apiVersion": SPARK_API,
                    "kind": "SparkApplication",
                    "name": run.name,
                    "uid": run.uid,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "data": {RESULT_KEY: json.dumps({"error": why, "topics": {}})},
    }
    return Stop(
        run=run.name,
        driver=None if run.state == "" else f"{run.name}-driver",
        result=result if run.result is None else None,
    )


def _selected(audit: RetentionAudit, topics: Sequence[TopicRef]) -> list[str]:
    """The Kafka names of the topics audited on schedule."""
    if audit.topics is None and audit.topic_selector is None:
        return sorted({t.kafka_name for t in topics})
    chosen = set(audit.topics or ())
    if audit.topic_selector is not None:
        wanted = audit.topic_selector.items()
        chosen |= {t.kafka_name for t in topics if all(t.labels.get(k) == v for k, v in wanted)}
    return sorted(chosen)


def _condition(entry: Mapping[str, Any]) -> ConditionState:
    verdict = entry.get("verdict")
    if verdict == "Compliant":
        return ConditionState(AUDIT_CONDITION, "True", "Compliant", "no finding")
    if verdict == "Violations":
        codes = ", ".join(sorted(entry.get("findings") or {}))
        return ConditionState(AUDIT_CONDITION, "False", "Violations", codes)
    return ConditionState(AUDIT_CONDITION, "Unknown", "AuditError", str(entry.get("reason", "")))


def _topic_status(run: Run, entry: Mapping[str, Any], report: str | None) -> dict[str, Any]:
    def whole(value: Any) -> int | None:
        return None if value is None else int(value)

    result = run.result or {}
    return {
        "run": run.name,
        "time": result.get("audited_at"),
        "verdict": entry.get("verdict"),
        "reason": entry.get("reason"),
        "oldestRecordAgeSeconds": whole(entry.get("oldest_record_age_s")),
        "maxAgeSeconds": whole(entry.get("max_age_s")),
        "findings": [
            {"code": code, "count": int(count)}
            for code, count in sorted((entry.get("findings") or {}).items())
        ],
        "recordsPastBound": whole(entry.get("records_past_bound")),
        "bytesPastBound": whole(entry.get("bytes_past_bound")),
        "report": report,
    }


def result_of(data: Mapping[str, str] | None) -> Mapping[str, Any] | None:
    """A run's result, from its ConfigMap's data (None: unreadable)."""
    try:
        found = json.loads((data or {})[RESULT_KEY])
    except (KeyError, ValueError):
        return None
    return found if isinstance(found, dict) else None


@dataclass(frozen=True, slots=True)
class _Requests:
    job: dict[str, Any] | None
    handled_topics: frozenset[str]
    handled: str | None
    """The cluster's request now handled (or the one handled before)."""
    pending: list[str]
    events: list[tuple[str, str, str]]


def _requests(
    target: Target,
    audit: RetentionAudit,
    topics: Sequence[TopicRef],
    *,
    image: str,
    bootstrap: str,
    scheduled: Sequence[str],
    busy: bool,
    launcher: str,
    owner_uid: str | None,
    cluster_request: str | None,
    handled: str | None,
) -> _Requests:
    """A run for the requests not yet handled, when none is running: the cluster's request
    covers every scheduled topic and every topic's request."""
    wanted_cluster = cluster_request is not None and cluster_request != handled
    asking = [
        t for t in topics if t.request is not None and t.request != t.status.get("handledRequest")
    ]
    pending = [f"KafkaCluster {target.name}"] if wanted_cluster else []
    pending += [f"Topic {t.name}" for t in asking]
    if not pending or busy or owner_uid is None:
        return _Requests(None, frozenset(), handled, pending, [])
    if wanted_cluster:  # the topics asked for come along, selected or not
        names = sorted(set(scheduled) | {t.kafka_name for t in asking})
        request = f"KafkaCluster/{target.name}={cluster_request}"
        handled = cluster_request
    else:
        names = sorted({t.kafka_name for t in asking})
        request = ",".join(f"Topic/{t.name}={t.request}" for t in asking)
    served = frozenset(t.name for t in asking)
    if not names:
        event = ("Warning", "NothingToAudit", "no topic is selected for the audit")
        return _Requests(None, served, handled, [], [event])
    make = _requested_application if launcher == "SparkApplication" else _requested_job
    job = make(target, audit, image, bootstrap, names, owner_uid=owner_uid, request=request)
    return _Requests(job, served, handled, [], [])


def _topic_updates(
    topics: Sequence[TopicRef],
    latest: Mapping[str, tuple[Run, Mapping[str, Any]]],
    served: frozenset[str],
) -> list[TopicUpdate]:
    """Each topic whose newest result is not in its status yet, or whose request was served."""
    updates = []
    for topic in topics:
        found = latest.get(topic.kafka_name)
        served_now = topic.name in served
        current = dict(topic.status)
        handled = topic.request if served_now else current.get("handledRequest")
        if found is None:
            if served_now:
                updates.append(TopicUpdate(topic.name, current | {"handledRequest": handled}, None))
            continue
        run, entry = found
        wanted = _condition(entry)
        shown = current.get("run") == run.name and any(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
            == (wanted.type, wanted.status, wanted.reason, wanted.message)
            for c in topic.conditions
        )
        if shown and not served_now:
            continue
        new = _topic_status(run, entry, (run.result or {}).get("report"))
        new["handledRequest"] = handled
        event = None
        if current.get("verdict") != new["verdict"]:
            verdict = str(new["verdict"])
            kind = "Normal" if verdict == "Compliant" else "Warning"
            detail = wanted.message
            message = f"{run.name}: {verdict}" + (f"; {detail}" if detail else "")
            event = (kind, f"Retention{verdict}", message)
        updates.append(TopicUpdate(topic.name, new, wanted, event))
    return updates


def _run_status(
    audit: RetentionAudit,
    ordered: Sequence[Run],
    requests: _Requests,
    *,
    scheduled: Sequence[str],
    before: Mapping[str, Any],
    launcher: Launcher,
    namespace: str,
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """The cluster's `status.retentionAudit`, and an Event when a run failed."""
    active = [r.name for r in ordered if r.active]
    judged = [r for r in ordered if r.result is not None]
    last = judged[-1] if judged else None
    successes = [r for r in judged if "error" not in (r.result or {})]
    # A finished run without a result: failed before its driver could write one, or (a
    # SparkApplication) its driver could not write it.
    silent = [r for r in ordered if not r.active and r.result is None and (r.failed or r.state)]
    unclaimed = [r for r in ordered if r.active and r.state == "" and r.age_s > UNCLAIMED_S]
    error = None
    if silent and (
        last is None or (silent[-1].created, silent[-1].name) > (last.created, last.name)
    ):
        run = silent[-1]
        if run.why:
            error = f"{run.name}: {run.why} (see its pods' logs)"
        elif run.failed:
            error = f"{run.name}: the run failed without a result (see its pods' logs)"
        else:
            error = (
                f"{run.name}: the run ended without a result: its driver could not write it "
                "(the Spark operator's webhook gives the driver its SparkApplication owner: is "
                "it enabled?)"
            )
    elif last is not None and "error" in (last.result or {}):
        error = f"{last.name}: {(last.result or {})['error']}"
    if unclaimed:
        error = f"{unclaimed[-1].name}: {_unclaimed(namespace)}"
    elif launcher.problem is not None:
        error = launcher.problem
    events = []
    if error is not None and before.get("error") != error:
        events.append(("Warning", "RetentionAuditFailed", error))
    if error is None and not scheduled:
        error = "no topic is selected for the audit"
    status = {
        "schedule": None if audit.suspend or not scheduled else audit.schedule,
        "active": active[-1] if active else None,
        "lastRun": last.name if last else None,
        "lastRunTime": (last.result or {}).get("audited_at") if last else None,
        # The older runs go with the history (or a change of launcher): the time stays.
        "lastSuccessTime": (
            (successes[-1].result or {}).get("audited_at")
            if successes
            else before.get("lastSuccessTime")
        ),
        "handledRequest": requests.handled,
        "pending": requests.pending or None,
        "error": error,
        "launcher": launcher.kind,
        "note": launcher.note,
    }
    return status, events


def _unclaimed(namespace: str) -> str:
    return (
        f"no Spark operator has taken it up in {UNCLAIMED_S} s: is one installed with its "
        f"webhook, watching namespace {namespace}? (or set retentionAudit.launcher: Job)"
    )


@dataclass(frozen=True, slots=True)
class Launcher:
    kind: Literal["Job", "SparkApplication"]
    note: str | None = None
    """Why `Auto` chose Jobs though SparkApplications are served."""
    problem: str | None = None
    """Why runs cannot start (the cluster's `status.retentionAudit.error`)."""


def launcher_of(audit: RetentionAudit, name: str, namespace: str, found: AuditRuns) -> Launcher:
    """How the cluster's runs are launched. `Auto` takes SparkApplications where they are
    served and a Spark operator takes up the schedule (an unwatched namespace keeps Jobs)."""
    unclaimed = found.scheduled_uid is not None and (
        found.scheduled_state == "" and found.scheduled_age_s > UNCLAIMED_S
    )
    if audit.launcher == "Job":
        return Launcher("Job")
    if audit.launcher == "SparkApplication":
        if unclaimed and not audit.suspend:
            return Launcher(
                "SparkApplication",
                problem=f"ScheduledSparkApplication {name}: {_unclaimed(namespace)}",
            )
        return Launcher("SparkApplication")
    if not found.spark_served or len(name) > MAX_SPARK_NAME:
        return Launcher("Job")
    if unclaimed:
        return Launcher(
            "Job",
            note=(
                f"SparkApplications are served, and no Spark operator has taken up "
                f"ScheduledSparkApplication {name} in {UNCLAIMED_S} s: runs are Jobs until one "
                f"does (one watching namespace {namespace}, with its webhook)"
            ),
        )
    return Launcher("SparkApplication")


def _invalid(status: Mapping[str, Any], problem: str) -> AuditPlan:
    events = [] if status.get("error") == problem else [("Warning", "InvalidSpec", problem)]
    return AuditPlan([], None, None, {"error": problem}, [], events)


def plan_audits(
    cluster: KafkaCluster,
    target: Target,
    *,
    topics: Sequence[TopicRef],
    found: AuditRuns,
    cluster_request: str | None,
    status: Mapping[str, Any],
    image: str,
    listener_port: int,
) -> AuditPlan | None:
    """What to do for the cluster's audits; None when it has none (`spec.retentionAudit`)."""
    audit = cluster.spec.retention_audit
    if audit is None:
        return None
    name = audit_name(target.name)
    if len(name) > MAX_NAME:
        return _invalid(
            status,
            f"the audit's CronJob {name} would have {len(name)} characters, at most {MAX_NAME}: "
            "shorten the cluster's name",
        )
    if audit.launcher == "SparkApplication" and not found.spark_served:
        why = found.spark_problem or f"the API server does not serve them ({SPARK_API})"
        return _invalid(
            status,
            f"retentionAudit.launcher is SparkApplication, and the operator cannot use "
            f"SparkApplications: {why}. Install the Kubeflow Spark Operator (and give the "
            "operator its chart's rules), or set launcher to Auto or Job",
        )
    if audit.launcher == "SparkApplication" and len(name) > MAX_SPARK_NAME:
        return _invalid(
            status,
            f"the audit's ScheduledSparkApplication {name} would have {len(name)} characters, "
            f"at most {MAX_SPARK_NAME} (its runs' drivers are named after it): shorten the "
            "cluster's name, or set retentionAudit.launcher: Job",
        )
    launcher = launcher_of(audit, name, target.namespace, found)
    sparks = launcher.kind == "SparkApplication"
    image = audit.image or image
    bootstrap = bootstrap_address(
        target.name, target.namespace, target.cluster_domain, listener_port
    )
    scheduled = _selected(audit, topics)
    ordered = sorted(found.runs, key=lambda r: (r.created, r.name))
    requests = _requests(
        target,
        audit,
        topics,
        image=image,
        bootstrap=bootstrap,
        scheduled=scheduled,
        busy=any(r.active for r in ordered),
        launcher=launcher.kind,
        owner_uid=found.scheduled_uid if sparks else found.cron_job_uid,
        cluster_request=cluster_request,
        handled=status.get("handledRequest"),
    )
    latest: dict[str, tuple[Run, Mapping[str, Any]]] = {}
    for run in ordered:  # each topic: the newest run that judged it
        for topic, entry in ((run.result or {}).get("topics") or {}).items():
            latest[topic] = (run, entry)
    run_status, failures = _run_status(
        audit,
        ordered,
        requests,
        scheduled=scheduled,
        before=status,
        launcher=launcher,
        namespace=target.namespace,
    )
    updates = _topic_updates(topics, latest, requests.handled_topics)
    written = {u.name: u.status for u in updates}
    shown = {}
    for topic in topics:
        now = written.get(topic.name, topic.status)
        if now.get("verdict"):
            shown[topic.kafka_name] = now
    hold = requests.job is not None or any(r.active and r.requested for r in ordered)
    schedules = []
    retired = []
    if sparks or (found.spark_served and audit.launcher == "Auto" and len(name) <= MAX_SPARK_NAME):
        # Under Auto, kept while runs are Jobs, for a Spark operator to take up.
        schedules.append(
            _scheduled_application(target, audit, image, bootstrap, scheduled, hold=sparks and hold)
        )
    elif found.scheduled_uid is not None:
        retired.append((SPARK_API, "ScheduledSparkApplication", name))
    if sparks:
        if found.cron_job_uid is not None:
            retired.append(("batch/v1", "CronJob", name))
    else:
        schedules.append(_cron_job(target, audit, image, bootstrap, scheduled, hold=hold))
    overdue = audit.deadline_seconds + SUBMITTER_GRACE_S
    stops = [
        _stop(target, r, audit.deadline_seconds)
        for r in ordered
        if r.kind == "SparkApplication" and r.active and r.age_s > overdue
    ]
    return AuditPlan(
        objects=[*_rbac(target), *schedules],
        claim=_claim(target, audit, cluster.spec.delete_claims),
        job=requests.job,
        status=run_status,
        topics=updates,
        events=[*requests.events, *failures],
        shown=shown,
        last_success=run_status["lastSuccessTime"],
        retired=retired,
        stops=stops,
        pruned=_pruned(ordered, audit.history_limit),
    )


def _pruned(ordered: Sequence[Run], limit: int) -> list[str]:
    """The SparkApplications beyond the newest `limit` of each outcome."""
    gone = []
    for state in _FINISHED:
        ended = [r.name for r in ordered if r.kind == "SparkApplication" and r.state == state]
        gone += ended[: max(0, len(ended) - limit)]
    return sorted(gone)
