"""The CustomResourceDefinitions, generated from the models: `python -m gregor_operator.crds`
(`make crds`) writes them into `crds/` and the operator's chart, and a test fails when what
is committed differs.

What it owns: turning a pydantic model's JSON Schema into a structural OpenAPI v3 schema the
API server accepts, and the parts of a CRD that are not schema (names, printer columns, the
status subresource). Kubernetes refuses `$ref`, `anyOf` with `null` and `additionalProperties`
beside `properties`; GitOps tools report drift for noise such as titles or empty `properties`.
So references are inlined, optional fields are simply not required, titles and `null`
defaults are dropped, and object defaults are written as `{}` (the API server then fills in
each field's own default, and the models give the same values; a test checks it).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from . import GROUP, VERSION
from .models import (
    KafkaCluster,
    KafkaClusterSpec,
    KafkaClusterStatus,
    Topic,
    TopicSpec,
    TopicStatus,
    User,
    UserSpec,
    UserStatus,
)

__all__ = [
    "RESOURCES",
    "TARGETS",
    "Resource",
    "Target",
    "crd",
    "main",
    "render",
    "render_for_chart",
    "structural",
    "target_path",
]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Resource:
    model: type[BaseModel]
    spec: type[BaseModel]
    status: type[BaseModel]
    plural: str
    short_name: str
    columns: tuple[dict[str, Any], ...]
    rules: tuple[dict[str, str], ...] = ()
    """CEL rules on the whole resource (its name with its spec)."""

    @property
    def kind(self) -> str:
        return self.model.__name__

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


def _column(name: str, path: str, kind: str = "string") -> dict[str, Any]:
    """A printer column of `kubectl get`."""
    return {"name": name, "type": kind, "jsonPath": path}


_READY = '.status.conditions[?(@.type=="Ready")]'
_READY_COLUMNS = (_column("Ready", f"{_READY}.status"), _column("Reason", f"{_READY}.reason"))
_AGE = _column("Age", ".metadata.creationTimestamp", "date")

RESOURCES = (
    Resource(
        KafkaCluster,
        KafkaClusterSpec,
        KafkaClusterStatus,
        "kafkaclusters",
        "kc",
        (
            *_READY_COLUMNS,
            _column("Nodes", ".status.readyNodes"),
            _column("Bootstrap", ".status.listeners[0].bootstrapServers"),
            _AGE,
        ),
    ),
    Resource(
        Topic,
        TopicSpec,
        TopicStatus,
        "topics",
        "kt",
        (
            _column("Cluster", ".spec.cluster"),
            _column("Topic", ".status.topicName"),
            _column("Partitions", ".status.partitions", "integer"),
            _column("Replicas", ".status.replicas", "integer"),
            *_READY_COLUMNS,
            _column("Retention", ".status.retentionAudit.verdict"),
            _AGE,
        ),
        (
            {
                "rule": "has(self.spec.topicName) || self.metadata.name.size() <= 249",
                "message": "a Kafka topic name has at most 249 characters: set spec.topicName",
            },
        ),
    ),
    Resource(
        User,
        UserSpec,
        UserStatus,
        "users",
        "ku",
        (
            _column("Cluster", ".spec.cluster"),
            _column("Authentication", ".spec.authentication.type"),
            *_READY_COLUMNS,
            _AGE,
        ),
    ),
)


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The model's schema as Kubernetes takes it (see the module's docstring)."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    definitions = schema.pop("$defs", {})
    cleaned: dict[str, Any] = _clean(schema, definitions)
    return cleaned


def _clean(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_clean(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(definitions[node.pop("$ref").rsplit("/", 1)[1]])
        node = target | node  # the field's own description and default win
    branches = node.get("anyOf")
    if branches is not None:
        kept = [branch for branch in branches if branch != {"type": "null"}]
        if len(kept) == 1:
            del node["anyOf"]
            node = _clean(kept[0], definitions) | node
    node.pop("title", None)
    if "const" in node:  # a one-value Literal: OpenAPI v3.0 has no `const`
        node["enum"] = [node.pop("const")]
    if isinstance(node.get("description"), str):
        node["description"] = _unwrapped(node["description"])
    if node.get("default", ...) is None:
        del node["default"]
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if isinstance(node.get("default"), dict):
        node["default"] = {}
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "x-kubernetes-validations", "default", "enum"):
            cleaned[key] = (
                {name: _clean(sub, definitions) for name, sub in value.items()}
                if key == "properties"
                else value
            )
        else:
            cleaned[key] = _clean(value, definitions)
    if cleaned.get("properties") == {}:
        del cleaned["properties"]
    return _ordered(cleaned)


def _unwrapped(text: str) -> str:
    """A docstring's lines joined back into paragraphs."""
    return "\n\n".join(" ".join(part.split()) for part in text.strip().split("\n\n"))


_ORDER = ("description", "type")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Description and type first, the rest as pydantic gives it: stable, readable YAML."""
    first = {key: node[key] for key in _ORDER if key in node}
    return first | {key: value for key, value in node.items() if key not in first}


def crd(resource: Resource) -> dict[str, Any]:
    spec = structural(resource.spec)
    status = structural(resource.status)
    schema: dict[str, Any] = {
        "description": _unwrapped(resource.model.__doc__ or ""),
        "type": "object",
        "required": ["spec"],
        "properties": {"spec": spec, "status": status},
    }
    if resource.rules:
        schema["x-kubernetes-validations"] = list(resource.rules)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": resource.name},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": [resource.short_name],
                "categories": ["gregor"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(resource.columns),
                }
            ],
        },
    }


_HEADER = "# Generated from operator/gregor_operator/models.py by `make crds`: do not edit.\n"


def render(resource: Resource) -> str:
    """The CRD as the YAML file that holds it."""
    return _HEADER + str(yaml.safe_dump(crd(resource), sort_keys=False, width=100))


def render_for_chart(resource: Resource) -> str:
    """The CRD as a template of the operator's chart: installed when `crds.install` is on,
    updated by `helm upgrade` (which never touches a chart's `crds/` directory), and kept
    when the release is uninstalled, so that no user's cluster goes with it."""
    document = crd(resource)
    document["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
    text = str(yaml.safe_dump(document, sort_keys=False, width=100))
    if "{{" in text:
        raise ValueError(f"{resource.name}'s schema holds '{{{{', which Helm reads as a template")
    return f"{{{{- if .Values.crds.install }}}}\n{_HEADER}{text}{{{{- end }}}}\n"


@dataclass(frozen=True, slots=True)
class Target:
    directory: Path
    render: Callable[[Resource], str]
    prefix: str = ""


TARGETS = (
    Target(ROOT / "crds", render),
    Target(ROOT / "charts" / "gregor-operator" / "templates", render_for_chart, "crd-"),
)
"""Where the CRDs are written: `crds/`, for `kubectl apply --server-side -f crds/`, and the
operator's chart."""


def target_path(target: Target, resource: Resource) -> Path:
    return target.directory / f"{target.prefix}{resource.file_name}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gregor_operator.crds", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="only say whether the committed files are current"
    )
    arguments = parser.parse_args(argv)
    stale = []
    for target in TARGETS:
        for resource in RESOURCES:
            path = target_path(target, resource)
            text = target.render(resource)
            current = path.read_text() if path.exists() else None
            if current == text:
                continue
            stale.append(path)
            if not arguments.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    for path in stale:
        print(f"{'stale' if arguments.check else 'wrote'} {path.relative_to(ROOT)}")
    return 1 if arguments.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
