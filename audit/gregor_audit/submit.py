"""Submitting the audit to Kubernetes: `spark-submit --deploy-mode cluster`, from a pod.

What it owns: the spark-submit command line that runs the audit as a Spark application on the
Kubernetes cluster this pod runs in (the driver and its executors are pods, started from the
`gregor-spark` image under the service account given), and the driver's pod template. The
template makes the driver owned by the Job that submitted it, so that deleting the Job (with
background or foreground propagation, as kubectl does) deletes the driver and, through Spark's
own owner references, its executors; and it bounds the driver's life with the run's deadline,
which the Job's own deadline does not reach. The driver and executor pods carry the run's
labels, and the executors are named after the run. The report goes to a volume claim mounted on
the driver and executors, or to a Hadoop URI.

    python -m gregor_audit.submit --image IMAGE --service-account SA --name NAME \\
        [--namespace NS] [--label K=V …] [--owner-job NAME --owner-uid UID] \\
        [--deadline-seconds S] [--driver-cores N --driver-memory M --executors N \\
         --executor-cores N --executor-memory M] [--driver-request-cores CPU] \\
        [--executor-request-cores CPU] [--report-claim CLAIM --report-mount DIR] \\
        [--pull-policy POLICY] -- <gregor audit retention arguments>

`--namespace` defaults to this pod's own; an owner must be in it (an owner reference never
crosses namespaces: the collector would delete the driver at once). `--owner-job` and
`--owner-uid` go together.

What it must never do: decide what is audited (the arguments after `--` are the command's), or
leave a driver that nothing owns when it was told who owns it.

spark-submit waits for the driver but exits 0 however the driver ended; so the submitter, when
it has an owner, then reads the driver pod (`<owner-job>-driver`) and exits with its exit code,
and the Job fails when the audit did. The driver leaves its result for the operator in the
ConfigMap `<owner-job>-result` (gregor_audit.result); a driver that died before it could (out of
memory, past its deadline) gets one from the submitter saying so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "APPLICATION",
    "LOGGING",
    "RESULT_LABEL",
    "Submission",
    "driver_outcome",
    "driver_template",
    "executor_template",
    "main",
    "spark_submit",
]

APPLICATION = "local:///opt/gregor/retention_audit.py"
"""The audit as spark-submit's Python application, inside the `gregor-spark` image."""
MASTER = "k8s://https://kubernetes.default.svc:443"
LOGGING = "/opt/gregor/log4j2.properties"
"""The audit's logging for Spark's JVMs (warnings and errors), inside the image."""
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
log = logging.getLogger("gregor.audit")
_REPORT_VOLUME = "report"
RESULT_LABEL = "gregor.dev/audit-result"
"""On a run's result ConfigMap (value `true`), beside the run's own labels."""
DRIVER_CONTAINER = "spark-kubernetes-driver"
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_LIMIT = 47
"""Spark's limit on an executor pod name prefix: the executors are named `<name>-exec-<n>`."""


@dataclass(frozen=True, slots=True)
class Submission:
    namespace: str
    image: str
    service_account: str
    name: str
    """The application's name: its pods are named after it (DNS-1123)."""
    audit_arguments: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_job: str | None = None
    owner_uid: str | None = None
    driver_cores: int = 1
    driver_memory: str = "1g"
    executors: int = 1
    executor_cores: int = 1
    executor_memory: str = "1g"
    driver_request_cores: str | None = None
    """The CPU the driver's pod asks the scheduler for; `driver_cores` if None."""
    executor_request_cores: str | None = None
    report_claim: str | None = None
    report_mount: str = "/reports"
    pull_policy: str = "IfNotPresent"
    deadline_seconds: int | None = None
    """How long the driver may run (its pod's `activeDeadlineSeconds`)."""

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.name) or len(self.name) > _NAME_LIMIT:
            raise ValueError(
                f"--name {self.name!r}: pods are named after it, so it must be a DNS-1123 label "
                f"of at most {_NAME_LIMIT} characters (lower case letters, digits and '-')"
            )
        if (self.owner_job is None) != (self.owner_uid is None):
            raise ValueError("--owner-job and --owner-uid go together")

    @property
    def driver_pod(self) -> str:
        return f"{self.owner_job or self.name}-driver"

    @property
    def result(self) -> dict[str, object] | None:
        """Where the driver leaves the run's result (gregor_audit.result): with an owner only,
        which the result is owned by."""
        if self.owner_job is None:
            return None
        return {
            "name": f"{self.owner_job}-result",
            "namespace": self.namespace,
            "labels": {**self.labels, RESULT_LABEL: "true"},
            "owner": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": self.owner_job,
                "uid": self.owner_uid,
            },
        }


def executor_prefix(submission: Submission) -> str:
    """The executors' name prefix: the run's (its Job's) name, shortened with a hash of the
    whole when longer than Spark allows, so that two runs' executors never share a name."""
    name = submission.owner_job or submission.name
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _NAME_LIMIT - 9].rstrip('-')}-{digest}"


REPORT_GROUP = 10001
"""The image's `gregor` group: a report claim's files belong to it (the pods' `fsGroup`), so the
image's user can write a claim whatever owner its volume plugin gives a new volume."""


def _report_access(submission: Submission) -> dict[str, object]:
    if submission.report_claim is None:
        return {}
    return {"securityContext": {"fsGroup": REPORT_GROUP, "fsGroupChangePolicy": "OnRootMismatch"}}


def driver_template(submission: Submission) -> dict[str, object] | None:
    """The driver's pod template: owned by the submitting Job, bounded by the run's deadline,
    and able to write the report claim (None: nothing to say)."""
    if (
        submission.owner_job is None
        and submission.deadline_seconds is None
        and submission.report_claim is None
    ):
        return None
    metadata: dict[str, object] = {}
    if submission.owner_job is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": submission.owner_job,
                "uid": submission.owner_uid,
                "blockOwnerDeletion": False,
            }
        ]
    spec: dict[str, object] = {"containers": [{"name": DRIVER_CONTAINER}]}
    spec |= _report_access(submission)
    if submission.deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = submission.deadline_seconds
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def executor_template(submission: Submission) -> dict[str, object] | None:
    """The executors' pod template: able to write the report claim (None: no claim)."""
    if submission.report_claim is None:
        return None
    spec: dict[str, object] = {"containers": [{"name": EXECUTOR_CONTAINER}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": spec | _report_access(submission),
    }


def spark_submit(
    submission: Submission, template: Path | None, executors: Path | None = None
) -> list[str]:
    """The spark-submit command line (`template`, `executors`: the driver's and the executors'
    pod template files, if any)."""
    conf: dict[str, str] = {
        "spark.kubernetes.namespace": submission.namespace,
        "spark.kubernetes.container.image": submission.image,
        "spark.kubernetes.container.image.pullPolicy": submission.pull_policy,
        "spark.kubernetes.authenticate.driver.serviceAccountName": submission.service_account,
        "spark.kubernetes.authenticate.submission.caCertFile": str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        "spark.kubernetes.authenticate.submission.oauthTokenFile": str(
            SERVICE_ACCOUNT_DIR / "token"
        ),
        "spark.kubernetes.submission.waitAppCompletion": "true",
        "spark.kubernetes.driver.pod.name": submission.driver_pod,
        "spark.kubernetes.driver.service.deleteOnTermination": "true",
        "spark.kubernetes.executor.deleteOnTermination": "true",
        "spark.driver.cores": str(submission.driver_cores),
        "spark.driver.memory": submission.driver_memory,
        "spark.executor.instances": str(submission.executors),
        "spark.executor.cores": str(submission.executor_cores),
        "spark.executor.memory": submission.executor_memory,
        "spark.ui.enabled": "false",
        "spark.sql.debug.maxToStringFields": "200",
        # Named after the run (the owning Job), so that two runs' executors never share a name.
        "spark.kubernetes.executor.podNamePrefix": executor_prefix(submission),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOGGING}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOGGING}",
    }
    if submission.driver_request_cores is not None:
        conf["spark.kubernetes.driver.request.cores"] = submission.driver_request_cores
    if submission.executor_request_cores is not None:
        conf["spark.kubernetes.executor.request.cores"] = submission.executor_request_cores
    for key, value in submission.labels.items():
        conf[f"spark.kubernetes.driver.label.{key}"] = value
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    if submission.result is not None:
        from gregor_audit.result import RESULT_ENV  # noqa: PLC0415

        conf[f"spark.kubernetes.driverEnv.{RESULT_ENV}"] = json.dumps(
            submission.result, separators=(",", ":"), sort_keys=True
        )
    if submission.report_claim is not None:
        for role in ("driver", "executor"):
            prefix = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim.{_REPORT_VOLUME}"
            conf[f"{prefix}.options.claimName"] = submission.report_claim
            conf[f"{prefix}.mount.path"] = submission.report_mount
    if template is not None:
        conf["spark.kubernetes.driver.podTemplateFile"] = str(template)
    if executors is not None:
        conf["spark.kubernetes.executor.podTemplateFile"] = str(executors)
    line = ["spark-submit", "--master", MASTER, "--deploy-mode", "cluster"]
    line += ["--name", submission.name]
    for key, value in conf.items():
        line += ["--conf", f"{key}={value}"]
    return [*line, APPLICATION, *submission.audit_arguments]


def _pairs(values: Sequence[str]) -> dict[str, str]:
    result = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"gregor: --label takes KEY=VALUE, not {value!r}")
        result[key] = item
    return result


def _own_namespace() -> str | None:
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or None
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    audit = arguments[arguments.index("--") + 1 :] if "--" in arguments else []
    own = arguments[: arguments.index("--")] if "--" in arguments else arguments
    parser = argparse.ArgumentParser(prog="python -m gregor_audit.submit")
    parser.add_argument("--namespace", help="where the driver runs (default: this pod's)")
    parser.add_argument("--image", required=True)
    parser.add_argument("--service-account", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--label", action="append", default=[])
    parser.add_argument("--owner-job")
    parser.add_argument("--owner-uid")
    parser.add_argument("--deadline-seconds", type=int)
    parser.add_argument("--driver-cores", type=int, default=1)
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--executors", type=int, default=1)
    parser.add_argument("--executor-cores", type=int, default=1)
    parser.add_argument("--executor-memory", default="1g")
    parser.add_argument("--driver-request-cores", help="the CPU the driver's pod asks for")
    parser.add_argument("--executor-request-cores", help="the CPU each executor's pod asks for")
    parser.add_argument("--report-claim")
    parser.add_argument("--report-mount", default="/reports")
    parser.add_argument("--pull-policy", default="IfNotPresent")
    args = parser.parse_args(own)
    if not audit:
        parser.error("give the audit's arguments after --")
    here = _own_namespace()
    namespace = args.namespace or here
    if namespace is None:
        parser.error("--namespace is needed outside a pod")
    if args.owner_job is not None and here is not None and namespace != here:
        parser.error(
            f"the driver would run in {namespace} and its owner, this pod's Job, is in {here}: "
            "an owner reference never crosses namespaces"
        )
    try:
        submission = Submission(
            namespace=namespace,
            image=args.image,
            service_account=args.service_account,
            name=args.name,
            audit_arguments=tuple(audit),
            labels=_pairs(args.label),
            owner_job=args.owner_job,
            owner_uid=args.owner_uid,
            driver_cores=args.driver_cores,
            driver_memory=args.driver_memory,
            executors=args.executors,
            executor_cores=args.executor_cores,
            executor_memory=args.executor_memory,
            driver_request_cores=args.driver_request_cores,
            executor_request_cores=args.executor_request_cores,
            report_claim=args.report_claim,
            report_mount=args.report_mount,
            pull_policy=args.pull_policy,
            deadline_seconds=args.deadline_seconds,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return submit(submission)


def submit(submission: Submission) -> int:
    """Run spark-submit; with an owner, wait for the driver and exit as it did."""
    path = _written("driver-", driver_template(submission))
    executors = _written("executor-", executor_template(submission))
    line = spark_submit(submission, path, executors)
    sys.stdout.flush()
    if submission.result is None:
        os.execvp(line[0], line)
    submitted = subprocess.run(line, check=False).returncode
    code, why = driver_outcome(submission)
    if code is None:
        print(f"gregor: {why}", file=sys.stderr)
        _result_unless_written(submission, why)
        return submitted or 1
    if code != 0:
        print(f"gregor: the audit's driver {why}", file=sys.stderr)
        _result_unless_written(submission, f"the audit's driver {why}")
    return code


def _written(prefix: str, template: dict[str, object] | None) -> Path | None:
    """A pod template in a file of its own for spark-submit (None: no template)."""
    if template is None:
        return None
    handle, name = tempfile.mkstemp(prefix=prefix, suffix=".json")
    with os.fdopen(handle, "w") as file:
        json.dump(template, file)  # YAML's superset: Spark reads it as YAML
    return Path(name)


DRIVER_POLL_S = 5.0


def driver_outcome(
    submission: Submission, *, sleep: Any = time.sleep, clock: Any = time.monotonic
) -> tuple[int | None, str]:
    """The driver's exit code and how it ended, once it has (spark-submit may return before
    its driver ends, when its watch drops); None when the pod is gone or cannot be read
    before the run's deadline."""
    from kubernetes import client, config  # noqa: PLC0415 - only a pod needs it

    deadline = clock() + (submission.deadline_seconds or 3600) + 60
    why = f"the driver pod {submission.driver_pod} did not end"
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        core: Any = client.CoreV1Api()
    except Exception as exc:
        return None, f"the Kubernetes API cannot be reached from this pod: {exc}"
    while clock() < deadline:
        try:
            pod = core.read_namespaced_pod(submission.driver_pod, submission.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None, (
                    f"there is no driver pod {submission.driver_pod}: spark-submit failed "
                    "before making it, or it was deleted"
                )
            why = f"the driver pod {submission.driver_pod} could not be read: {exc.reason}"
        else:
            code, why = ended(pod)
            if code is not None:
                return code, why
        sleep(DRIVER_POLL_S)
    return None, why


def ended(pod: Any) -> tuple[int | None, str]:
    """A driver pod's exit code and how it ended, from its status."""
    status = pod.status
    if status is not None and status.reason == "DeadlineExceeded":
        return 1, "ran past its deadline and was stopped"
    for container in (status.container_statuses if status else None) or []:
        if container.name != DRIVER_CONTAINER:
            continue
        terminated = container.state.terminated if container.state else None
        if terminated is None:
            return None, f"the driver pod {_pod_name(pod)} has not ended"
        code = int(terminated.exit_code)
        if code == 0:
            return 0, "succeeded"
        reason = f" ({terminated.reason})" if terminated.reason else ""
        return code, f"ended with exit code {code}{reason}"
    return None, f"the driver pod {_pod_name(pod)} has no driver container"


def _pod_name(pod: Any) -> str:
    return str(pod.metadata.name) if pod.metadata is not None else "?"


def _result_unless_written(submission: Submission, reason: str) -> None:
    """The driver died before leaving its result: leave one that says so."""
    from kubernetes import client  # noqa: PLC0415

    from gregor_audit.result import RESULT_ENV, failure, publish  # noqa: PLC0415

    assert submission.result is not None
    try:
        client.CoreV1Api().read_namespaced_config_map(
            str(submission.result["name"]), submission.namespace
        )
        return
    except Exception:  # not there (or unreadable): write it
        log.debug("no result from the driver", exc_info=True)
    publish(failure(reason), {RESULT_ENV: json.dumps(submission.result)})


if __name__ == "__main__":
    sys.exit(main())
