"""One Helm release of the operator's chart, for the e2e tests that install it as a user does
(`test_helm.py`, `test_zones.py`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from e2e.conftest import Kubectl

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gregor-operator"


class Release:
    """One Helm release of the chart, watching one namespace."""

    def __init__(self, helm: str, kubeconfig: Path, name: str, system: str, apps: str) -> None:
        self.helm, self.kubeconfig = helm, kubeconfig
        self.name, self.system, self.apps = name, system, apps

    def run(self, command: str, *args: str) -> str:
        result = subprocess.run(
            [
                self.helm,
                command,
                self.name,
                *([str(CHART)] if command in ("install", "upgrade") else []),
                f"--kubeconfig={self.kubeconfig}",
                f"--namespace={self.system}",
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"helm {command}: {result.stderr or result.stdout}"
        return result.stdout

    def values(self, broker_image: str, operator_image: str, spark_image: str) -> list[str]:
        broker, broker_tag = broker_image.rsplit(":", 1)
        operator, operator_tag = operator_image.rsplit(":", 1)
        spark, spark_tag = spark_image.rsplit(":", 1)
        return [
            f"--set=sparkImage.repository={spark}",
            f"--set=sparkImage.tag={spark_tag}",
            f"--set=image.repository={operator}",
            f"--set=image.tag={operator_tag}",
            f"--set=brokerImage.repository={broker}",
            f"--set=brokerImage.tag={broker_tag}",
            f"--set=watchNamespaces={{{self.apps}}}",
            "--set=reconcileIntervalSeconds=3",
        ]

    def adopt_crds(self, kubectl: Kubectl) -> None:
        """CRDs applied from `crds/` by hand (or by an earlier release) are handed to this
        release, as Helm documents it: its labels and annotations on them."""
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            if not kubectl("get", "crd", name, "--ignore-not-found", "-o", "name").strip():
                continue
            kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")
            kubectl(
                "annotate",
                "--overwrite",
                "crd",
                name,
                f"meta.helm.sh/release-name={self.name}",
                f"meta.helm.sh/release-namespace={self.system}",
            )
