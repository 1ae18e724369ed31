"""A run's report: the faults as they went, the checker's verdicts, the figures (records
acknowledged and failed, time to recover by fault kind), and what failed; as text for a
person and as JSON for a file. Pure."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.faults.checker import CHECKS, Verdict
from tests.faults.plan import Fault, Settings

__all__ = ["Outcome", "Report"]


@dataclass
class Outcome:
    fault: Fault
    started: float
    """Seconds into the run."""
    outage: float
    """Seconds from the fault until the node was back (listening again, resumed) or the topic
    created again."""
    recovery: float | None = None
    """Seconds from then until every node said every partition had its full ISR (None: not
    within the recovery timeout)."""
    detail: str = ""


@dataclass
class Report:
    system: str
    settings: Settings
    commit: str
    date: str
    outcomes: list[Outcome] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    acknowledged: int = 0
    failed: int = 0
    send_errors: Counter[str] = field(default_factory=Counter)
    fatal_errors: Counter[str] = field(default_factory=Counter)
    unclean_exits: list[str] = field(default_factory=list)
    """SIGTERMs a node did not answer with a clean exit."""
    failure: str | None = None
    """What stopped the run early (a recovery not within its bound, a node that would not
    start) or kept the end from full ISR; None if nothing did."""
    final_isr: bool = False
    finished: bool = False
    """False while the run goes on (the report is written after every fault)."""
    wall_seconds: float = 0.0
    logs: dict[int, str] = field(default_factory=dict)
    """The nodes' log tails, kept when something failed."""
    client_log: dict[str, list[str]] = field(default_factory=dict)
    """The producers' log lines (librdkafka's) up to each failed verdict, by incarnation."""
    logged_errors: dict[int, dict[str, int]] = field(default_factory=dict)
    """Each node's ERROR log lines by message (numbers blanked), whatever the verdicts: not
    judged, but where a bug that lost nothing this time shows first."""

    @property
    def ok(self) -> bool:
        return (
            self.failure is None
            and self.final_isr
            and not self.unclean_exits
            and bool(self.verdicts)
            and all(v.ok for v in self.verdicts)
        )

    def problems(self) -> Counter[str]:
        """Every check's count over every verdict (0 for a check that held)."""
        total: Counter[str] = Counter(dict.fromkeys(CHECKS, 0))
        for verdict in self.verdicts:
            total.update(verdict.counts())
        return total

    def recovery_figures(self) -> dict[str, dict[str, float | int]]:
        """By fault kind: how many, and the median and maximum of their recovery (to full
        ISR once the node was back) and of their outage plus recovery."""
        figures: dict[str, dict[str, float | int]] = {}
        for kind in self.settings.kinds:
            done = [o for o in self.outcomes if o.fault.kind == kind and o.recovery is not None]
            count = sum(1 for o in self.outcomes if o.fault.kind == kind)
            if not done:
                figures[kind] = {"faults": count}
                continue
            recoveries = [o.recovery for o in done if o.recovery is not None]
            totals = [o.outage + r for o, r in zip(done, recoveries, strict=True)]
            figures[kind] = {
                "faults": count,
                "recovery_median_s": round(statistics.median(recoveries), 1),
                "recovery_max_s": round(max(recoveries), 1),
                "total_median_s": round(statistics.median(totals), 1),
                "total_max_s": round(max(totals), 1),
            }
        return figures

    def summary(self) -> str:
        minutes, seconds = divmod(round(self.wall_seconds), 60)
        lines = [
            f"{self.system}, seed {self.settings.seed}, commit {self.commit}, {self.date}: "
            f"{len(self.outcomes)} of {self.settings.faults} faults in {minutes} min {seconds} s"
            f" -> {('OK' if self.ok else 'FAILED') if self.finished else 'running'}",
            f"records: {self.acknowledged} acknowledged, {self.failed} failed "
            f"({dict(self.send_errors.most_common())})",
            "checks: "
            + ", ".join(f"{check} {count}" for check, count in self.problems().items())
            + f" over {len(self.verdicts)} incarnations; full ISR at the end: {self.final_isr}",
        ]
        for kind, figures in self.recovery_figures().items():
            if "recovery_median_s" in figures:
                lines.append(
                    f"  {kind}: {figures['faults']} faults, recovery median "
                    f"{figures['recovery_median_s']} s max {figures['recovery_max_s']} s; "
                    f"fault to full ISR median {figures['total_median_s']} s "
                    f"max {figures['total_max_s']} s"
                )
            else:
                lines.append(f"  {kind}: {figures['faults']} faults")
        if self.fatal_errors:
            lines.append(f"producers lost to fatal errors: {dict(self.fatal_errors)}")
        if self.unclean_exits:
            lines.append(f"unclean exits on SIGTERM: {self.unclean_exits}")
        errors = {n: sum(found.values()) for n, found in self.logged_errors.items() if found}
        if errors:
            lines.append(f"ERROR lines in the nodes' logs: {errors}")
        lines.extend(v.summary() for v in self.verdicts if not v.ok)
        if self.failure:
            lines.append(f"failure: {self.failure}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "settings": dataclasses.asdict(self.settings),
            "commit": self.commit,
            "date": self.date,
            "ok": self.ok,
            "finished": self.finished,
            "summary": self.summary(),
            "wall_seconds": round(self.wall_seconds, 1),
            "faults_done": len(self.outcomes),
            "faults_by_kind": dict(Counter(o.fault.kind for o in self.outcomes)),
            "acknowledged": self.acknowledged,
            "failed": self.failed,
            "send_errors": dict(self.send_errors),
            "fatal_errors": dict(self.fatal_errors),
            "unclean_exits": self.unclean_exits,
            "checks": dict(self.problems()),
            "recovery": self.recovery_figures(),
            "final_isr": self.final_isr,
            "failure": self.failure,
            "verdicts": [v.as_json() for v in self.verdicts],
            "faults": [
                {
                    **dataclasses.asdict(o.fault),
                    "started_s": round(o.started, 1),
                    "outage_s": round(o.outage, 1),
                    "recovery_s": None if o.recovery is None else round(o.recovery, 1),
                    "detail": o.detail,
                }
                for o in self.outcomes
            ],
            "logged_errors": self.logged_errors,
            "client_log": self.client_log,
            "logs": self.logs,
        }
