"""The one adapter that talks to the Kubernetes API.

What it owns: applying objects with server-side apply under one field manager (so the labels
and annotations other tools set survive, and an edit to a field the operator owns is put
back), reading what the planner observes (StatefulSets and pods, by the cluster's label),
the cluster id, and deleting a pod to restart it. What it must never do: decide anything.
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from broker.config import parse_properties

from . import GROUP, VERSION
from .audits import (
    REQUEST_ANNOTATION,
    RESULT_LABEL,
    RUN_LABEL,
    SPARK_API,
    AuditRuns,
    Run,
    audit_name,
    result_of,
    spark_run,
)
from .objects import (
    EXTERNAL_LABEL,
    FIELD_MANAGER,
    RACK_ANNOTATION,
    RESTART_ANNOTATION,
    TEMPLATE_HASH,
    Claims,
    Role,
    cluster_id_secret_name,
)
from .observed import STUCK_REASONS, Observed, PodState, ServiceState, StatefulSetState

__all__ = ["Kube"]

_ROLES: dict[str, Role] = {"controller": "controller", "broker": "broker", "combined": "combined"}

log = logging.getLogger(__name__)


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self._dynamic: DynamicClient | None = None

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:  # discovery: once per process
            self._dynamic = DynamicClient(self.api)  # type: ignore[no-untyped-call]
        return self._dynamic

    def apply(self, document: Mapping[str, Any]) -> None:
        """Server-side apply under the operator's field manager, taking over fields another
        manager set (the operator's spec is the truth for the fields it writes)."""
        resource = self.dynamic.resources.get(
            api_version=document["apiVersion"], kind=document["kind"]
        )
        self.dynamic.server_side_apply(  # type: ignore[no-untyped-call]
            resource,
            body=dict(document),
            namespace=document["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )

    def cluster_id(self, namespace: str, name: str) -> str | None:
        """The cluster id in the cluster's Secret, if it has one."""
        try:
            secret = self.core.read_namespaced_secret(cluster_id_secret_name(name), namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        encoded = (secret.data or {}).get("cluster.id")
        return None if encoded is None else base64.b64decode(encoded).decode()

    def observe(self, namespace: str, name: str) -> Observed:
        """The cluster's StatefulSets, pods and Services, and the nodes its pods were
        scheduled to: their labels (spec.rack) and which are cordoned (a drain)."""
        selector = f"gregor.dev/cluster={name}"
        statefulsets: dict[Role, StatefulSetState] = {}
        found_sets: list[Any] = self.apps.list_namespaced_stateful_set(
            namespace, label_selector=selector
        ).items
        for found in found_sets:
            role = _ROLES.get((found.metadata.labels or {}).get("gregor.dev/pool", ""))
            if role is None:
                continue
            containers = found.spec.template.spec.containers or []
            statefulsets[role] = StatefulSetState(
                replicas=found.spec.replicas or 0,
                update_revision=found.status.update_revision if found.status else None,
                claims=_claims(found.spec.volume_claim_templates),
                template_hash=(found.metadata.annotations or {}).get(TEMPLATE_HASH),
                image=containers[0].image if containers else None,
            )
        pods = []
        now = datetime.datetime.now(datetime.UTC)
        found_pods: list[Any] = self.core.list_namespaced_pod(
            namespace, label_selector=selector
        ).items
        for pod in found_pods:
            role = _ROLES.get((pod.metadata.labels or {}).get("gregor.dev/pool", ""))
            if role is None or role not in statefulsets:
                continue
            ordinal = pod.metadata.name.rsplit("-", 1)[-1]
            if not ordinal.isdigit():
                continue
            pods.append(
                PodState(
                    name=pod.metadata.name,
                    pool=role,
                    ordinal=int(ordinal),
                    ready=_ready(pod),
                    running_for_s=_running_for(pod, now),
                    uid=pod.metadata.uid,
                    ready_for_s=_ready_for(pod, now),
                    ip=pod.status.pod_ip if pod.status else None,
                    host_ip=pod.status.host_ip if pod.status else None,
                    revision=(pod.metadata.labels or {}).get("controller-revision-hash"),
                    deleting=pod.metadata.deletion_timestamp is not None,
                    stuck=_stuck(pod),
                    last_error=_last_error(pod),
                    node=pod.spec.node_name if pod.spec else None,
                    rack=(pod.metadata.annotations or {}).get(RACK_ANNOTATION),
                    restart_requested=RESTART_ANNOTATION in (pod.metadata.annotations or {}),
                )
            )
        found_services: list[Any] = self.core.list_namespaced_service(
            namespace, label_selector=selector
        ).items
        services = {str(found.metadata.name): _service(found) for found in found_services}
        labels, cordoned, refused = self._nodes({pod.node for pod in pods if pod.node})
        properties: dict[Role, dict[str, str]] = {}
        found_maps: list[Any] = self.core.list_namespaced_config_map(
            namespace, label_selector=selector
        ).items
        for found in found_maps:
            role = _ROLES.get((found.metadata.labels or {}).get("gregor.dev/pool", ""))
            text = (found.data or {}).get("server.properties")
            if role is not None and text is not None:
                properties[role] = parse_properties(text)
        return Observed(
            statefulsets,
            sorted(pods, key=lambda p: (p.pool, p.ordinal)),
            services,
            labels,
            nodes_refused=refused,
            properties=properties,
            cordoned=cordoned,
        )

    def _nodes(
        self, names: set[str]
    ) -> tuple[dict[str, dict[str, str]], frozenset[str], str | None]:
        """The labels of these nodes, those that are cordoned, and what the API server said
        when it refused to show one (the operator lacks the ClusterRole rule to get nodes).
        A node that is gone is left out."""
        found: dict[str, dict[str, str]] = {}
        cordoned: set[str] = set()
        for name in sorted(names):
            try:
                node: Any = self.core.read_node(name)
            except ApiException as exc:
                if exc.status == 403:
                    refused = f"{exc.status} {exc.reason}: cannot get node {name}"
                    return found, frozenset(cordoned), refused
                if exc.status == 404:
                    continue
                raise
            found[name] = dict(node.metadata.labels or {})
            if node.spec is not None and node.spec.unschedulable:
                cordoned.add(name)
        return found, frozenset(cordoned), None

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Set annotations on one of the cluster's pods (its rack: spec.rack); a pod gone
        meanwhile is fine (its successor is told at the next reconciliation)."""
        body = {"metadata": {"annotations": dict(annotations)}}
        _unless_gone(lambda pod, ns: self.core.patch_namespaced_pod(pod, ns, body), name, namespace)

    def custom_object(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        """One of the operator's resources, None if there is none of that name."""
        try:
            found: Any = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found)

    def patch_annotations(
        self, plural: str, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set (or, with None, remove) annotations of one of the operator's resources."""
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            {"metadata": {"annotations": dict(annotations)}},
        )

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge `status` into the resource's status subresource."""
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, name, {"status": status}
        )

    def custom_objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        """Every one of the operator's resources of a kind in a namespace."""
        found: Any = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            GROUP, VERSION, namespace, plural
        )
        return [dict(item) for item in found.get("items", [])]

    def create(self, document: Mapping[str, Any]) -> bool:
        """Create an object unless one of its name exists (False then)."""
        resource = self.dynamic.resources.get(
            api_version=document["apiVersion"], kind=document["kind"]
        )
        try:
            resource.create(body=dict(document), namespace=document["metadata"].get("namespace"))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def audit_runs(self, namespace: str, cluster: str) -> AuditRuns:
        """The cluster's audit: its CronJob's Jobs and, where the API server serves them and
        the operator may list them, its SparkApplications, with their results (read after
        them, so a run seen finished has its result read too)."""
        selector = f"{RUN_LABEL}={cluster}"
        now = datetime.datetime.now(datetime.UTC)
        try:
            cron_job: Any = self.batch.read_namespaced_cron_job(audit_name(cluster), namespace)
            cron_job_uid = str(cron_job.metadata.uid)
        except ApiException as exc:
            if exc.status != 404:
                raise
            cron_job_uid = None
        jobs: list[Any] = self.batch.list_namespaced_job(namespace, label_selector=selector).items
        custom = client.CustomObjectsApi(self.api)
        group, version = SPARK_API.split("/")
        applications: list[dict[str, Any]] = []
        problem = None
        try:
            listed: Any = custom.list_namespaced_custom_object(
                group, version, namespace, "sparkapplications", label_selector=selector
            )
            applications = list(listed.get("items", []))
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            # 404: no Spark operator's CRDs; 403: the operator's rules lack them.
            problem = f"listing them answered {exc.status} {exc.reason}"
        maps: list[Any] = self.core.list_namespaced_config_map(
            namespace, label_selector=f"{selector},{RESULT_LABEL}=true"
        ).items
        results = {str(m.metadata.name): m.data for m in maps}
        runs = []
        for job in jobs:
            conditions = (job.status.conditions if job.status else None) or []
            ended = {c.type for c in conditions if c.status == "True"}
            finished = bool(ended & {"Complete", "Failed"})
            created = job.metadata.creation_timestamp
            runs.append(
                Run(
                    name=str(job.metadata.name),
                    created=created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    active=not finished and job.metadata.deletion_timestamp is None,
                    failed="Failed" in ended,
                    result=result_of(results.get(f"{job.metadata.name}-result")),
                    requested=REQUEST_ANNOTATION in (job.metadata.annotations or {}),
                    uid=str(job.metadata.uid),
                    age_s=(now - created).total_seconds(),
                )
            )
        for application in applications:
            name = str(application["metadata"]["name"])
            runs.append(
                spark_run(
                    application,
                    result_of(results.get(f"{name}-result")),
                    age_s=_age(application, now),
                )
            )
        if problem is not None:
            return AuditRuns(runs, cron_job_uid, spark_served=False, spark_problem=problem)
        try:
            scheduled: Any = custom.get_namespaced_custom_object(
                group, version, namespace, "scheduledsparkapplications", audit_name(cluster)
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return AuditRuns(runs, cron_job_uid, spark_served=True)
        return AuditRuns(
            runs,
            cron_job_uid,
            spark_served=True,
            scheduled_uid=str(scheduled["metadata"]["uid"]),
            scheduled_state=str((scheduled.get("status") or {}).get("scheduleState") or ""),
            scheduled_age_s=_age(scheduled, now),
        )

    def delete_schedule(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete the audit's other schedule (a CronJob or a ScheduledSparkApplication) and,
        in the background, its runs; one already gone is fine."""
        background = client.V1DeleteOptions(propagation_policy="Background")
        try:
            if kind == "CronJob":
                self.batch.delete_namespaced_cron_job(name, namespace, body=background)
            else:
                group, version = api_version.split("/")
                client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                    group, version, namespace, "scheduledsparkapplications", name, body=background
                )
        except ApiException as exc:
            # 403: an operator without the Spark operator's rules made none to delete.
            if exc.status not in (403, 404):
                raise

    def delete_spark_application(self, namespace: str, name: str) -> None:
        """Delete a run (its driver goes with it); one already gone is fine."""
        group, version = SPARK_API.split("/")
        custom = client.CustomObjectsApi(self.api)
        _unless_gone(
            lambda run, where: custom.delete_namespaced_custom_object(
                group, version, where, "sparkapplications", run
            ),
            name,
            namespace,
        )

    def delete_audit(self, namespace: str, cluster: str) -> None:
        """The cluster's audit is off: its CronJob (with its runs, and their pods) and its
        service account go; the reports' claim stays."""
        name = audit_name(cluster)
        background = client.V1DeleteOptions(propagation_policy="Background")
        rbac = client.RbacAuthorizationV1Api(self.api)
        self.delete_schedule(SPARK_API, "ScheduledSparkApplication", namespace, name)
        for delete in (
            self.batch.delete_namespaced_cron_job,
            rbac.delete_namespaced_role_binding,
            rbac.delete_namespaced_role,
            self.core.delete_namespaced_service_account,
        ):
            try:
                delete(name, namespace, body=background)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def delete_service(self, namespace: str, name: str) -> None:
        """Delete a Service the cluster no longer has; one already gone is fine."""
        _unless_gone(self.core.delete_namespaced_service, name, namespace)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Restart a pod (its StatefulSet makes it again); one already gone is fine."""
        _unless_gone(self.core.delete_namespaced_pod, name, namespace)


def _age(document: Mapping[str, Any], now: datetime.datetime) -> float:
    created = datetime.datetime.fromisoformat(document["metadata"]["creationTimestamp"])
    return (now - created).total_seconds()


def _unless_gone(delete: Callable[[str, str], Any], name: str, namespace: str) -> None:
    try:
        delete(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _service(service: Any) -> ServiceState:
    ports = (service.spec.ports if service.spec else None) or []
    balancer = service.status.load_balancer if service.status else None
    ingress = tuple(
        point.ip or point.hostname
        for point in (balancer.ingress if balancer else None) or []
        if point.ip or point.hostname
    )
    owners = [o.uid for o in service.metadata.owner_references or [] if o.controller]
    return ServiceState(
        listener=(service.metadata.labels or {}).get(EXTERNAL_LABEL),
        owner=owners[0] if owners else None,
        node_port=ports[0].node_port if ports else None,
        ingress=ingress,
    )


def _claims(templates: list[Any] | None) -> Claims:
    if not templates:
        return None
    spec = templates[0].spec
    requests = (spec.resources.requests or {}) if spec.resources else {}
    return str(requests.get("storage", "")), spec.storage_class_name


def _ready(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _running_for(pod: Any, now: datetime.datetime) -> float:
    """How long its container has been running; 0 when it is not."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    running = [c.state.running for c in statuses if c.state is not None and c.state.running]
    if not statuses or len(running) < len(statuses):
        return 0.0
    since = [r.started_at for r in running if r.started_at is not None]
    return max(0.0, (now - max(since)).total_seconds()) if since else 0.0


def _ready_for(pod: Any, now: datetime.datetime) -> float:
    """How long the pod has been ready: 0 when it is not. When Kubernetes does not say since
    when, long enough (nothing could ever be waited out otherwise). The kubelet's clock and
    the operator's may differ: a roll then waits that much more or less."""
    conditions = (pod.status.conditions if pod.status else None) or []
    for condition in conditions:
        if condition.type == "Ready" and condition.status == "True":
            since = condition.last_transition_time
            return max(0.0, (now - since).total_seconds()) if since is not None else float("inf")
    return 0.0


NODE_SAYS = "gregor: "
"""How `gregor` begins the line that says why it stopped (`broker/cli.py`)."""


def _last_error(pod: Any) -> str | None:
    """The line in which the pod's node said why it last refused to start: its container's
    termination message, the end of its log (`FallbackToLogsOnError`)."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    for container in statuses:
        for state in (container.state, container.last_state):
            terminated = state.terminated if state is not None else None
            message = terminated.message if terminated is not None else None
            said = [line for line in (message or "").splitlines() if line.startswith(NODE_SAYS)]
            if said:
                return said[-1].removeprefix(NODE_SAYS).strip()
    return None


def _stuck(pod: Any) -> str | None:
    status = pod.status
    if status is None:
        return None
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return "Unschedulable"
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in STUCK_REASONS:
            return str(waiting.reason)
    return None
