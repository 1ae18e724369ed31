"""Reading Kubernetes objects in the e2e tests: one object as JSON (None when it does not
exist), a condition of its status, whether a custom resource is Ready for its current
generation, and waiting until a check holds. Shared by the operator's tests on the host
(`test_operator.py`) and in the cluster (`test_helm.py`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from e2e.conftest import Kubectl

TIMEOUT_S = 120.0


def get(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(
            kubectl("get", kind, name, "-o", "json", "--show-managed-fields", namespace=namespace)
        )
    except AssertionError as exc:
        if "NotFound" in str(exc):
            return None
        raise
    return found


def eventually(what: str, check: Callable[[], Any], timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(1)


def condition(resource: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (resource.get("status") or {}).get("conditions") or []:
        if found["type"] == kind:
            return dict(found)
    return None


def ready(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """The resource, once its status is Ready and says so of its current generation."""
    found = get(kubectl, namespace, kind, name)
    if found is None:
        return None
    is_ready = condition(found, "Ready")
    observed = (found.get("status") or {}).get("observedGeneration")
    if is_ready is None or is_ready["status"] != "True":
        return None
    return found if observed == found["metadata"]["generation"] else None
