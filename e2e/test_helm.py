"""The whole stack as a user runs it: `helm install` the operator's chart with the images from
`make images`, `kubectl apply` the examples (3 controllers and 3 brokers, a Topic), and use
the cluster from a client pod inside Kubernetes. Then the day-one operations: a topic config
change, a re-apply that changes nothing, a topic deleted, and `helm upgrade` to a new broker
image, which rolls every node one at a time under an acks=all producer that loses nothing.

The README's "Run on Kubernetes" section is these steps. The tests share one release and one
cluster (bringing them up is the slow part), so they run in order."""

from __future__ import annotations

import functools
import itertools
import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.client_pod import client_pod, record, run_client
from e2e.conftest import Kubectl, collect_artifacts
from e2e.helm import CHART, Release
from e2e.resources import condition, eventually, get, ready
from localkube.build import ensure_binaries, spark_operator_chart
from localkube.cluster import load_images
from localkube.versions import KUBERNETES_VERSION

# Building and loading the images, a 6-node cluster and a rolling restart take minutes.
pytestmark = pytest.mark.timeout(1200)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLUSTER = "gregor"
TOPIC = "orders"
READY_WITHIN_S = 300.0
"""Strimzi's system tests allow 14 minutes; the 3 + 3 example is Ready in about a minute here."""
ROLL_WITHIN_S = 600.0
DNS_TTL_S = 30.0
"""localkube's CoreDNS `ttl`, as kubeadm's; the chart's `clusterDnsTtlSeconds` default."""
RECORDS = 10_000
KUBE_VERSION = f"--kube-version={KUBERNETES_VERSION}"
"""`helm template` renders for the pinned release (left alone, it assumes an old one)."""


@pytest.fixture(scope="module")
def helm() -> str:
    return str(ensure_binaries(log=lambda _: None, only=["helm"]).helm)


@pytest.fixture(scope="module")
def images(broker_image: str, operator_image: str, spark_image: str) -> tuple[str, str, str]:
    return broker_image, operator_image, spark_image


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest,
    helm: str,
    kubectl: Kubectl,
    kubeconfig: Path,
    images: tuple[str, str, str],
) -> Iterator[Release]:
    """The chart installed in a namespace of its own, watching another, where the cluster
    runs; uninstalled at the end (after the cluster's resources, while its finalizers can
    still be served)."""
    suffix = secrets.token_hex(2)
    system, apps = f"e2e-helm-system-{suffix}", f"e2e-helm-apps-{suffix}"
    for name in (system, apps):
        kubectl("create", "namespace", name)
    release = Release(helm, kubeconfig, f"gregor-{suffix}", system, apps)
    release.adopt_crds(kubectl)
    release.run("install", *release.values(*images), "--wait", "--timeout=3m")
    yield release
    if request.session.testsfailed:
        for name in (system, apps):
            collect_artifacts(name, kubectl)
    kubectl("delete", "topics,kafkaclusters", "--all", "--timeout=120s", namespace=apps)
    release.run("uninstall", "--wait", "--timeout=2m")
    for name in (apps, system):
        kubectl("delete", "namespace", name, "--wait=false")


# -- the chart on its own ---------------------------------------------------------------------


def test_the_chart_lints_and_its_objects_are_what_the_api_server_accepts(
    helm: str, kubectl: Kubectl
) -> None:
    """`helm lint` is clean, and what `helm template` renders (watching every namespace, or
    two) passes the API server's strict validation of the pinned Kubernetes release."""
    lint = subprocess.run(
        [helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # kopf's peering CRDs (the chart's crds/) must exist for its peering objects to validate.
    kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
    for variant in ([], ["--set=watchNamespaces={default,kube-public}", "--set=replicas=2"]):
        rendered = subprocess.run(
            [helm, "template", "check", str(CHART), KUBE_VERSION, *variant],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
        assert kinds.count("CustomResourceDefinition") == 3, kinds
        assert "Deployment" in kinds, kinds
        kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=rendered)


def test_invalid_values_are_refused_naming_the_value(helm: str) -> None:
    for values, named in (
        (["--set=replicas=-1"], "replicas"),
        (["--set=metrics.port=8080"], "metrics/port"),
        (["--set=watchNamespaces={Not_A_Namespace}"], "watchNamespaces"),
        (["--set=brokerImag.tag=x"], "brokerImag"),
    ):
        result = subprocess.run(
            [helm, "template", "check", str(CHART), KUBE_VERSION, *values],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode != 0, values
        assert named in result.stderr, result.stderr


# -- installed ------------------------------------------------------------------------------


def test_helm_install_runs_the_operator_and_the_example_cluster_becomes_ready(
    release: Release, kubectl: Kubectl, broker_image: str
) -> None:
    apps = release.apps
    deployment = json.loads(
        kubectl(
            "get", "deployment", f"{release.name}-gregor-operator", "-o", "json",
            namespace=release.system,
        )
    )  # fmt: skip
    assert deployment["status"]["readyReplicas"] == 1
    started = time.monotonic()
    kubectl("apply", "--server-side", "-f", str(EXAMPLES / "kafkacluster.yaml"), namespace=apps)
    cluster = eventually(
        "the example KafkaCluster to be Ready",
        functools.partial(ready, kubectl, apps, "kafkacluster", CLUSTER),
        timeout=READY_WITHIN_S,
    )
    took = time.monotonic() - started
    record("kafkacluster_3_3_ready_s", took)
    status = cluster["status"]
    assert status["readyNodes"] == "6/6"
    assert status["observedGeneration"] == cluster["metadata"]["generation"]
    assert sorted((n["nodeId"], n["roles"]) for n in status["nodes"]) == [
        (0, ["broker"]),
        (1, ["broker"]),
        (2, ["broker"]),
        (1000, ["controller"]),
        (1001, ["controller"]),
        (1002, ["controller"]),
    ]
    listed = kubectl("get", "kc", namespace=apps)
    for shown in ("True", "6/6", f"{CLUSTER}-bootstrap.{apps}.svc"):
        assert shown in listed, listed
    # The chart's default log format: a JSON object per line, for log collectors.
    logs = kubectl("logs", f"deployment/{release.name}-gregor-operator", namespace=release.system)
    assert all("message" in json.loads(line) for line in logs.splitlines() if line), logs[-2000:]
    client_pod(kubectl, apps, status["listeners"][0]["bootstrapServers"], broker_image)


def test_a_topic_takes_records_follows_its_spec_and_goes_when_deleted(
    release: Release, kubectl: Kubectl, images: tuple[str, str, str]
) -> None:
    broker_image = images[0]
    apps = release.apps
    kubectl("apply", "--server-side", "-f", str(EXAMPLES / "topic.yaml"), namespace=apps)
    topic = eventually(
        "the Topic to be Ready", functools.partial(ready, kubectl, apps, "topic", TOPIC)
    )
    assert (topic["status"]["partitions"], topic["status"]["replicas"]) == (6, 3)
    listed = kubectl("get", "kc,kt", namespace=apps)
    assert TOPIC in listed, listed

    # The README's client, as a user runs it.
    said = kubectl(
        "run", "readme-client", "--rm", "-i", "--restart=Never", f"--image={broker_image}",
        "--command", "--", "python3", "-", namespace=apps, stdin=_readme_client(),
    )  # fmt: skip
    assert "hello, Gregor" in said, said

    produced = run_client(kubectl, apps, "produce", TOPIC, str(RECORDS))
    assert produced == {"acknowledged": RECORDS, "errors": [], "unsent": 0}, produced
    consumed = run_client(kubectl, apps, "consume", TOPIC)
    assert consumed["count"] == RECORDS
    assert consumed["values"] == list(range(RECORDS))
    assert consumed["others"] == ["hello, Gregor"]

    # retention.ms changes in the manifest, re-applied as a GitOps tool would.
    document = yaml.safe_load((EXAMPLES / "topic.yaml").read_text())
    document["spec"]["config"]["retention.ms"] = 3_600_000
    kubectl("apply", "--server-side", "-f", "-", namespace=apps, stdin=json.dumps(document))
    eventually(
        "retention.ms in DescribeConfigs",
        lambda: run_client(kubectl, apps, "config", TOPIC).get("retention.ms") == "3600000",
        timeout=60,
    )

    # What a GitOps tool sees once the operator has reconciled the manifests it applied:
    # `kubectl diff` finds nothing to flag, and applying them again changes nothing.
    eventually("the Topic to settle", functools.partial(ready, kubectl, apps, "topic", TOPIC))
    manifests = {
        ("kafkacluster", CLUSTER): (EXAMPLES / "kafkacluster.yaml").read_text(),
        ("topic", TOPIC): json.dumps(document),
    }
    for (kind, name), manifest in manifests.items():
        before = ready(kubectl, apps, kind, name)
        assert before is not None, f"{kind}/{name} is not Ready"
        kubectl("diff", "--server-side", "-f", "-", namespace=apps, stdin=manifest)
        kubectl("apply", "--server-side", "-f", "-", namespace=apps, stdin=manifest)
        after = get(kubectl, apps, kind, name)
        assert after is not None
        assert after["metadata"]["generation"] == before["metadata"]["generation"], kind

    kubectl("delete", "topic", TOPIC, "--timeout=60s", namespace=apps)
    eventually(
        "the topic to be gone from the cluster",
        lambda: "UNKNOWN_TOPIC" in json.dumps(_describe_or_error(kubectl, apps)),
        timeout=60,
    )


def _readme_client() -> str:
    """The Python program of the README's `kubectl run client` step."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("python3 - <<'EOF'\n") + len("python3 - <<'EOF'\n")
    return readme[start : readme.index("\nEOF\n", start)] + "\n"


def _describe_or_error(kubectl: Kubectl, namespace: str) -> Any:
    try:
        return run_client(kubectl, namespace, "config", TOPIC)
    except AssertionError as exc:
        return str(exc)


def test_helm_upgrade_to_a_new_broker_image_rolls_every_node_one_at_a_time_losing_nothing(
    release: Release, kubectl: Kubectl, images: tuple[str, str, str]
) -> None:
    broker_image = images[0]
    apps = release.apps
    rolled = f"{broker_image.rsplit(':', 1)[0]}:e2e-roll"
    subprocess.run(["docker", "tag", broker_image, rolled], check=True)
    assert load_images([rolled], log=lambda _: None) is not None
    topic = yaml.safe_load((EXAMPLES / "topic.yaml").read_text())
    topic["metadata"]["name"] = "rolling"
    kubectl("apply", "--server-side", "-f", "-", namespace=apps, stdin=json.dumps(topic))
    eventually("the Topic to be Ready", functools.partial(ready, kubectl, apps, "topic", "rolling"))
    before = _pods(kubectl, apps)
    assert len(before) == 6, before
    assert all(up for _, up in before.values()), before
    kubectl(
        "exec", "client", "--", "sh", "-c",
        "rm -f /tmp/stop /tmp/acked; nohup python3 /client/kafka_client.py produce-until "
        "rolling /tmp/stop /tmp/acked > /tmp/producer.json 2> /tmp/producer.log &",
        namespace=apps,
    )  # fmt: skip
    time.sleep(3)
    # Paused first: the new image is due everywhere, status.rollout says so, nothing restarts.
    pause = '{"spec": {"rollout": {"paused": %s}}}'
    kubectl("patch", "kc", CLUSTER, "--type=merge", "-p", pause % "true", namespace=apps)
    release.run("upgrade", *release.values(rolled, images[1], images[2]), "--wait", "--timeout=3m")

    def listed() -> dict[str, Any] | None:
        found = get(kubectl, apps, "kafkacluster", CLUSTER) or {}
        rollout = (found.get("status") or {}).get("rollout") or {}
        return rollout if len(rollout.get("pods") or []) == len(before) else None

    rollout = eventually("status.rollout to list every pod", listed)
    assert rollout["paused"] is True
    assert {p["state"] for p in rollout["pods"]} == {"Pending"}, rollout
    assert rollout["pods"][0]["reason"] == "its configuration or image changed"
    time.sleep(10)
    assert {n: uid for n, (uid, _) in _pods(kubectl, apps).items()} == {
        n: uid for n, (uid, _) in before.items()
    }, "a pod restarted while the roll was paused"
    kubectl("patch", "kc", CLUSTER, "--type=merge", "-p", pause % "false", namespace=apps)

    # Every pod is replaced, one at a time, and never more than one broker is out of service.
    # Controllers may all be unready for the moment their quorum elects a leader.
    roll = _watch_roll(kubectl, apps, before)
    record("helm_upgrade_roll_6_nodes_s", roll.seconds)
    timeline = roll.timeline
    assert max(len(r) for _, r, _ in timeline) == 1, f"(s, replacing, brokers down): {timeline}"
    assert max(len(b) for _, _, b in timeline) <= 1, f"(s, replacing, brokers down): {timeline}"
    # A controller goes only once the one before has been ready for the DNS's TTL (30 s,
    # less this loop's own lag), so that the voters left can find each other.
    controllers = sorted((n for n in before if "controller" in n), key=roll.deleted_at.__getitem__)
    gaps = [roll.deleted_at[b] - roll.ready_at[a] for a, b in itertools.pairwise(controllers)]
    assert min(gaps) >= DNS_TTL_S - 5, f"controllers {controllers} restarted {gaps} s apart"
    running = {
        c["image"]
        for name in before
        for c in json.loads(kubectl("get", "pod", name, "-o", "json", namespace=apps))["spec"][
            "containers"
        ]
    }
    assert running == {rolled}

    time.sleep(3)
    kubectl("exec", "client", "--", "touch", "/tmp/stop", namespace=apps)
    result = eventually(
        "the producer to finish",
        lambda: _read_json(kubectl, apps, "/tmp/producer.json"),
        timeout=180,
    )
    assert (result["errors"], result["unsent"]) == ([], 0), result
    acked = {
        int(v) for v in kubectl("exec", "client", "--", "cat", "/tmp/acked", namespace=apps).split()
    }
    assert len(acked) == result["acknowledged"] > 0
    consumed = run_client(kubectl, apps, "consume", "rolling")
    assert not acked - set(consumed["values"]), f"lost {len(acked - set(consumed['values']))}"


@dataclass
class Roll:
    seconds: float
    timeline: list[tuple[int, list[str], list[str]]]
    """(seconds in, pods being replaced, brokers out of service), while any is."""
    deleted_at: dict[str, float]
    """When each pod was first seen deleted or replaced (seconds in)."""
    ready_at: dict[str, float]
    """When each pod's successor was first seen ready."""


def _watch_roll(kubectl: Kubectl, namespace: str, before: dict[str, tuple[str, bool]]) -> Roll:
    """Watch the pods until each of `before` is replaced and the cluster is Ready again. A
    pod is being replaced from its deletion until its successor is first Ready."""
    started = time.monotonic()
    roll = Roll(0.0, [], {}, {})
    while True:
        now = _pods(kubectl, namespace)
        moment = time.monotonic() - started
        for name, (uid, _) in before.items():
            if name not in now or now[name][0] != uid:
                roll.deleted_at.setdefault(name, moment)
                if name in now and now[name][1]:
                    roll.ready_at.setdefault(name, moment)
        replacing = sorted(n for n in roll.deleted_at if n not in roll.ready_at)
        brokers_down = sorted(
            name for name in before if "broker" in name and (name not in now or not now[name][1])
        )
        if replacing or brokers_down:
            roll.timeline.append((round(moment), replacing, brokers_down))
        if len(roll.ready_at) == len(before) and ready(kubectl, namespace, "kafkacluster", CLUSTER):
            roll.seconds = time.monotonic() - started
            return roll
        assert moment < ROLL_WITHIN_S, f"not rolled: {now}"
        time.sleep(1)


def _read_json(kubectl: Kubectl, namespace: str, path: str) -> Any:
    text = kubectl("exec", "client", "--", "cat", path, namespace=namespace).strip()
    return json.loads(text.splitlines()[-1]) if text else None


def _pods(kubectl: Kubectl, namespace: str) -> dict[str, tuple[str, bool]]:
    """The cluster's pods: name -> (uid, ready)."""
    found = json.loads(
        kubectl("get", "pods", "-l", f"gregor.dev/cluster={CLUSTER}", "-o", "json",
                namespace=namespace)
    )  # fmt: skip
    pods = {}
    for pod in found["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = pod.get("status", {}).get("conditions") or []
        up = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        pods[pod["metadata"]["name"]] = (pod["metadata"]["uid"], up)
    return pods


# -- retention audits ---------------------------------------------------------------------------

DAY_S = 86_400
AUDITED = "gregor.dev/e2e-audit"
AUDIT_TOPICS: dict[str, tuple[dict[str, int], float, str, list[str]]] = {
    # name: (configs, records stamped this many seconds from now, verdict, finding codes)
    "audit-ok": ({}, 0, "Compliant", []),
    "audit-forever": (
        {"retention.ms": -1},
        -40 * DAY_S,
        "Violations",
        ["ConfigCannotMeetMaxAge", "RecordsOlderThanMaxAge"],
    ),
    "audit-future": (
        {"message.timestamp.after.max.ms": 9_223_372_036_854_775_807},
        2 * DAY_S,
        "Violations",
        ["FutureTimestamps"],
    ),
}
AUDIT_RECORDS = 300
AUDIT_WITHIN_S = 420.0
"""A run: spark-submit's JVM, the driver's and an executor's pods and JVMs, and the scan; about
a minute and a half here."""


@pytest.fixture(scope="module")
def audit_topics(release: Release, kubectl: Kubectl) -> None:
    """The crafted topics, as Topics selected by a label, each filled once by a producer that
    stamps its records."""
    namespace = release.apps
    for name, (configs, _, _, _) in AUDIT_TOPICS.items():
        topic = {
            "apiVersion": "gregor.dev/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": name, "labels": {AUDITED: "yes"}},
            "spec": {"cluster": CLUSTER, "partitions": 2, "replicas": 3, "config": configs},
        }
        kubectl("apply", "--server-side", "-f", "-", namespace=namespace, stdin=json.dumps(topic))
    for name, (_, shift, _, _) in AUDIT_TOPICS.items():
        eventually(
            f"Topic {name} Ready", functools.partial(ready, kubectl, namespace, "topic", name)
        )
        produced = run_client(kubectl, namespace, "produce", name, str(AUDIT_RECORDS), str(shift))
        assert produced == {"acknowledged": AUDIT_RECORDS, "errors": [], "unsent": 0}, produced


def _audit_jobs(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    listed = kubectl(
        "get", "jobs", "-l", f"gregor.dev/retention-audit={CLUSTER}", "-o", "json",
        namespace=namespace,
    )  # fmt: skip
    return sorted(json.loads(listed)["items"], key=lambda j: j["metadata"]["creationTimestamp"])


def _finished(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)


def _spark_pods(kubectl: Kubectl, namespace: str) -> dict[str, tuple[str, str]]:
    """The audit's Spark pods: name -> (spark-role, phase)."""
    listed = kubectl(
        "get", "pods", "-l", f"gregor.dev/retention-audit={CLUSTER},spark-role", "-o", "json",
        namespace=namespace,
    )  # fmt: skip
    return {
        p["metadata"]["name"]: (p["metadata"]["labels"]["spark-role"], p["status"].get("phase", ""))
        for p in json.loads(listed)["items"]
    }


def _watch_run(
    kubectl: Kubectl, namespace: str, job: str, kind: str = "job"
) -> set[tuple[str, str]]:
    """Until the run (a Job, or a SparkApplication) ends, which it must do well: every
    (spark-role, phase) its pods were seen in."""
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + AUDIT_WITHIN_S
    while True:
        seen |= {
            (role, phase)
            for name, (role, phase) in _spark_pods(kubectl, namespace).items()
            if name.startswith(job)
        }
        found = get(kubectl, namespace, kind, job)
        assert found is not None, f"the run {job} is gone"
        if kind == "job" and _finished(found):
            conditions = found["status"]["conditions"]
            assert any(c["type"] == "Complete" for c in conditions), conditions
            return seen
        state = (found.get("status") or {}).get("applicationState") or {}
        if kind != "job" and state.get("state") in ("COMPLETED", "FAILED"):
            assert state["state"] == "COMPLETED", state
            return seen
        assert time.monotonic() < deadline, f"{job} did not end: {seen}"
        time.sleep(2)


def _scheduled_run_ran(kubectl: Kubectl, namespace: str, run: str, kind: str = "job") -> None:
    """The scheduled run ends well, its driver and an executor seen running."""
    seen = _watch_run(kubectl, namespace, run, kind)
    assert ("driver", "Running") in seen, seen
    assert ("executor", "Running") in seen, seen


def _requested_run_ran(
    kubectl: Kubectl,
    namespace: str,
    scheduled: str,
    runs: Callable[[], list[str]],
    kind: str = "job",
) -> str:
    """Once the scheduled run ended, the waiting request runs (the other of `runs()`), with an
    executor, and every crafted topic's status names it. Returns its name."""
    requested = str(
        eventually(
            f"the requested run ({kind})", lambda: [r for r in runs() if r != scheduled], timeout=60
        )[0]
    )
    seen = _watch_run(kubectl, namespace, requested, kind)
    assert ("executor", "Running") in seen, seen
    eventually(
        "the topics judged by the requested run",
        lambda: all(
            _audit_status(kubectl, namespace, name).get("run") == requested for name in AUDIT_TOPICS
        ),
        timeout=60,
    )
    return requested


def _audit_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    topic = get(kubectl, namespace, "topic", name) or {}
    return dict((topic.get("status") or {}).get("retentionAudit") or {})


def _operator_metrics(
    kubectl: Kubectl, release: Release
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The operator's metrics: (name, labels) -> value."""
    text = kubectl(
        "exec", f"deployment/{release.name}-gregor-operator", "--", "python3", "-c",
        "import urllib.request; print(urllib.request.urlopen("
        "'http://127.0.0.1:8081/metrics').read().decode())",
        namespace=release.system,
    )  # fmt: skip
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _at(labels: dict[str, str], **more: str) -> frozenset[tuple[str, str]]:
    return frozenset((labels | more).items())


def _check_verdicts(kubectl: Kubectl, apps: str, run: str) -> None:
    """Each crafted topic's verdict, in its status, its condition and `kubectl get kt`, and an
    Event for the topic in violation."""

    def judged(name: str) -> dict[str, Any] | None:
        status = _audit_status(kubectl, apps, name)
        return status if status.get("run") == run else None  # not an older run's

    def compliant(name: str, wanted: str) -> bool:
        found = condition(get(kubectl, apps, "topic", name) or {}, "RetentionCompliant")
        return found is not None and found["status"] == wanted

    for name, (_, _, verdict, codes) in AUDIT_TOPICS.items():
        status = eventually(f"{name}'s verdict", functools.partial(judged, name))
        assert status["verdict"] == verdict, (name, status)
        assert [f["code"] for f in status["findings"]] == codes, (name, status)
        assert status["run"] == run
        assert status["report"] == f"/reports/{run}"
        wanted = "True" if verdict == "Compliant" else "False"
        eventually(
            f"{name}'s RetentionCompliant condition",
            functools.partial(compliant, name, wanted),
            timeout=30,
        )
    forever = _audit_status(kubectl, apps, "audit-forever")
    assert forever["recordsPastBound"] == AUDIT_RECORDS
    assert forever["oldestRecordAgeSeconds"] >= 40 * DAY_S - 3600

    def told() -> bool:
        events = kubectl(
            "get", "events", "--field-selector", "involvedObject.name=audit-forever",
            namespace=apps,
        )  # fmt: skip
        return "RetentionViolations" in events

    eventually("a RetentionViolations Event for audit-forever", told, timeout=30)
    assert "Violations" in kubectl("get", "kt", "audit-forever", namespace=apps)


def test_retention_audits_run_on_schedule_and_on_request_as_spark_on_kubernetes(
    release: Release, kubectl: Kubectl, audit_topics: None
) -> None:
    apps = release.apps
    pods = {"memory": "512m", "requestCores": "100m"}
    audit = {
        "launcher": "Job",
        "schedule": "* * * * *",
        "topicSelector": {AUDITED: "yes"},
        "maxAge": "30d",
        "historyLimit": 1,
        "deadlineSeconds": 900,
        "driver": pods,
        "executors": pods | {"instances": 1},
    }
    started = time.monotonic()
    kubectl(
        "patch", "kafkacluster", CLUSTER, "--type=merge", "-p",
        json.dumps({"spec": {"retentionAudit": audit}}), namespace=apps,
    )  # fmt: skip

    # The schedule starts a run: spark-submit in a Job, the driver and an executor as pods.
    scheduled = eventually("a scheduled run", lambda: _audit_jobs(kubectl, apps), timeout=150)[0][
        "metadata"
    ]["name"]
    # Stop the schedule before that run ends (a minute missed while it ran would start at
    # once after it): the rest are requests.
    kubectl(
        "patch", "kafkacluster", CLUSTER, "--type=merge", "-p",
        json.dumps({"spec": {"retentionAudit": audit | {"suspend": True}}}), namespace=apps,
    )  # fmt: skip
    eventually(
        "the schedule to be suspended",
        lambda: (get(kubectl, apps, "cronjob", f"{CLUSTER}-audit") or {})["spec"]["suspend"],
        timeout=30,
    )
    # A request during that run waits for it.
    kubectl(
        "annotate", "--overwrite", "kafkacluster", CLUSTER, "gregor.dev/audit-retention=now",
        namespace=apps,
    )  # fmt: skip
    waiting = eventually(
        "the request to wait",
        lambda: (
            (get(kubectl, apps, "kafkacluster", CLUSTER) or {})
            .get("status", {})
            .get("retentionAudit", {})
            .get("pending")
        ),
        timeout=60,
    )
    assert waiting == ["KafkaCluster gregor"], waiting
    assert not _finished(get(kubectl, apps, "job", scheduled) or {}), "the run ended early"
    assert [j["metadata"]["name"] for j in _audit_jobs(kubectl, apps)] == [scheduled]

    _scheduled_run_ran(kubectl, apps, scheduled)
    record("retention_audit_scheduled_run_s", time.monotonic() - started)
    _check_verdicts(kubectl, apps, scheduled)
    requested = _requested_run_ran(
        kubectl,
        apps,
        scheduled,
        lambda: [j["metadata"]["name"] for j in _audit_jobs(kubectl, apps)],
    )

    # Nothing is left behind: the executors went with their runs, and the history limit (1)
    # took the older run's Job, driver and result.
    def tidy() -> bool:
        spark = _spark_pods(kubectl, apps)
        jobs = [j["metadata"]["name"] for j in _audit_jobs(kubectl, apps)]
        return jobs == [requested] and all(
            role == "driver" and name.startswith(requested) for name, (role, _) in spark.items()
        )

    eventually("the older run to be gone", tidy, timeout=120)

    def results() -> list[str]:
        return kubectl(
            "get", "configmaps", "-l", "gregor.dev/audit-result=true", "-o", "name",
            namespace=apps,
        ).split()  # fmt: skip

    eventually(
        "only the newest run's result",
        lambda: results() == [f"configmap/{requested}-result"],
        timeout=120,
    )

    # The operator's metrics say the same, for alerting.
    metrics = _operator_metrics(kubectl, release)
    at = {"namespace": apps, "cluster": CLUSTER}
    assert metrics[("gregor_retention_audit_compliant", _at(at, topic="audit-ok"))] == 1.0
    assert metrics[("gregor_retention_audit_compliant", _at(at, topic="audit-future"))] == 0.0
    past = metrics[("gregor_retention_audit_records_past_bound", _at(at, topic="audit-forever"))]
    assert past == AUDIT_RECORDS
    future = _at(at, topic="audit-future", code="FutureTimestamps")
    assert metrics[("gregor_retention_audit_findings", future)] >= 1  # one per partition hit
    assert ("gregor_retention_audit_last_success_timestamp_seconds", _at(at)) in metrics


SPARK_OPERATOR_CRDS = (
    "sparkapplications.sparkoperator.k8s.io",
    "scheduledsparkapplications.sparkoperator.k8s.io",
    "sparkconnects.sparkoperator.k8s.io",
)


@pytest.fixture(scope="module")
def spark_operator(
    request: pytest.FixtureRequest,
    kubectl: Kubectl,
    release: Release,
    spark_operator_image: str,
) -> Iterator[str]:
    """The Kubeflow Spark Operator (its controller and webhook), installed from its own chart
    as its users install it, watching the cluster's namespace. Removed at the end with its CRDs
    (Helm leaves a chart's CRDs behind), so that the shared cluster serves no SparkApplications
    and other tests' audits launch Jobs."""
    registry, rest = spark_operator_image.split("/", 1)
    repository, tag = rest.rsplit(":", 1)
    namespace = f"e2e-spark-operator-{secrets.token_hex(2)}"
    kubectl("create", "namespace", namespace)
    command = [release.helm, f"--kubeconfig={release.kubeconfig}", f"--namespace={namespace}"]

    def run(*args: str) -> None:
        done = subprocess.run([*command, *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"helm {args[0]}: {done.stderr or done.stdout}"

    run(
        "install", "spark-operator", str(spark_operator_chart()),
        f"--set=image.registry={registry}",
        f"--set=image.repository={repository}",
        f"--set=image.tag={tag}",
        f"--set=spark.jobNamespaces={{{release.apps}}}",
        # The audit brings its own service account and Role.
        "--set=spark.serviceAccount.create=false",
        "--set=spark.rbac.create=false",
        "--set=controller.uiService.enable=false",
        "--wait", "--timeout=3m",
    )  # fmt: skip
    # Spark 4.2's spark-submit makes a NetworkPolicy for each driver, which the chart's rules
    # for its controller (written for Spark 4.0) do not allow: granted as a user grants it.
    kubectl(
        "create", "role", "spark-submit-networkpolicies", "--resource=networkpolicies",
        "--verb=get,list,watch,create,patch,update,delete", namespace=release.apps,
    )  # fmt: skip
    kubectl(
        "create", "rolebinding", "spark-submit-networkpolicies",
        "--role=spark-submit-networkpolicies",
        f"--serviceaccount={namespace}:spark-operator-controller", namespace=release.apps,
    )  # fmt: skip
    yield namespace
    if request.session.testsfailed:
        collect_artifacts(namespace, kubectl)
    kubectl(
        "delete", "sparkapplications,scheduledsparkapplications", "--all", namespace=release.apps
    )
    run("uninstall", "spark-operator", "--wait", "--timeout=2m")
    kubectl("delete", "crd", *SPARK_OPERATOR_CRDS, "--ignore-not-found")
    kubectl("delete", "namespace", namespace, "--wait=false")


def _spark_applications(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    listed = kubectl(
        "get", "sparkapplications", "-l", f"gregor.dev/retention-audit={CLUSTER}", "-o", "json",
        namespace=namespace,
    )  # fmt: skip
    return sorted(json.loads(listed)["items"], key=lambda j: j["metadata"]["creationTimestamp"])


def test_retention_audits_run_as_spark_applications_where_the_spark_operator_runs(
    release: Release, kubectl: Kubectl, audit_topics: None, spark_operator: str
) -> None:
    """With the Kubeflow Spark Operator installed, the same audit (launcher `Auto`) runs as
    its ScheduledSparkApplication's runs and as requested SparkApplications: the CronJob goes,
    a request waits for the scheduled run, and the results reach the Topics' statuses."""
    apps = release.apps
    pods = {"memory": "512m", "requestCores": "100m"}
    audit = {
        "schedule": "* * * * *",
        "topicSelector": {AUDITED: "yes"},
        "maxAge": "30d",
        "historyLimit": 1,
        "deadlineSeconds": 900,
        "driver": pods,
        "executors": pods | {"instances": 1},
    }
    # A merge patch of the whole audit: `launcher` (Job before) and `suspend` go back to their
    # defaults.
    kubectl(
        "patch", "kafkacluster", CLUSTER, "--type=merge", "-p",
        json.dumps({"spec": {"retentionAudit": audit | {"launcher": None, "suspend": None}}}),
        namespace=apps,
    )  # fmt: skip
    eventually(
        "the CronJob to give way to a ScheduledSparkApplication",
        lambda: (
            get(kubectl, apps, "cronjob", f"{CLUSTER}-audit") is None
            and get(kubectl, apps, "scheduledsparkapplication", f"{CLUSTER}-audit") is not None
        ),
        timeout=60,
    )
    scheduled = eventually(
        "a scheduled SparkApplication", lambda: _spark_applications(kubectl, apps), timeout=150
    )[0]["metadata"]["name"]
    kubectl(
        "patch", "kafkacluster", CLUSTER, "--type=merge", "-p",
        json.dumps({"spec": {"retentionAudit": {"suspend": True}}}), namespace=apps,
    )  # fmt: skip
    kubectl(
        "annotate", "--overwrite", "kafkacluster", CLUSTER, "gregor.dev/audit-retention=spark",
        namespace=apps,
    )  # fmt: skip

    def waiting() -> dict[str, Any] | None:
        found = (get(kubectl, apps, "kafkacluster", CLUSTER) or {}).get("status", {})
        audits = found.get("retentionAudit") or {}
        return audits if audits.get("pending") else None

    status = eventually("the request to wait", waiting, timeout=60)
    assert status["pending"] == ["KafkaCluster gregor"], status
    assert status["launcher"] == "SparkApplication", status

    _scheduled_run_ran(kubectl, apps, scheduled, kind="sparkapplication")
    _check_verdicts(kubectl, apps, scheduled)
    requested = _requested_run_ran(
        kubectl,
        apps,
        scheduled,
        lambda: [a["metadata"]["name"] for a in _spark_applications(kubectl, apps)],
        kind="sparkapplication",
    )

    # The history limit (1) takes the scheduled run, its driver (owned by it) and its result.
    def tidy() -> bool:
        names = [a["metadata"]["name"] for a in _spark_applications(kubectl, apps)]
        results = kubectl(
            "get", "configmaps", "-l", "gregor.dev/audit-result=true", "-o", "name",
            namespace=apps,
        ).split()  # fmt: skip
        return (
            names == [requested]
            and results == [f"configmap/{requested}-result"]
            and all(name.startswith(requested) for name in _spark_pods(kubectl, apps))
        )

    eventually("the older SparkApplication to be gone", tidy, timeout=120)
