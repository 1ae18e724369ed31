"""A fault-injection run on three combined nodes: the topics, the producers, each fault of the
schedule followed by its recovery, and the checker at the end (and on every incarnation that a
`recreate` retires).

The order of a run:

1. start the cluster (`three_nodes`), create the topics (replication factor 3,
   `min.insync.replicas=2`), wait for full ISR, start producing;
2. for each fault: inject it, bring the node back, and wait until every node says every
   partition has its full ISR (`cluster_view.wait_settled`). A recovery not within
   `recovery_timeout`, or a node that will not start, stops the injecting: the run goes on to
   its end and reports it, with every node's description and log;
3. stop producing (every record settled: acknowledged or failed), wait for full ISR, read
   every partition back from its log start and check each topic's current incarnation.

What it must never do: inject a fault before the previous one has recovered, or leave a node
paused or stopped behind it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.faults.checker import Verdict, check, duplicates
from tests.faults.cluster_view import (
    NODE_IDS,
    NotSettled,
    create_topic,
    delete_topic,
    topic_id,
    wait_settled,
)
from tests.faults.plan import Fault, Settings, draw
from tests.faults.readback import logged_errors, producer_marks, read_partitions
from tests.faults.report import Outcome, Report
from tests.faults.stamps import Incarnation, Ledger
from tests.faults.workload import Workload
from tests.support.clusters import ThreeNodes, three_nodes

__all__ = ["CLUSTER_SETTINGS", "run"]

CLUSTER_SETTINGS = {"leader.imbalance.check.interval.seconds": "30"}
"""Preferred leaders are elected back every 30 s (Kafka's default is 300): leadership keeps
moving back onto the nodes that come back, so that faults keep hitting leaders."""

_STOP_TIMEOUT = 60.0


class _Stopped(Exception):
    """A fault could not be recovered from; the run goes to its end."""


def _commit() -> str:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return found.stdout.strip()


def run(
    system: str,
    directory: Path,
    settings: Settings,
    *,
    say: Callable[[str], None] = print,
    report_file: Path | None = None,
) -> Report:
    """Play `draw(settings)` on three nodes of `system` ("gregor" or "kafka") under
    `directory`; the report is written to `report_file` (JSON) after every fault and at the
    end, so a long run can be read while it goes."""
    started = time.monotonic()
    report = Report(
        system, settings, _commit(), datetime.datetime.now(datetime.UTC).isoformat(" ", "seconds")
    )
    cluster_settings = CLUSTER_SETTINGS | {
        "broker.session.timeout.ms": str(settings.session_timeout_ms),
        "broker.heartbeat.interval.ms": str(settings.heartbeat_interval_ms),
    }
    with three_nodes(system, directory, cluster_settings) as nodes:
        _Run(nodes, settings, report, say, started, report_file).play()
    report.wall_seconds = time.monotonic() - started
    report.finished = True
    _write(report, report_file)
    return report


def _write(report: Report, report_file: Path | None) -> None:
    if report_file is not None:
        temporary = report_file.with_suffix(report_file.suffix + ".tmp")
        temporary.write_text(json.dumps(report.as_json(), indent=1) + "\n")
        temporary.replace(report_file)


class _Run:
    def __init__(
        self,
        nodes: ThreeNodes,
        settings: Settings,
        report: Report,
        say: Callable[[str], None],
        started: float,
        report_file: Path | None,
    ) -> None:
        self.nodes = nodes
        self.settings = settings
        self.report = report
        self.say = say
        self.started = started
        self.report_file = report_file
        self.ledger = Ledger()
        self.topics = dict.fromkeys(settings.topic_names(), settings.partitions)
        self.current = {topic: Incarnation(topic, 1) for topic in self.topics}
        self.configs = {"min.insync.replicas": str(settings.min_insync_replicas)}
        self.workload = Workload(
            nodes.bootstrap,
            self.ledger,
            settings.partitions,
            rate=settings.rate,
            message_timeout_ms=settings.message_timeout_ms,
        )

    def play(self) -> None:
        for topic, partitions in self.topics.items():
            create_topic(self.nodes, topic, partitions, self.configs)
        wait_settled(self.nodes, self.topics, self.settings.recovery_timeout)
        for incarnation in self.current.values():
            self.workload.open(incarnation)
        self.workload.start()
        budget = self.settings.budget_seconds
        try:
            for fault in draw(self.settings):
                if budget is not None and time.monotonic() - self.started > budget:
                    self.say(
                        f"the time budget ({budget:.0f} s) is spent: {fault.number - 1} faults"
                    )
                    break
                self._inject(fault)
                self.report.wall_seconds = time.monotonic() - self.started
                self._sync_counts()
                _write(self.report, self.report_file)
        except _Stopped as stopped:
            self.report.failure = str(stopped)
            self._keep_logs()
        except Exception:  # the harness's own failure: still end the run and check it
            self.report.failure = f"the run failed:\n{traceback.format_exc()}"
            self._keep_logs()
        finally:
            self._start_every_node()
            self.workload.stop()
        self._finish()

    def _finish(self) -> None:
        try:
            wait_settled(self.nodes, self.topics, self.settings.final_timeout)
            self.report.final_isr = True
        except NotSettled as error:
            self.report.failure = self.report.failure or f"at the end: {error}"
            self._keep_logs()
        for incarnation in self.current.values():
            self._check(incarnation)
        self._sync_counts()
        self.report.logged_errors = {
            n: dict(logged_errors(self.nodes, n).most_common(20)) for n in NODE_IDS
        }

    def _sync_counts(self) -> None:
        self.report.acknowledged = self.ledger.acknowledged
        self.report.failed = self.ledger.failed
        self.report.send_errors = self.ledger.errors.copy()
        self.report.fatal_errors = self.workload.fatal_errors.copy()

    def _keep_logs(self) -> None:
        self.report.logs = {n: self.nodes.log_tail(n) for n in NODE_IDS}

    def _check(self, incarnation: Incarnation) -> Verdict:
        """Read `incarnation` back (its producer closed) and check it; its sends are then
        forgotten (their counts stay)."""
        try:
            reads = read_partitions(self.nodes, incarnation.topic, self.topics[incarnation.topic])
        except AssertionError as error:
            self.report.failure = self.report.failure or f"reading {incarnation}: {error}"
            self._keep_logs()
            reads = {}
        records = {p: read.records for p, read in reads.items()}
        copies = duplicates(records)
        marks = producer_marks(self.nodes, incarnation.topic, copies) if copies else {}
        verdict = check(incarnation, self.ledger.sends(incarnation), records, marks)
        moved_start = {p: r.log_start for p, r in reads.items() if r.log_start != 0}
        if moved_start:
            verdict.problems["lost"].append(f"log start offsets moved: {moved_start}")
        self.report.verdicts.append(verdict)
        self.ledger.forget(incarnation)
        self.say(f"  checked {verdict.summary()}")
        if not verdict.ok:
            self._keep_logs()
            self.report.client_log[verdict.incarnation] = list(self.workload.client_log)
        return verdict

    # -- the faults ---------------------------------------------------------------------------

    def _inject(self, fault: Fault) -> None:
        at = time.monotonic()
        detail = ""
        try:
            if fault.kind == "kill":
                self.nodes.kill(fault.node)
                time.sleep(fault.seconds)
                self._restart(fault)
            elif fault.kind == "pause":
                with self._paused(fault.node):
                    time.sleep(fault.seconds)
            elif fault.kind == "terminate":
                detail = self._stop(fault)
                time.sleep(fault.seconds)
                self._restart(fault)
            elif fault.kind == "lost_disk":
                detail = self._stop(fault)
                self.nodes.replace_disk(fault.node)
                self._restart(fault)
            elif fault.kind == "recreate":
                detail = self._recreate(fault)
            else:
                raise AssertionError(f"no such fault kind: {fault.kind}")
        except _Stopped:
            self.report.outcomes.append(
                Outcome(fault, at - self.started, time.monotonic() - at, None, detail)
            )
            raise
        back = time.monotonic()
        outcome = Outcome(fault, at - self.started, back - at, None, detail)
        self.report.outcomes.append(outcome)
        try:
            outcome.recovery = wait_settled(self.nodes, self.topics, self.settings.recovery_timeout)
        except NotSettled as error:
            raise _Stopped(f"fault {fault.number} ({fault.describe()}): {error}") from None
        self.say(
            f"[{fault.number}/{self.settings.faults}] {fault.describe()}: back after "
            f"{outcome.outage:.1f} s, full ISR {outcome.recovery:.1f} s later"
            + (f" ({detail})" if detail else "")
        )

    @contextlib.contextmanager
    def _paused(self, node: int) -> Iterator[None]:
        self.nodes.pause(node)
        try:
            yield
        finally:
            self.nodes.resume(node)

    def _stop(self, fault: Fault) -> str:
        """SIGTERM; what the exit said, when it was not clean."""
        try:
            code = self.nodes.stop(fault.node)
        except subprocess.TimeoutExpired:
            self.nodes.kill(fault.node)
            said = f"no exit within {_STOP_TIMEOUT:.0f} s of SIGTERM (killed)"
        else:
            if code == 0:
                return ""
            said = f"exit code {code} on SIGTERM"
        self.report.unclean_exits.append(f"fault {fault.number}, node {fault.node}: {said}")
        return said

    def _restart(self, fault: Fault) -> None:
        try:
            self.nodes.restart(fault.node)
        except RuntimeError as error:
            self._keep_logs()
            raise _Stopped(
                f"fault {fault.number} ({fault.describe()}): node {fault.node} did not start "
                f"again: {str(error)[:2000]}"
            ) from None

    def _recreate(self, fault: Fault) -> str:
        topic = fault.topic
        old = self.workload.close(topic)
        old_id = topic_id(self.nodes, topic)
        self._check(old)
        if fault.node_down:
            self.nodes.kill(fault.node)
        running = [n for n in NODE_IDS if self.nodes.running(n)]
        try:
            delete_topic(self.nodes, topic, running)
            create_topic(self.nodes, topic, self.topics[topic], self.configs, not_id=old_id)
        except AssertionError as error:
            raise _Stopped(f"fault {fault.number} ({fault.describe()}): {error}") from None
        new = Incarnation(topic, old.number + 1)
        self.current[topic] = new
        self.workload.open(new)
        new_id = topic_id(self.nodes, topic)
        if fault.node_down:
            time.sleep(fault.seconds)
            self._restart(fault)
        return f"{old} ({old_id}) -> {new} ({new_id})"

    def _start_every_node(self) -> None:
        """Whatever stopped the run, no node stays paused or down for the end."""
        for node in NODE_IDS:
            with contextlib.suppress(ProcessLookupError):
                self.nodes.resume(node)
            if not self.nodes.running(node):
                try:
                    self.nodes.restart(node)
                except RuntimeError as error:
                    self.report.failure = self.report.failure or f"node {node}: {error}"
