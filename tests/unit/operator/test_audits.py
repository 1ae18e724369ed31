"""The retention audit's decisions: the objects a `spec.retentionAudit` makes, when a requested
run starts (one per cluster at a time), and what each Topic's status shows of the results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gregor_audit.result import RESULT_ENV as WRITTEN_ENV
from gregor_audit.result import RESULT_KEY as WRITTEN_KEY
from gregor_audit.submit import APPLICATION as SUBMITTED_APPLICATION
from gregor_audit.submit import LOGGING as SUBMITTED_LOGGING
from gregor_audit.submit import REPORT_GROUP as SUBMITTED_GROUP
from gregor_audit.submit import RESULT_LABEL as WRITTEN_LABEL
from gregor_operator.audits import (
    APPLICATION,
    AUDIT_CONDITION,
    LOGGING,
    REPORT_GROUP,
    RESULT_ENV,
    RESULT_KEY,
    RESULT_LABEL,
    SPARK_VERSION,
    AuditPlan,
    AuditRuns,
    Run,
    TopicRef,
    plan_audits,
    result_of,
    spark_run,
)
from gregor_operator.models import KafkaCluster
from gregor_operator.objects import Target

pytestmark = pytest.mark.unit

TARGET = Target(namespace="kafka", name="gregor", uid="cluster-uid", cluster_id="c-id")
TOPICS = [
    TopicRef("orders", "orders", labels={"audit": "yes"}),
    TopicRef("payments", "payments.v1"),
]


def cluster(**audit: Any) -> KafkaCluster:
    return KafkaCluster.model_validate(
        {
            "metadata": {"name": "gregor"},
            "spec": {"combined": {"replicas": 1}, "retentionAudit": audit},
        }
    )


def planned(
    audit: dict[str, Any] | None = None,
    *,
    topics: list[TopicRef] = TOPICS,
    runs: list[Run] | None = None,
    request: str | None = None,
    status: dict[str, Any] | None = None,
    cron_job_uid: str | None = "cron-uid",
    spark_served: bool = False,
    scheduled_uid: str | None = None,
    scheduled_state: str = "Scheduled",
    scheduled_age_s: float = 60.0,
    target: Target = TARGET,
) -> AuditPlan:
    found = plan_audits(
        cluster(**(audit or {})),
        target,
        topics=topics,
        found=AuditRuns(
            runs or [],
            cron_job_uid,
            spark_served=spark_served,
            scheduled_uid=scheduled_uid,
            scheduled_state=scheduled_state,
            scheduled_age_s=scheduled_age_s,
        ),
        cluster_request=request,
        status=status or {},
        image="gregor-spark:dev",
        listener_port=9092,
    )
    assert found is not None
    return found


def _kind(found: AuditPlan, kind: str) -> dict[str, Any]:
    (document,) = [o for o in found.objects if o["kind"] == kind]
    return document


def _arguments(job_spec: dict[str, Any]) -> list[str]:
    (container,) = job_spec["template"]["spec"]["containers"]
    return list(container["args"])


def _audited(job_spec: dict[str, Any]) -> list[str]:
    line = _arguments(job_spec)
    audit = line[line.index("--", 1) + 1 :]
    return [audit[i + 1] for i, word in enumerate(audit) if word == "--topic"]


def result(*topics: tuple[str, str], at: str = "2026-11-27T18:00:00+00:00") -> dict[str, Any]:
    entries = {}
    for name, verdict in topics:
        findings = {"RecordsOlderThanMaxAge": 2} if verdict == "Violations" else {}
        entries[name] = {
            "verdict": verdict,
            "reason": "the topic does not exist" if verdict == "Error" else None,
            "oldest_record_age_s": 7200,
            "max_age_s": 3600.0,
            "findings": findings,
            "records_past_bound": 30 if findings else 0,
            "bytes_past_bound": 2100 if findings else 0,
        }
    return {"audited_at": at, "report": "/reports/r", "warnings": [], "topics": entries}


def test_the_operator_and_the_audit_agree_on_where_a_result_is() -> None:
    assert RESULT_KEY == WRITTEN_KEY
    assert RESULT_LABEL == WRITTEN_LABEL  # what Kube.audit_runs selects by


def test_a_cluster_without_an_audit_has_no_audit_objects() -> None:
    plain = KafkaCluster.model_validate(
        {"metadata": {"name": "gregor"}, "spec": {"combined": {"replicas": 1}}}
    )
    assert (
        plan_audits(
            plain,
            TARGET,
            topics=TOPICS,
            found=AuditRuns(),
            cluster_request=None,
            status={},
            image="i",
            listener_port=9092,
        )
        is None
    )


def test_an_audit_is_a_cron_job_under_a_service_account_with_only_sparks_rights() -> None:
    found = planned({"schedule": "0 3 * * *", "historyLimit": 2, "deadlineSeconds": 600})
    role = _kind(found, "Role")
    granted = {
        (g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted == {
        ("", "pods"),
        ("", "services"),
        ("", "configmaps"),
        ("", "persistentvolumeclaims"),
        ("networking.k8s.io", "networkpolicies"),
    }
    binding = _kind(found, "RoleBinding")
    assert binding["subjects"][0]["name"] == _kind(found, "ServiceAccount")["metadata"]["name"]
    cron = _kind(found, "CronJob")
    assert cron["metadata"]["ownerReferences"][0]["uid"] == "cluster-uid"
    spec = cron["spec"]
    assert spec["schedule"] == "0 3 * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["successfulJobsHistoryLimit"] == spec["failedJobsHistoryLimit"] == 2
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    assert job["activeDeadlineSeconds"] > 600  # the driver's own deadline comes first
    line = _arguments(job)
    assert line[:4] == ["--", "python", "-m", "gregor_audit.submit"]
    assert line[line.index("--deadline-seconds") + 1] == "600"
    assert line[line.index("--owner-job") + 1] == "$(JOB_NAME)"
    audit = line[line.index("--", 1) + 1 :]
    assert audit[:2] == ["--bootstrap-server", "gregor-bootstrap.kafka.svc.cluster.local:9092"]
    assert audit[audit.index("--output") + 1] == "/reports/$(JOB_NAME)"
    assert "--max-age" not in audit  # each topic is held to its own promise
    assert _audited(job) == ["orders", "payments.v1"]  # every Topic of the cluster, Kafka names
    assert found.claim is not None
    assert found.claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "ownerReferences" not in found.claim["metadata"]  # kept, as the nodes' claims are


def test_topics_are_chosen_by_name_and_by_label_and_reports_can_go_to_a_uri() -> None:
    found = planned(
        {"topics": ["legacy"], "topicSelector": {"audit": "yes"}, "maxAge": "30d",
         "reports": {"uri": "s3a://audits/gregor/"}}
    )  # fmt: skip
    job = _kind(found, "CronJob")["spec"]["jobTemplate"]["spec"]
    assert _audited(job) == ["legacy", "orders"]
    line = _arguments(job)
    assert line[line.index("--output") + 1] == "s3a://audits/gregor/$(JOB_NAME)"
    assert line[line.index("--max-age") + 1] == "30d"
    assert "--report-claim" not in line
    assert found.claim is None


def test_with_nothing_to_audit_the_schedule_is_suspended_and_the_status_says_why() -> None:
    found = planned({"topicSelector": {"audit": "never"}})
    assert _kind(found, "CronJob")["spec"]["suspend"] is True
    assert found.status["error"] == "no topic is selected for the audit"


def test_a_request_starts_a_run_owned_by_the_cron_job_once() -> None:
    found = planned(request="2026-11-27T18:00")
    assert found.job is not None
    owner = found.job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("CronJob", "cron-uid", True)
    assert _audited(found.job["spec"]) == ["orders", "payments.v1"]
    assert found.status["handledRequest"] == "2026-11-27T18:00"
    again = planned(request="2026-11-27T18:00", status=found.status)
    assert again.job is None
    same = planned(request="2026-11-27T18:00")
    assert same.job is not None
    assert same.job["metadata"]["name"] == found.job["metadata"]["name"]  # never two runs


def test_a_request_during_a_run_waits_for_it() -> None:
    running = [Run("gregor-audit-29400000", "2026-11-27T17:59:00Z", active=True)]
    topics = [TopicRef("orders", "orders", request="now"), TOPICS[1]]
    waiting = planned(request="r1", runs=running, topics=topics)
    assert waiting.job is None
    assert waiting.status["pending"] == ["KafkaCluster gregor", "Topic orders"]
    assert waiting.status["active"] == "gregor-audit-29400000"
    assert waiting.status["handledRequest"] is None
    assert not waiting.topics
    done = [Run("gregor-audit-29400000", "2026-11-27T17:59:00Z", active=False)]
    started = planned(request="r1", runs=done, topics=topics)
    assert started.job is not None
    assert started.status["pending"] is None
    (served,) = started.topics  # the cluster's run covers the topic's request
    assert served.status["handledRequest"] == "now"


def test_a_topics_request_audits_that_topic_alone() -> None:
    topics = [TopicRef("orders", "orders", request="now"), TOPICS[1]]
    found = planned(topics=topics)
    assert found.job is not None
    assert _audited(found.job["spec"]) == ["orders"]
    assert found.status["handledRequest"] is None


def test_no_run_is_made_before_the_cron_job_exists() -> None:
    assert planned(request="r1", cron_job_uid=None).job is None


def test_each_topic_shows_its_newest_result_with_a_condition_and_an_event_on_change() -> None:
    runs = [
        Run("gregor-audit-1", "2026-11-27T17:00:00Z", active=False,
            result=result(("orders", "Compliant"), ("payments.v1", "Compliant"))),
        Run("gregor-audit-r1", "2026-11-27T18:00:00Z", active=False,
            result=result(("orders", "Violations"))),
    ]  # fmt: skip
    found = planned(runs=runs)
    updates = {u.name: u for u in found.topics}
    orders = updates["orders"]
    assert orders.status["run"] == "gregor-audit-r1"
    assert orders.status["verdict"] == "Violations"
    assert orders.status["findings"] == [{"code": "RecordsOlderThanMaxAge", "count": 2}]
    assert orders.status["recordsPastBound"] == 30
    assert orders.status["oldestRecordAgeSeconds"] == 7200
    assert orders.condition is not None
    assert (orders.condition.type, orders.condition.status) == (AUDIT_CONDITION, "False")
    assert orders.event == (
        "Warning",
        "RetentionViolations",
        "gregor-audit-r1: Violations; RecordsOlderThanMaxAge",
    )
    payments = updates["payments"]
    assert payments.status["run"] == "gregor-audit-1"
    assert payments.condition is not None
    assert payments.condition.status == "True"
    assert found.status["lastRun"] == "gregor-audit-r1"
    assert found.shown["payments.v1"]["verdict"] == "Compliant"  # by Kafka name, for metrics
    assert found.shown["orders"]["recordsPastBound"] == 30


def test_a_result_already_shown_changes_nothing_and_the_same_verdict_tells_no_one() -> None:
    runs = [
        Run("r2", "2026-11-27T18:00:00Z", active=False, result=result(("orders", "Violations")))
    ]
    condition = [
        {
            "type": AUDIT_CONDITION,
            "status": "False",
            "reason": "Violations",
            "message": "RecordsOlderThanMaxAge",
        }
    ]
    shown = TopicRef("orders", "orders", status={"run": "r2", "verdict": "Violations"},
                     conditions=condition)  # fmt: skip
    assert planned(runs=runs, topics=[shown]).topics == []
    before = TopicRef("orders", "orders", status={"run": "r1", "verdict": "Violations"},
                      conditions=condition)  # fmt: skip
    (update,) = planned(runs=runs, topics=[before]).topics
    assert update.event is None


def test_a_run_that_judged_nothing_is_an_error_on_the_cluster_told_once() -> None:
    failed = {"error": "the cluster did not answer within 30s", "topics": {}}
    runs = [
        Run("r1", "2026-11-27T17:00:00Z", active=False, result=result(("orders", "Compliant"))),
        Run("r2", "2026-11-27T18:00:00Z", active=False, failed=True, result=failed),
    ]
    found = planned(runs=runs)
    assert found.status["error"] == "r2: the cluster did not answer within 30s"
    assert found.status["lastSuccessTime"] == "2026-11-27T18:00:00+00:00"
    assert [e[1] for e in found.events] == ["RetentionAuditFailed"]
    assert planned(runs=runs, status=found.status).events == []
    silent = [*runs, Run("r3", "2026-11-27T19:00:00Z", active=False, failed=True)]
    assert planned(runs=silent).status["error"].startswith("r3: the run failed without a result")


def test_a_results_configmap_is_read_or_ignored_when_unreadable() -> None:
    assert result_of({RESULT_KEY: '{"topics": {}}'}) == {"topics": {}}
    assert result_of({RESULT_KEY: "not json"}) is None
    assert result_of({}) is None
    assert result_of(None) is None


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({"schedule": "every day"}, "schedule"),
        ({"maxAge": "30 days"}, "maxAge"),
        ({"reports": {"uri": "s3a://b/p", "size": "1Gi"}}, "either a claim"),
        ({"executors": {"instances": 0}}, "instances"),
        ({"driver": {"memory": "1GB"}}, "memory"),
    ],
)
def test_an_invalid_audit_is_refused_naming_the_field(audit: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        cluster(**audit)


def test_a_condition_that_does_not_say_what_the_status_says_is_written_again() -> None:
    runs = [
        Run("r2", "2026-11-27T18:00:00Z", active=False, result=result(("orders", "Violations")))
    ]
    stale = [{"type": AUDIT_CONDITION, "status": "True", "reason": "Compliant", "message": ""}]
    topic = TopicRef(
        "orders", "orders", status={"run": "r2", "verdict": "Violations"}, conditions=stale
    )
    (update,) = planned(runs=runs, topics=[topic]).topics
    assert update.condition is not None
    assert update.condition.status == "False"


def test_a_topic_judged_by_a_run_that_is_gone_still_shows_in_the_metrics() -> None:
    kept = {"run": "r1", "verdict": "Violations", "recordsPastBound": 3}
    found = planned(topics=[TopicRef("orders", "orders", status=kept), TOPICS[1]])
    assert found.shown == {"orders": kept}


def test_while_a_requested_run_is_active_the_schedule_is_held() -> None:
    def held(found: AuditPlan) -> bool:
        return bool(_kind(found, "CronJob")["spec"]["suspend"])

    requested = Run("gregor-audit-r1", "2026-11-27T18:00:00Z", active=True, requested=True)
    scheduled = Run("gregor-audit-2940", "2026-11-27T18:00:00Z", active=True)
    assert held(planned(runs=[requested]))
    assert held(planned(request="now"))  # the run about to start
    assert not held(planned(runs=[scheduled]))  # Forbid covers the CronJob's own runs
    assert not held(planned(runs=[Run("gregor-audit-r1", "2026-11-27T18:00:00Z", False)]))
    owner = planned(request="now").job["metadata"]["ownerReferences"][0]  # type: ignore[index]
    assert owner["blockOwnerDeletion"] is False


def test_a_topic_asked_for_beside_the_cluster_is_audited_even_if_not_selected() -> None:
    topics = [TopicRef("orders", "orders", labels={"audit": "yes"}),
              TopicRef("payments", "payments.v1", request="now")]  # fmt: skip
    found = planned({"topicSelector": {"audit": "yes"}}, topics=topics, request="r1")
    assert found.job is not None
    assert _audited(found.job["spec"]) == ["orders", "payments.v1"]


def test_a_cluster_name_too_long_for_the_cron_job_is_refused_once() -> None:
    target = Target(namespace="kafka", name="c" * 47, uid="u", cluster_id="c-id")
    found = plan_audits(
        cluster(), target, topics=TOPICS, found=AuditRuns(), cluster_request="now",
        status={}, image="i", listener_port=9092,
    )  # fmt: skip
    assert found is not None
    assert found.objects == []
    assert found.job is None
    assert "at most 52" in found.status["error"]
    assert [e[1] for e in found.events] == ["InvalidSpec"]


# -- the Kubeflow Spark Operator's launches ------------------------------------------------------


def spark_app(
    name: str,
    state: str | None,
    *,
    age_s: float = 60.0,
    requested: bool = False,
    error: str | None = None,
) -> Run:
    application: dict[str, Any] = {
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "creationTimestamp": f"2026-11-27T18:{len(name):02d}:00Z",
            "annotations": {"gregor.dev/audit-request": "x"} if requested else {},
        }
    }
    if state is not None:
        application["status"] = {"applicationState": {"state": state, "errorMessage": error}}
    return spark_run(application, None, age_s=age_s)


def test_the_operator_and_the_image_agree_on_the_application_and_its_result() -> None:
    assert APPLICATION == SUBMITTED_APPLICATION
    assert LOGGING == SUBMITTED_LOGGING
    assert RESULT_ENV == WRITTEN_ENV
    assert REPORT_GROUP == SUBMITTED_GROUP
    pinned = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    assert f"pyspark=={SPARK_VERSION}" in pinned


def test_where_the_spark_operator_runs_auto_launches_a_scheduled_spark_application() -> None:
    found = planned(
        {"topics": ["orders"], "historyLimit": 2, "reports": {"size": "2Gi"}},
        spark_served=True,
        scheduled_uid="s-uid",
        cron_job_uid="cron-uid",
    )
    assert [o["kind"] for o in found.objects] == [
        "ServiceAccount", "Role", "RoleBinding", "ScheduledSparkApplication",
    ]  # fmt: skip
    assert found.retired == [("batch/v1", "CronJob", "gregor-audit")]  # with its Jobs
    assert found.status["launcher"] == "SparkApplication"
    scheduled = _kind(found, "ScheduledSparkApplication")
    assert "gregor.dev/cluster" not in scheduled["metadata"]["labels"]  # its runs' pods get them
    spec = scheduled["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"]) == ("Forbid", False)
    assert spec["successfulRunHistoryLimit"] == spec["failedRunHistoryLimit"] == 2
    template = spec["template"]
    assert template["mainApplicationFile"] == APPLICATION
    assert template["mode"] == "cluster"
    arguments = template["arguments"]
    assert arguments[arguments.index("--output") + 1] == "/reports/$(GREGOR_RUN)"
    assert arguments[arguments.index("--topic") + 1] == "orders"
    driver, executor = template["driver"], template["executor"]
    assert driver["serviceAccount"] == "gregor-audit"
    assert {"name": "report", "mountPath": "/reports"} in executor["volumeMounts"]
    assert executor["podSecurityContext"]["fsGroup"] == REPORT_GROUP
    target = json.loads(driver["envVars"][RESULT_ENV])
    assert target["owner"] == {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
    }
    assert "name" not in target  # the driver's pod names its run
    run = [e for e in driver["env"] if e["name"] == "GREGOR_RUN"]
    assert run[0]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['sparkoperator.k8s.io/app-name']"
    )
    assert template["volumes"] == [
        {"name": "report", "persistentVolumeClaim": {"claimName": "gregor-audit-reports"}}
    ]


def test_a_job_launcher_retires_the_scheduled_spark_application() -> None:
    found = planned({"launcher": "Job"}, spark_served=True, scheduled_uid="s-uid")
    assert found.retired == [
        ("sparkoperator.k8s.io/v1beta2", "ScheduledSparkApplication", "gregor-audit")
    ]
    assert [o["kind"] for o in found.objects][-1] == "CronJob"
    assert _kind(found, "CronJob")["spec"]["suspend"] is False
    plain = planned(spark_served=False)  # Auto without the Spark operator's CRDs: Jobs only
    assert plain.status["launcher"] == "Job"
    assert [o["kind"] for o in plain.objects][-1] == "CronJob"
    assert plain.retired == []


def test_auto_keeps_jobs_until_a_spark_operator_takes_up_the_schedule() -> None:
    """CRDs are cluster-wide; a Spark operator watches the namespaces it is told to. Under Auto
    an untaken schedule gives way back to Jobs, and stays there for one to take up."""
    early = planned(
        spark_served=True, scheduled_uid="s-uid", scheduled_state="", scheduled_age_s=30
    )
    assert early.status["launcher"] == "SparkApplication"
    untaken = planned(
        spark_served=True, scheduled_uid="s-uid", scheduled_state="", scheduled_age_s=301
    )
    assert untaken.status["launcher"] == "Job"
    assert (
        "no Spark operator has taken up ScheduledSparkApplication gregor-audit"
        in (untaken.status["note"])
    )
    assert [o["kind"] for o in untaken.objects][-2:] == ["ScheduledSparkApplication", "CronJob"]
    assert untaken.retired == []
    assert untaken.status["error"] is None
    # Asked for by name, an untaken schedule is an error (unless the audit is suspended).
    asked = planned(
        {"launcher": "SparkApplication"},
        spark_served=True,
        scheduled_uid="s-uid",
        scheduled_state="",
        scheduled_age_s=301,
    )
    assert asked.status["launcher"] == "SparkApplication"
    assert "watching namespace kafka" in asked.status["error"]
    assert asked.events[0][1] == "RetentionAuditFailed"


def test_auto_keeps_jobs_for_a_cluster_name_too_long_for_spark_applications() -> None:
    long = Target(namespace="kafka", name="g" * 31, uid="u", cluster_id="c")
    found = planned(spark_served=True, target=long)
    assert found.status["launcher"] == "Job"
    assert [o["kind"] for o in found.objects][-1] == "CronJob"


def test_asking_for_spark_applications_where_none_are_served_is_an_error_naming_the_fix() -> None:
    found = planned({"launcher": "SparkApplication"})
    assert found.objects == []
    assert found.job is None
    assert "does not serve them" in found.status["error"]
    assert found.events[0][1] == "InvalidSpec"
    again = planned({"launcher": "SparkApplication"}, status=found.status)
    assert again.events == []  # said once


def test_asking_for_spark_applications_by_name_too_long_is_refused() -> None:
    long = Target(namespace="kafka", name="g" * 31, uid="u", cluster_id="c")
    found = planned({"launcher": "SparkApplication"}, spark_served=True, target=long)
    assert found.objects == []
    assert "at most 36" in found.status["error"]
    assert "launcher: Job" in found.status["error"]


def test_a_request_becomes_a_spark_application_of_the_schedule_and_waits_for_a_running_one() -> (
    None
):
    running = [spark_app("gregor-audit-1", "RUNNING")]
    busy = planned(request="now", spark_served=True, scheduled_uid="s-uid", runs=running)
    assert busy.job is None
    assert busy.status["pending"] == ["KafkaCluster gregor"]
    assert busy.status["active"] == "gregor-audit-1"
    done = [spark_app("gregor-audit-1", "COMPLETED")]
    free = planned(request="now", spark_served=True, scheduled_uid="s-uid", runs=done)
    job = free.job
    assert job is not None
    assert job["kind"] == "SparkApplication"
    metadata = job["metadata"]
    # Labelled and owned as the schedule's own runs, so Forbid holds the schedule meanwhile and
    # the history limits take it in turn; the schedule is held too, as the Spark operator's
    # cache may not have the request yet.
    assert metadata["labels"]["sparkoperator.k8s.io/scheduled-app-name"] == "gregor-audit"
    assert metadata["ownerReferences"][0]["uid"] == "s-uid"
    assert _kind(free, "ScheduledSparkApplication")["spec"]["suspend"] is True
    after = planned(spark_served=True, scheduled_uid="s-uid", runs=done)
    assert _kind(after, "ScheduledSparkApplication")["spec"]["suspend"] is False
    assert planned(request="now", spark_served=True).job is None  # no schedule to own it yet


def test_a_spark_application_nobody_takes_up_says_where_to_look() -> None:
    found = planned(
        spark_served=True,
        scheduled_uid="s-uid",
        runs=[spark_app("gregor-audit-1", None, age_s=301)],
    )
    assert "no Spark operator has taken it up" in found.status["error"]
    assert "namespace kafka" in found.status["error"]
    soon = planned(spark_served=True, runs=[spark_app("gregor-audit-1", None, age_s=30)])
    assert soon.status["error"] is None


def test_a_failed_spark_application_shows_the_spark_operators_reason_shortened() -> None:
    failed = spark_app("gregor-audit-1", "FAILED", error="driver container failed with ExitCode: 1")
    found = planned(spark_served=True, runs=[failed])
    assert found.status["error"] == (
        "gregor-audit-1: driver container failed with ExitCode: 1 (see its pods' logs)"
    )
    assert found.events == [("Warning", "RetentionAuditFailed", found.status["error"])]
    stderr = (
        "failed to run spark-submit: " + "WARNING: noise\n" * 500 + "Forbidden: networkpolicies"
    )
    long = planned(spark_served=True, runs=[spark_app("gregor-audit-1", "FAILED", error=stderr)])
    assert len(long.status["error"]) < 700
    assert long.status["error"].startswith("gregor-audit-1: failed to run spark-submit")
    assert "Forbidden: networkpolicies" in long.status["error"]


def test_a_spark_application_that_ends_without_a_result_names_the_webhook() -> None:
    found = planned(spark_served=True, runs=[spark_app("gregor-audit-1", "COMPLETED")])
    assert "ended without a result" in found.status["error"]
    assert "webhook" in found.status["error"]


def test_an_overdue_spark_application_is_stopped_with_a_result_saying_so() -> None:
    audit = {"deadlineSeconds": 600}
    late = spark_app("gregor-audit-1", "RUNNING", age_s=600 + 121)
    (stop,) = planned(audit, spark_served=True, runs=[late]).stops
    assert stop.driver == "gregor-audit-1-driver"
    assert stop.result is not None
    metadata = stop.result["metadata"]
    assert metadata["name"] == "gregor-audit-1-result"
    assert metadata["labels"][RESULT_LABEL] == "true"
    assert metadata["ownerReferences"][0]["uid"] == "gregor-audit-1-uid"
    assert "past its deadline (600 s)" in json.loads(stop.result["data"][RESULT_KEY])["error"]
    on_time = spark_app("gregor-audit-1", "RUNNING", age_s=600)
    assert planned(audit, spark_served=True, runs=[on_time]).stops == []


def test_an_overdue_run_is_stopped_even_after_its_result_and_an_untaken_one_is_deleted() -> None:
    audit = {"deadlineSeconds": 600}
    hung = Run(
        "gregor-audit-1", "2026-11-27T18:00:00Z", active=True,
        result=result(("orders", "Compliant")), kind="SparkApplication", uid="u", age_s=800,
        state="RUNNING",
    )  # fmt: skip
    (stop,) = planned(audit, spark_served=True, runs=[hung]).stops
    assert stop.driver == "gregor-audit-1-driver"
    assert stop.result is None  # its own result stays
    untaken = spark_app("gregor-audit-2", None, age_s=800)
    (stop,) = planned(audit, spark_served=True, runs=[untaken]).stops
    assert stop.driver is None  # no driver: the run itself goes
    assert stop.result is not None
    assert "no Spark operator took the run up" in stop.result["data"][RESULT_KEY]


def test_finished_spark_applications_past_the_history_limit_are_pruned_per_outcome() -> None:
    runs = [
        spark_app("gregor-audit-a", "COMPLETED"),
        spark_app("gregor-audit-bb", "COMPLETED"),
        spark_app("gregor-audit-ccc", "FAILED"),
        spark_app("gregor-audit-dddd", "RUNNING"),
    ]
    assert planned({"historyLimit": 1}, spark_served=True, runs=runs).pruned == ["gregor-audit-a"]
    assert planned({"historyLimit": 2}, spark_served=True, runs=runs).pruned == []


def test_the_time_of_the_last_success_outlives_the_runs() -> None:
    before = {"lastSuccessTime": "2026-11-26T03:00:00+00:00"}
    assert planned(status=before).status["lastSuccessTime"] == before["lastSuccessTime"]
    newer = Run("r2", "2026-11-27T03:00:00Z", active=False, result=result(("orders", "Compliant")))
    shown = planned(status=before, runs=[newer]).status["lastSuccessTime"]
    assert shown == "2026-11-27T18:00:00+00:00"
