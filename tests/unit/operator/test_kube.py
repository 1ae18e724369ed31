"""What the adapter reads of a pod for the planner: here, why its node last refused to start,
from the end of its log that Kubernetes keeps as the container's termination message."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gregor_operator.kube import _last_error


def _pod(state: Any = None, last_state: Any = None) -> Any:
    container = SimpleNamespace(state=state, last_state=last_state)
    return SimpleNamespace(status=SimpleNamespace(container_statuses=[container]))


def _terminated(message: str | None) -> Any:
    return SimpleNamespace(terminated=SimpleNamespace(message=message))


def test_the_nodes_last_words_are_its_refusal_without_the_log_around_it() -> None:
    log = (
        "2026-11-27 10:00:00,000 INFO gregor: a log line that only looks like it\n"
        "gregor: the metadata log dir /var/lib/gregor/log is not formatted: it has no "
        "meta.properties.\n"
    )
    waiting = SimpleNamespace(terminated=None)
    said = _last_error(_pod(waiting, _terminated(log)))
    assert said == (
        "the metadata log dir /var/lib/gregor/log is not formatted: it has no meta.properties."
    )
    assert _last_error(_pod(_terminated(log))) == said
    assert _last_error(_pod(waiting, _terminated("Traceback (most recent call last):\n"))) is None
    assert _last_error(_pod(waiting, _terminated(None))) is None
    assert _last_error(_pod()) is None
    assert _last_error(SimpleNamespace(status=None)) is None
