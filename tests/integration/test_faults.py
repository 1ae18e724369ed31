"""A short fault-injection run (`tests/faults`) on three combined nodes of each system: an
idempotent `acks=all` producer writes to two topics (three partitions each, replication factor
3, `min.insync.replicas=2`) while SIGKILLs, SIGSTOPs, SIGTERMs, lost disks and topics deleted
and created again hit the cluster one after another, each followed by its recovery to full
ISR. At the end, and on every topic incarnation a re-creation retires, every partition is
read back: no acknowledged record lost, none twice, none of another topic or of an earlier
topic of the same name, all in the order they were sent, and every partition at full ISR.
What a system may fail, and why, is `ALLOWED`.

Both systems play the same schedule (`GREGOR_FAULTS_SEED`); Apache Kafka, whose JVM takes
15-20 s to start again on this machine, plays its first `FAULTS["kafka"]` faults, which hold
every kind. `GREGOR_FAULTS=N` plays N faults on both. Recorded runs of a thousand faults are
`python -m tests.faults` (docs/fault-injection.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.plan import FAULT_KINDS, Settings, draw
from tests.faults.run import run
from tests.support.clusters import KINDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = int(os.environ.get("GREGOR_FAULTS_SEED", "40"))
FAULTS = {
    kind: int(os.environ.get("GREGOR_FAULTS", default))
    for kind, default in (("gregor", 30), ("kafka", 8))
}
"""About 3 to 5 minutes each on two cores shared with other work: Gregor's faults take 7-10 s
each with their recovery, Kafka's 20-30 s."""

ALLOWED: dict[str, dict[str, str]] = {
    "gregor": {
        "duplicated_across_epochs": (
            "the client's: librdkafka sends a record again under a new producer epoch when it "
            "cannot tell whether the first send was written (KIP-360), and idempotence holds "
            "within one epoch only; the checker proves the epochs differ (Fetch by hand), and "
            "test_idempotent_leader_change shows Kafka gives the answers that lead to it"
        ),
    },
    "kafka": {
        "duplicated_across_epochs": "as for Gregor: the client's",
        "duplicated": (
            "Apache Kafka 4.3.1 itself, in one of seven runs of seed 40: a record at two "
            "offsets after the preferred leader, back from a SIGTERM, took over without the "
            "old leader's last batch, refused the next ones (OUT_OF_ORDER_SEQUENCE_NUMBER) "
            "and was killed; found before the checker read producer epochs, so whether the "
            "copies share one is not known (docs/fault-injection.md)"
        ),
    },
}
"""What each system may fail, by check name (`tests.faults.checker.CHECKS`, and
`unclean_exit` for a SIGTERM not answered by a clean exit), with the reason. Everything else
must hold: no acknowledged record lost, moved or out of order, none of another topic or
incarnation, none twice under one producer epoch (on Gregor), full ISR at the end."""


def test_the_short_schedule_holds_every_fault_kind() -> None:
    """What the Kafka run proves covers every kind Gregor's is judged on."""
    played = draw(Settings(faults=min(FAULTS.values()), seed=SEED))
    assert {fault.kind for fault in played} == set(FAULT_KINDS)
    assert any(fault.node_down for fault in played)


@pytest.mark.timeout(300 + 60 * max(FAULTS.values()))
@pytest.mark.parametrize("kind", KINDS)
def test_no_acknowledged_record_is_lost_duplicated_or_served_from_another_topic(
    kind: str, tmp_path: Path
) -> None:
    report = run(
        kind,
        tmp_path,
        Settings(faults=FAULTS[kind], seed=SEED),
        say=lambda line: print(line, flush=True),
        report_file=tmp_path / "report.json",
    )
    print(report.summary())
    evidence = "\n".join(
        f"{check}: {line}"
        for verdict in report.verdicts
        for check, lines in verdict.problems.items()
        for line in lines[:10]
    )
    logs = "".join(f"\n--- node {n} ---\n{tail[-3000:]}" for n, tail in report.logs.items())
    said = f"{report.summary()}\n{evidence}{logs}"
    assert report.failure is None, said
    assert report.final_isr, said
    assert len(report.outcomes) == FAULTS[kind], said
    failing = {check for check, count in report.problems().items() if count}
    if report.unclean_exits:
        failing.add("unclean_exit")
    assert failing <= set(ALLOWED[kind]), said
