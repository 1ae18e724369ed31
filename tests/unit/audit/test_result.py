"""What the operator reads of a run: each topic's verdict, codes and counts, small enough for a
ConfigMap, in a ConfigMap owned by the run's Job; and nothing written outside Kubernetes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gregor_audit.result import (
    RESULT_ENV,
    RESULT_KEY,
    compact,
    config_map,
    failure,
    pod_owner,
    publish,
)

pytestmark = pytest.mark.unit

SUMMARY = {
    "audited_at": "2026-11-27T18:00:00+00:00",
    "report": "/reports/run-1",
    "warnings": ["broker 2 did not report its log dirs"],
    "topics": {
        "aged": {
            "verdict": "Violations",
            "oldest_record_age_s": 86_400,
            "max_age_s": 3600.0,
            "records": 30,
            "findings": [
                {"code": "RecordsOlderThanMaxAge", "partition": 0, "records": 10, "bytes": 700},
                {"code": "RecordsOlderThanMaxAge", "partition": 1, "records": 5, "bytes": 350},
                {"code": "FutureTimestamps", "partition": 1, "records": 2, "bytes": 140},
            ],
        },
        "missing": {
            "verdict": "Error",
            "reason": "the topic does not exist",
            "oldest_record_age_s": None,
            "findings": [],
        },
    },
}


def test_a_summary_becomes_verdicts_codes_and_counts_past_the_bound() -> None:
    result = compact(SUMMARY)
    assert result["topics"]["aged"] == {
        "verdict": "Violations",
        "reason": None,
        "oldest_record_age_s": 86_400,
        "max_age_s": 3600.0,
        "findings": {"RecordsOlderThanMaxAge": 2, "FutureTimestamps": 1},
        "records_past_bound": 15,
        "bytes_past_bound": 1050,
    }
    assert result["topics"]["missing"]["reason"] == "the topic does not exist"
    assert result["report"] == "/reports/run-1"
    assert result["warnings"] == SUMMARY["warnings"]


def test_the_result_configmap_is_owned_by_the_run_and_labelled() -> None:
    target = {
        "name": "run-1-result",
        "namespace": "kafka",
        "labels": {"gregor.dev/cluster": "c"},
        "owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "run-1", "uid": "u-1"},
    }
    document = config_map(target, failure("the cluster did not answer"))
    assert document["metadata"]["ownerReferences"][0] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "run-1",
        "uid": "u-1",
        "blockOwnerDeletion": False,
    }
    assert document["metadata"]["labels"] == {"gregor.dev/cluster": "c"}
    assert json.loads(document["data"][RESULT_KEY]) == {
        "error": "the cluster did not answer",
        "topics": {},
    }


def test_nothing_is_written_when_no_operator_launched_the_run() -> None:
    assert publish(compact(SUMMARY), {}) is False
    assert publish(compact(SUMMARY), {RESULT_ENV: ""}) is False


def _pod(*owners: tuple[str, str, str, str]) -> Any:
    from kubernetes import client  # noqa: PLC0415

    references = [
        client.V1OwnerReference(api_version=a, kind=k, name=n, uid=u) for a, k, n, u in owners
    ]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="audit-123-driver", owner_references=references)
    )


SPARK_APPLICATION = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication"}


def test_a_spark_applications_result_is_owned_by_the_driver_pods_application() -> None:
    """A SparkApplication's template cannot name the run: the driver's pod does (the Spark
    operator's webhook makes it the application's), and the result is `<run>-result`."""
    pod = _pod(
        ("v1", "ConfigMap", "other", "u-0"),
        ("sparkoperator.k8s.io/v1beta2", "SparkApplication", "audit-123", "u-9"),
    )
    owner = pod_owner(pod, SPARK_APPLICATION)
    target = {"namespace": "kafka", "labels": {}, "owner": owner}
    document = config_map(target, failure("x"))
    assert document["metadata"]["name"] == "audit-123-result"
    assert document["metadata"]["ownerReferences"] == [
        SPARK_APPLICATION | {"name": "audit-123", "uid": "u-9", "blockOwnerDeletion": False}
    ]


def test_a_driver_pod_without_its_application_says_the_webhook_gives_it_one() -> None:
    with pytest.raises(
        LookupError, match=r"audit-123-driver has no SparkApplication owner.*webhook"
    ):
        pod_owner(_pod(), SPARK_APPLICATION)
