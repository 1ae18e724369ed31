"""The e2e tier's client pod: a pod of the broker image with `kafka_client.py`, inside the
cluster where the brokers' names resolve, driven with `kubectl exec`; and where the tests
keep the figures they measure for docs/. Used by `test_helm.py` and `test_zones.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.conftest import ARTIFACTS, Kubectl

__all__ = ["client_pod", "record", "run_client"]


def client_pod(
    kubectl: Kubectl, namespace: str, bootstrap: str, image: str, *, zone: str | None = None
) -> None:
    """Pod `client` (its ConfigMap `kafka-client` holds the program), Ready; `zone`: the
    value of `topology.kubernetes.io/zone` its node must have."""
    kubectl(
        "create", "configmap", "kafka-client",
        f"--from-file=kafka_client.py={Path(__file__).with_name('kafka_client.py')}",
        namespace=namespace,
    )  # fmt: skip
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "client",
                "image": image,
                "command": ["python3", "-c", "import time; time.sleep(1e9)"],
                "env": [{"name": "BOOTSTRAP", "value": bootstrap}],
                "volumeMounts": [{"name": "client", "mountPath": "/client"}],
            }
        ],
        "volumes": [{"name": "client", "configMap": {"name": "kafka-client"}}],
    }
    if zone is not None:
        spec["nodeSelector"] = {"topology.kubernetes.io/zone": zone}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"}, "spec": spec}
    kubectl("apply", "-f", "-", namespace=namespace, stdin=json.dumps(pod))
    kubectl("wait", "--for=condition=Ready", "pod/client", "--timeout=120s", namespace=namespace)


def run_client(kubectl: Kubectl, namespace: str, *args: str) -> Any:
    """One `kafka_client.py` command in the client pod; the JSON it printed last."""
    said = kubectl(
        "exec", "client", "--", "python3", "/client/kafka_client.py", *args, namespace=namespace
    )
    return json.loads(said.splitlines()[-1])


def record(name: str, seconds: float) -> None:
    """A figure for docs/: printed, and kept under var/e2e/timings.json."""
    print(f"{name} = {seconds:.0f}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    timings[name] = round(seconds, 1)
    path.write_text(json.dumps(timings, indent=2))
