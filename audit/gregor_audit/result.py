"""A run's result for the operator: a compact summary in a ConfigMap the driver writes.

When the operator launches the audit on Kubernetes, the report (`summary.json` and the Parquet
detail) lands on a volume claim or a Hadoop URI the operator cannot read. So the driver also
writes what the operator needs — each topic's verdict, reason, oldest record's age, finding
codes and counts — into a ConfigMap owned by the run's Job (it goes with the Job when the
CronJob's history limit removes it), or, when the audit could not run at all, why. The
submitter (gregor_audit.submit) passes the ConfigMap's name, labels and owner in the driver's
environment, `RESULT_ENV`, as JSON; without it nothing is written (the command line, a laptop).

What it owns: the compact result's shape (`compact`, `failure`) and writing it. What it must
never do: stop the audit's own outcome from being reported (a result that cannot be written
is logged, not raised).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AGE_CODES",
    "RESULT_ENV",
    "RESULT_KEY",
    "compact",
    "config_map",
    "failure",
    "pod_owner",
    "publish",
]

RESULT_ENV = "GREGOR_AUDIT_RESULT"
"""`{"name": …, "namespace": …, "labels": {…}, "owner": {"apiVersion", "kind", "name", "uid"}}`.
Without the owner's name and uid (a SparkApplication's template cannot know them), the owner
is the driver pod's own of that kind (the Kubeflow Spark Operator's webhook sets it; the pod is
`GREGOR_POD_NAME`), and the ConfigMap is `<owner>-result`."""
POD_ENV = "GREGOR_POD_NAME"
RESULT_KEY = "result.json"
AGE_CODES = frozenset(
    {"RecordsOlderThanMaxAge", "CompactionBacklog", "TombstonesPastDeleteRetention"}
)
"""The findings of records readable past their bound; their records and bytes are a topic's
`records_past_bound` and `bytes_past_bound`."""

log = logging.getLogger("gregor.audit")


def compact(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator shows of a finished run, from the run's summary: small enough for a
    ConfigMap with thousands of topics (no per-partition finding)."""
    topics = {}
    for name, report in summary["topics"].items():
        findings = report.get("findings", [])
        codes: dict[str, int] = {}
        for finding in findings:
            codes[finding["code"]] = codes.get(finding["code"], 0) + 1
        past = [f for f in findings if f["code"] in AGE_CODES]
        topics[name] = {
            "verdict": report["verdict"],
            "reason": report.get("reason"),
            "oldest_record_age_s": report.get("oldest_record_age_s"),
            "max_age_s": report.get("max_age_s"),
            "findings": codes,
            "records_past_bound": sum(int(f["records"]) for f in past),
            "bytes_past_bound": sum(int(f["bytes"]) for f in past),
        }
    return {
        "audited_at": summary["audited_at"],
        "report": summary["report"],
        "warnings": list(summary.get("warnings", [])),
        "topics": topics,
    }


def failure(reason: str) -> dict[str, Any]:
    """The result of a run that judged nothing: why (the line the command printed)."""
    return {"error": reason, "topics": {}}


def config_map(target: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The ConfigMap that carries `result`, as `target` (from `RESULT_ENV`, its owner known)
    names it."""
    owner = target.get("owner")
    metadata: dict[str, Any] = {
        "name": target.get("name") or f"{(owner or {})['name']}-result",
        "namespace": target["namespace"],
        "labels": dict(target.get("labels") or {}),
    }
    if owner:
        metadata["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["name"],
                "uid": owner["uid"],
                "blockOwnerDeletion": False,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {RESULT_KEY: json.dumps(result, sort_keys=True)},
    }


def pod_owner(pod: Any, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The owner the pod (a kubernetes V1Pod) has of `owner`'s apiVersion and kind."""
    for reference in pod.metadata.owner_references or []:
        if (reference.api_version, reference.kind) == (owner["apiVersion"], owner["kind"]):
            return dict(owner) | {"name": reference.name, "uid": reference.uid}
    raise LookupError(
        f"the driver pod {pod.metadata.name} has no {owner['kind']} owner: the Kubeflow Spark "
        "Operator's webhook gives it one (is the webhook enabled?)"
    )


def publish(result: Mapping[str, Any], environment: Mapping[str, str] | None = None) -> bool:
    """Write `result` where `RESULT_ENV` says (replacing a result of the same name); False
    when there is nowhere to write it or it could not be written."""
    given = (os.environ if environment is None else environment).get(RESULT_ENV)
    if not given:
        return False
    try:
        target = json.loads(given)
        from kubernetes import client, config  # noqa: PLC0415 - only a pod needs it

        config.load_incluster_config()  # type: ignore[no-untyped-call]
        core: Any = client.CoreV1Api()
        owner = target.get("owner")
        if owner and not owner.get("uid"):
            here = (os.environ if environment is None else environment).get(POD_ENV)
            pod = core.read_namespaced_pod(here or socket.gethostname(), target["namespace"])
            target["owner"] = pod_owner(pod, owner)
        document = config_map(target, result)
        name = document["metadata"]["name"]
        try:
            core.create_namespaced_config_map(target["namespace"], document)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_config_map(name, target["namespace"], document)
    except Exception as exc:  # the audit's outcome is printed anyway; the operator sees none
        log.error("the run's result could not be written for the operator: %s", exc)
        return False
    return True
