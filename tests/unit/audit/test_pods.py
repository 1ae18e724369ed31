"""The `gregor-spark` image's pods: what a Spark-on-Kubernetes driver and executor become, and
the spark-submit command line that makes them, with the driver owned by its Job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gregor_audit import pod, submit
from gregor_audit.pod import IncompletePod, command
from gregor_audit.submit import (
    APPLICATION,
    MASTER,
    Submission,
    driver_template,
    executor_template,
    spark_submit,
)

pytestmark = pytest.mark.unit

HOME = {"SPARK_HOME": "/opt/spark", "JAVA_HOME": "/usr/lib/jvm/java-17"}
EXECUTOR = HOME | {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@audit-driver-svc.ns.svc:7078",
    "SPARK_EXECUTOR_ID": "1",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "1024m",
    "SPARK_APPLICATION_ID": "spark-0123",
    "SPARK_EXECUTOR_POD_IP": "10.0.0.7",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_NAME": "audit-exec-1",
    "SPARK_JAVA_OPT_10": "-Dlater=1",
    "SPARK_JAVA_OPT_2": "-Dearlier=1",
}


def test_a_driver_pod_runs_spark_submit_in_client_mode_on_its_own_address() -> None:
    args = ["driver", "--properties-file", "/opt/spark/conf/spark.properties", APPLICATION, "-x"]
    line = command(args, HOME | {"SPARK_DRIVER_BIND_ADDRESS": "10.0.0.5"})
    assert line == [
        "/opt/spark/bin/spark-submit",
        "--conf",
        "spark.driver.bindAddress=10.0.0.5",
        "--deploy-mode",
        "client",
        *args[1:],
    ]


def test_an_executor_pod_runs_the_executor_backend_from_what_spark_set() -> None:
    line = command(["executor"], EXECUTOR)
    assert line[:5] == [
        "/usr/lib/jvm/java-17/bin/java",
        "-Dearlier=1",
        "-Dlater=1",
        "-Xms1024m",
        "-Xmx1024m",
    ]
    assert line[5:7] == ["-cp", "/opt/spark/conf:/opt/spark/jars/*"]
    backend = line[7:]
    assert backend[0] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    assert dict(zip(backend[1::2], backend[2::2], strict=True)) == {
        "--driver-url": EXECUTOR["SPARK_DRIVER_URL"],
        "--executor-id": "1",
        "--cores": "1",
        "--app-id": "spark-0123",
        "--hostname": "10.0.0.7",
        "--resourceProfileId": "0",
        "--podName": "audit-exec-1",
    }


def test_a_pod_missing_what_spark_sets_is_named() -> None:
    with pytest.raises(IncompletePod, match="SPARK_EXECUTOR_POD_IP"):
        command(["executor"], {k: v for k, v in EXECUTOR.items() if k != "SPARK_EXECUTOR_POD_IP"})
    with pytest.raises(IncompletePod, match="SPARK_DRIVER_BIND_ADDRESS"):
        command(["driver"], HOME)


def test_other_arguments_audit_and_a_double_dash_runs_a_command() -> None:
    assert command(["--bootstrap-server", "k:9092"], HOME) == [
        "gregor", "audit", "retention", "--bootstrap-server", "k:9092",
    ]  # fmt: skip
    assert command(["--", "bash", "-c", "true"], HOME) == ["bash", "-c", "true"]


def test_spark_submit_runs_the_audit_in_cluster_mode_owned_labelled_and_mounted() -> None:
    submission = Submission(
        namespace="kafka",
        image="gregor-spark:dev",
        service_account="gregor-spark",
        name="events-audit",
        audit_arguments=("--bootstrap-server", "events-kafka:9092", "--topic", "t"),
        labels={"gregor.dev/cluster": "events", "gregor.dev/audit": "events-audit-1"},
        owner_job="events-audit-1",
        owner_uid="0b6f-uid",
        executors=2,
        report_claim="events-audit-reports",
    )
    template = driver_template(submission)
    assert template is not None
    owners = template["metadata"]["ownerReferences"]  # type: ignore[index]
    assert owners == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "events-audit-1", "uid": "0b6f-uid",
         "blockOwnerDeletion": False},
    ]  # fmt: skip
    line = spark_submit(submission, Path("/tmp/driver.json"))
    assert line[:7] == [
        "spark-submit",
        "--master",
        MASTER,
        "--deploy-mode",
        "cluster",
        "--name",
        "events-audit",
    ]
    assert line[-5:] == [APPLICATION, *submission.audit_arguments]
    conf = dict(item.split("=", 1) for item in line[8:-5:2])
    assert set(line[7:-5:2]) == {"--conf"}
    assert conf["spark.kubernetes.namespace"] == "kafka"
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "gregor-spark"
    assert conf["spark.kubernetes.driver.podTemplateFile"] == "/tmp/driver.json"
    assert conf["spark.executor.instances"] == "2"
    assert conf["spark.kubernetes.executor.podNamePrefix"] == "events-audit-1"  # the run's
    for role in ("driver", "executor"):
        assert conf[f"spark.kubernetes.{role}.label.gregor.dev/audit"] == "events-audit-1"
        claim = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim.report"
        assert conf[f"{claim}.options.claimName"] == "events-audit-reports"
        assert conf[f"{claim}.mount.path"] == "/reports"
    unowned = Submission("ns", "img", "sa", "n", ("--topic", "t"))
    assert driver_template(unowned) is None
    assert not any("podTemplateFile" in item for item in spark_submit(unowned, None))


def test_the_class_path_is_in_spark_s_order() -> None:
    extra = {
        "SPARK_CONF_DIR": "/opt/spark/conf",
        "HADOOP_CONF_DIR": "/opt/hadoop/conf",
        "SPARK_CLASSPATH": "/extra/first.jar",
        "SPARK_EXTRA_CLASSPATH": "/extra/last.jar",
        "SPARK_DIST_CLASSPATH": "/dist/*",
    }
    line = command(["executor"], EXECUTOR | extra)
    assert line[line.index("-cp") + 1].split(":") == [
        "/opt/spark/conf", "/opt/hadoop/conf", "/extra/first.jar", "/opt/spark/jars/*",
        "/extra/last.jar", "/dist/*",
    ]  # fmt: skip
    spaced = command(["executor"], EXECUTOR | {"SPARK_JAVA_OPT_0": "-Dx=a b"})
    assert "-Dx=a b" in spaced  # one argument, spaces and all


class _Exec(Exception):
    pass


def _exec_into(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def execvp(file: str, args: list[str]) -> None:
        calls.append(list(args))
        raise _Exec

    monkeypatch.setattr("os.execvp", execvp)
    return calls


def test_a_pod_becomes_its_command_or_says_why_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _exec_into(monkeypatch)
    with pytest.raises(_Exec):
        pod.main(["--", "true"])
    assert calls == [["true"]]
    monkeypatch.delenv("SPARK_EXECUTOR_MEMORY", raising=False)
    assert pod.main(["executor"]) == 1
    assert capsys.readouterr().err.startswith("gregor-spark: a Spark executor pod needs")
    monkeypatch.undo()
    assert pod.main(["--", "/nonexistent/command"]) == 127
    assert "gregor-spark: cannot run /nonexistent/command" in capsys.readouterr().err


BASE = ["--image", "gregor-spark:dev", "--service-account", "sa", "--namespace", "kafka"]


def _template_of(line: list[str]) -> dict[str, Any]:
    (conf,) = [c for c in line if c.startswith("spark.kubernetes.driver.podTemplateFile=")]
    return dict(json.loads(Path(conf.split("=", 1)[1]).read_text()))


@pytest.fixture
def in_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The submitter as in a pod of namespace `kafka`, its templates written under tmp_path."""
    monkeypatch.setattr(submit, "SERVICE_ACCOUNT_DIR", tmp_path)
    (tmp_path / "namespace").write_text("kafka\n")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


@pytest.mark.usefixtures("in_a_pod")
def test_submit_writes_the_template_and_execs_spark_submit_when_nothing_owns_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _exec_into(monkeypatch)
    with pytest.raises(_Exec):
        submit.main([*BASE, "--name", "audit", "--deadline-seconds", "600", "--", "--topic", "t"])
    (line,) = calls
    assert line[0] == "spark-submit"
    assert line[-3:] == [APPLICATION, "--topic", "t"]
    assert _template_of(line)["spec"]["activeDeadlineSeconds"] == 600
    assert not [c for c in line if "driverEnv" in c]  # no owner, no result for an operator


@pytest.mark.usefixtures("in_a_pod")
def test_an_owned_run_waits_for_its_driver_and_exits_as_the_driver_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[list[str]] = []

    def run(line: list[str], check: bool) -> Any:
        lines.append(line)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr("gregor_audit.submit.subprocess.run", run)
    monkeypatch.setattr(submit, "driver_outcome", lambda _: (137, "ended with exit code 137"))
    written: list[str] = []
    monkeypatch.setattr(submit, "_result_unless_written", lambda _, why: written.append(why))
    owned = ["--owner-job", "run-1", "--owner-uid", "u-1", "--label", "gregor.dev/cluster=c"]
    assert submit.main([*BASE, "--name", "audit", *owned, "--", "--topic", "t"]) == 137
    (line,) = lines
    template = _template_of(line)
    assert template["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert "spark.kubernetes.driver.pod.name=run-1-driver" in line
    (env,) = [c for c in line if c.startswith("spark.kubernetes.driverEnv.GREGOR_AUDIT_RESULT=")]
    assert json.loads(env.split("=", 1)[1]) == {
        "name": "run-1-result",
        "namespace": "kafka",
        "labels": {"gregor.dev/cluster": "c", "gregor.dev/audit-result": "true"},
        "owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "run-1", "uid": "u-1"},
    }
    assert written == ["the audit's driver ended with exit code 137"]


def _driver(**status: Any) -> Any:
    from kubernetes import client  # noqa: PLC0415

    return client.V1Pod(metadata=client.V1ObjectMeta(name="run-1-driver"), status=status["s"])


def test_how_a_driver_pod_ended_is_read_from_its_status() -> None:
    from kubernetes import client  # noqa: PLC0415

    def container(state: Any) -> Any:
        return client.V1ContainerStatus(
            name="spark-kubernetes-driver", image="i", image_id="", ready=False,
            restart_count=0, state=state,
        )  # fmt: skip

    def terminated(code: int, reason: str | None = None) -> Any:
        return client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(exit_code=code, reason=reason)
        )

    def pod(*containers: Any, reason: str | None = None) -> Any:
        return _driver(s=client.V1PodStatus(reason=reason, container_statuses=list(containers)))

    assert submit.ended(pod(container(terminated(0)))) == (0, "succeeded")
    assert submit.ended(pod(container(terminated(137, "OOMKilled")))) == (
        137,
        "ended with exit code 137 (OOMKilled)",
    )
    assert submit.ended(pod(reason="DeadlineExceeded"))[0] == 1
    running = client.V1ContainerState(running=client.V1ContainerStateRunning())
    assert submit.ended(pod(container(running)))[0] is None
    assert submit.ended(pod())[0] is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([*BASE, "--name", "audit", "--owner-job", "run-1", "--", "-x"], "go together"),
        ([*BASE, "--name", "Audit_1", "--", "-x"], "DNS-1123 label"),
        ([*BASE, "--name", "a" * 48, "--", "-x"], "at most 47"),
        ([*BASE, "--name", "audit"], "after --"),
        ([*BASE, "--name", "audit", "--label", "nokey", "--", "-x"], "KEY=VALUE"),
        (
            [
                *BASE,
                "--namespace",
                "other",
                "--name",
                "audit",
                "--owner-job",
                "j",
                "--owner-uid",
                "u",
                "--",
                "-x",
            ],
            "never crosses namespaces",
        ),
    ],
)
def test_submit_refuses_what_would_leave_a_driver_unowned_or_misnamed(
    arguments: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(submit, "SERVICE_ACCOUNT_DIR", tmp_path)
    (tmp_path / "namespace").write_text("kafka")
    calls = _exec_into(monkeypatch)
    with pytest.raises(SystemExit) as exited:
        submit.main(arguments)
    assert exited.value.code != 0
    assert message in capsys.readouterr().err + str(exited.value.code)
    assert calls == []


def test_executors_of_a_run_with_a_long_name_get_a_short_unique_prefix() -> None:
    def prefix(job: str) -> str:
        line = spark_submit(
            Submission(
                namespace="ns", image="i", service_account="sa", name="audit",
                audit_arguments=("-x",), owner_job=job, owner_uid="u",
            ),
            None,
        )  # fmt: skip
        (conf,) = [c for c in line if c.startswith("spark.kubernetes.executor.podNamePrefix=")]
        return conf.split("=", 1)[1]

    assert prefix("short-audit-29400000") == "short-audit-29400000"
    long_one, long_two = "a" * 40 + "-audit-29400000", "a" * 40 + "-audit-29400001"
    assert len(prefix(long_one)) <= 47
    assert prefix(long_one) != prefix(long_two)


@pytest.mark.usefixtures("in_a_pod")
def test_with_a_report_claim_the_driver_and_executors_may_write_it_as_the_images_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    claimed = Submission(
        namespace="ns", image="i", service_account="sa", name="audit", audit_arguments=("-x",),
        report_claim="reports",
    )  # fmt: skip
    access = {"fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch"}
    driver = driver_template(claimed)
    assert driver is not None
    assert driver["spec"]["securityContext"] == access  # type: ignore[index]
    executors = executor_template(claimed)
    assert executors is not None
    assert executors["spec"] == {
        "containers": [{"name": "spark-kubernetes-executor"}],
        "securityContext": access,
    }
    unclaimed = Submission(
        namespace="ns", image="i", service_account="sa", name="audit", audit_arguments=("-x",)
    )
    assert executor_template(unclaimed) is None
    assert driver_template(unclaimed) is None

    calls = _exec_into(monkeypatch)
    with pytest.raises(_Exec):
        submit.main([*BASE, "--name", "audit", "--report-claim", "reports", "--", "-x"])
    (line,) = calls
    (conf,) = [c for c in line if c.startswith("spark.kubernetes.executor.podTemplateFile=")]
    written = json.loads(Path(conf.split("=", 1)[1]).read_text())
    assert written["spec"]["securityContext"] == access
