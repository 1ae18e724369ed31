"""Cluster ids: made in Kafka's form, and passed on a command line whatever they start with."""

from __future__ import annotations

import uuid

import pytest

from broker.cli import build_parser
from broker.node import new_cluster_id


def test_a_new_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for uuid4: the first UUID's base64 starts with "-" (its top six bits are 62).
    made = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" * 16)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(made))
    assert new_cluster_id() == "EBAQEBAQEBAQEBAQEBAQEA"
    monkeypatch.undo()
    assert all(not new_cluster_id().startswith("-") for _ in range(1000))


@pytest.mark.parametrize("command", ["format", "broker"])
def test_an_id_that_starts_with_a_dash_is_read_in_the_form_the_operator_writes(
    command: str,
) -> None:
    """Clusters made before the rule above may have one (the operator keeps an id for life):
    its pods format a new node's dirs with it, and start every node checking its dirs are
    that cluster's."""
    args = build_parser().parse_args(
        [command, "--config", "server.properties", "--cluster-id=-kU3OEVBNTcwNTJENDM2Qk"]
    )
    assert args.cluster_id == "-kU3OEVBNTcwNTJENDM2Qk"
