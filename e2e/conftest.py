"""End-to-end fixtures: a real cluster (brought up, or reused), a namespace per test, and the
logs and events of a failed test's namespace kept under `var/e2e/`.

The cluster outlives the test session on purpose: bringing it up is the slow part, and
`make cluster-down` stops it. Set GREGOR_E2E_KUBECONFIG to run the suite against another
cluster (the images it needs must then be there already); otherwise `localkube` brings up
(or finds) the local one. A KUBECONFIG of your own is never used, so `make test` cannot touch
a cluster you work with.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from localkube.build import ensure_binaries, spark_operator_binary
from localkube.cluster import load_images, up
from localkube.images import (
    PROJECT_TAG,
    PYTHON_IMAGE,
    SPARK_OPERATOR_IMAGE,
    build_project_images,
    build_spark_operator_image,
    ensure_base_image,
)
from localkube.versions import SPARK_OPERATOR_VERSION

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "var" / "e2e"
CRDS = sorted((ROOT / "crds").glob("*.yaml"))

Kubectl = Callable[..., str]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed
        funcargs = getattr(item, "funcargs", {})
        if report.failed and "namespace" in funcargs and "kubectl" in funcargs:
            # The artifacts stay on the machine that ran the test; CI shows only the report.
            report.sections.append(
                ("cluster state", _summary(funcargs["namespace"], funcargs["kubectl"]))
            )


_FAILED = pytest.StashKey[bool]()


EXTERNAL = "GREGOR_E2E_KUBECONFIG"


@pytest.fixture(scope="session")
def kubeconfig() -> Path:
    given = os.environ.get(EXTERNAL)
    if given:
        return Path(given)
    return up()


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return api


@pytest.fixture(scope="session")
def python_image(kubeconfig: Path) -> str:
    """The project's Python base image (`gregor/python:3.11-bookworm`), loaded into the
    cluster's runtime: a small server or client for a test's own pods."""
    if os.environ.get(EXTERNAL):
        return PYTHON_IMAGE
    tag = ensure_base_image()
    _load([tag], kubeconfig)
    return tag


@pytest.fixture(scope="session")
def broker_image(kubeconfig: Path) -> str:
    """`gregor-broker:dev`, built from this checkout and loaded into the cluster's runtime."""
    return _project_image("broker", kubeconfig)


@pytest.fixture(scope="session")
def operator_image(kubeconfig: Path) -> str:
    """`gregor-operator:dev`, built from this checkout and loaded into the cluster's runtime."""
    return _project_image("operator", kubeconfig)


@pytest.fixture(scope="session")
def spark_image(kubeconfig: Path) -> str:
    """`gregor-spark:dev` (the retention audit), built from this checkout and loaded."""
    return _project_image("spark", kubeconfig)


@pytest.fixture(scope="session")
def spark_operator_image(kubeconfig: Path, spark_image: str) -> str:
    """`gregor/spark-operator:<version>`: the Kubeflow Spark Operator, built here from its Go
    module on `gregor-spark`, and loaded."""
    if os.environ.get(EXTERNAL):
        return f"{SPARK_OPERATOR_IMAGE}:{SPARK_OPERATOR_VERSION}"
    binary = spark_operator_binary(log=lambda _: None)
    ref = build_spark_operator_image(binary, SPARK_OPERATOR_VERSION, spark_image)
    _load([ref], kubeconfig)
    return ref


def _project_image(name: str, kubeconfig: Path) -> str:
    """`gregor-<name>:dev`: built and loaded here, or expected on another cluster already."""
    if os.environ.get(EXTERNAL):
        return f"gregor-{name}:{PROJECT_TAG}"
    tags = build_project_images(ensure_base_image(), [name])
    _load(tags, kubeconfig)
    return tags[0]


def _load(tags: list[str], kubeconfig: Path) -> None:
    if load_images(tags, log=lambda _: None) is None:
        raise RuntimeError(f"no cluster `make cluster` made runs to load {', '.join(tags)} into")


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Kubectl:
    """kubectl against the cluster: `kubectl("get", "pods", namespace=ns)` → stdout; raises
    with kubectl's message when it fails."""
    binary = os.environ.get("KUBECTL") or _built_kubectl()

    def run(*args: str, namespace: str | None = None, stdin: str | None = None) -> str:
        command = [binary, f"--kubeconfig={kubeconfig}"]
        if namespace is not None:
            command.append(f"--namespace={namespace}")
        result = subprocess.run(
            [*command, *args], input=stdin, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout

    return run


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> None:
    """The CRDs, applied as a user applies them (they stay: the cluster is shared)."""
    for path in CRDS:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in CRDS]
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, api: client.ApiClient, kubectl: Kubectl
) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"e2e-{slug}-{secrets.token_hex(2)}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    if request.node.stash.get(_FAILED, False):
        collect_artifacts(name, kubectl)
    core.delete_namespace(name)


def _summary(namespace: str, kubectl: Kubectl) -> str:
    """What a failed test's report shows of the cluster: the node's conditions that are not
    as they should be (DiskPressure stops new pods from being scheduled), the namespace's pods,
    its latest events and the end of each pod's log."""
    parts = []
    conditions = (
        "{range .items[*]}{.metadata.name}{range .status.conditions[*]}"
        '{" "}{.type}={.status}{end}{"\\n"}{end}'
    )
    for title, args, in_namespace in (
        ("nodes", ("get", "nodes", "-o", f"jsonpath={conditions}"), False),
        ("pods", ("get", "pods", "-o", "wide"), True),
        ("events", ("get", "events", "--sort-by=.lastTimestamp"), True),
    ):
        try:
            text = kubectl(*args, namespace=namespace if in_namespace else None)
        except AssertionError as exc:
            text = str(exc)
        parts.append(f"--- {title}\n" + "\n".join(text.splitlines()[-25:]))
    try:
        pods = kubectl("get", "pods", "-o", "name", namespace=namespace).split()
    except AssertionError:
        pods = []
    for pod in pods:
        try:
            logs = kubectl("logs", pod, "--all-containers", "--tail=20", namespace=namespace)
        except AssertionError as exc:
            logs = str(exc)
        parts.append(f"--- {pod} (last lines of its log)\n{logs}")
    return "\n".join(parts)


def collect_artifacts(namespace: str, kubectl: Kubectl) -> None:
    """Events, descriptions and every container's logs of a failed test's namespace."""
    folder = ARTIFACTS / namespace
    folder.mkdir(parents=True, exist_ok=True)
    for file, args in {
        "events.txt": ("get", "events", "--sort-by=.lastTimestamp"),
        "describe.txt": ("describe", "all,pvc"),
        "resources.yaml": ("get", "all,pvc,configmaps", "-o", "yaml"),
    }.items():
        try:
            (folder / file).write_text(kubectl(*args, namespace=namespace))
        except AssertionError as exc:
            (folder / file).write_text(str(exc))
    pods = kubectl("get", "pods", "-o", "name", namespace=namespace).split()
    for pod in pods:
        try:
            logs = kubectl("logs", pod, "--all-containers", "--prefix", namespace=namespace)
        except AssertionError as exc:
            logs = str(exc)
        (folder / f"{pod.replace('/', '-')}.log").write_text(logs)


def _built_kubectl() -> str:
    return str(ensure_binaries(log=lambda _: None).kubectl)
