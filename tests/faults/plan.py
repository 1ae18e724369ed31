"""The run's settings and its schedule of faults, drawn up front from a seed: the same seed
gives the same faults on the same nodes with the same durations, whatever the timing of the
run that plays them. Pure.

The fault kinds:

- `kill`: SIGKILL, down for `down` seconds, started again on its disk (a crash, an OOM kill);
- `pause`: SIGSTOP for `pause` seconds, then SIGCONT (a long GC pause, a stalled disk): a
  pause longer than `broker.session.timeout.ms` (9 s) gets the node fenced meanwhile;
- `terminate`: SIGTERM (a controlled shutdown), down for `down` seconds, started again;
- `lost_disk`: SIGTERM, its log dir replaced by an empty one formatted again for the cluster,
  started again: it lost its replicas and, on these combined nodes, its copy of the metadata
  log, and must fetch both back;
- `recreate`: one topic's producer is closed, the incarnation checked and deleted, and a topic
  of the same name created; in half of them a node is SIGKILLed before the deletion and
  started again only after the new topic has taken records, so that it comes back holding the
  old topic's directories under the new topic's name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["FAULT_KINDS", "Fault", "Settings", "draw"]

FAULT_KINDS = ("kill", "pause", "terminate", "lost_disk", "recreate")


@dataclass(frozen=True)
class Settings:
    faults: int = 30
    """How many faults to inject, one after another."""
    seed: int = 1
    """The seed of the schedule (`draw`)."""
    kinds: tuple[str, ...] = FAULT_KINDS
    """The kinds drawn from, each as likely as the others."""
    topics: int = 2
    partitions: int = 3
    """Per topic; every partition has all three nodes as replicas (replication factor 3)."""
    min_insync_replicas: int = 2
    rate: float = 40.0
    """Records a second to each topic: enough for every fault to hit records in flight, few
    enough for two cores shared with the brokers."""
    down: tuple[float, float] = (0.0, 2.0)
    """Seconds a killed or stopped node stays down before it is started again."""
    session_timeout_ms: int = 9000
    """The nodes' `broker.session.timeout.ms` (Kafka's default); their heartbeats go out at
    2/9 of it (Kafka's 2 s to 9 s). A shorter session fits more faults into an hour: a killed
    node waits for its old session to run out before it registers again."""

    @property
    def pause(self) -> tuple[float, float]:
        """Seconds a paused node stays paused: on both sides of the session timeout (2-12 s
        for Kafka's 9 s)."""
        session = self.session_timeout_ms / 1000
        return (round(session * 2 / 9, 1), round(session * 12 / 9, 1))

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.session_timeout_ms * 2 // 9

    recovery_timeout: float = 150.0
    """Seconds a fault's recovery (every partition at full ISR on every node) may take before
    the run stops injecting and reports it: a node with a replaced disk fetches its metadata
    log and every replica again."""
    final_timeout: float = 180.0
    """Seconds for full ISR once the producers have stopped, before the records are read."""
    message_timeout_ms: int = 60_000
    """The producers' `message.timeout.ms`: a record not acknowledged by then is failed."""
    budget_seconds: float | None = None
    """Stop injecting once this many seconds have passed (then the end: full ISR, the
    checks), whether or not every fault of the schedule was played."""

    def topic_names(self) -> list[str]:
        return [f"faults-{chr(ord('a') + i)}" for i in range(self.topics)]


@dataclass(frozen=True)
class Fault:
    number: int
    kind: str
    node: int
    """The node hit; for `recreate`, the node that is down meanwhile if `node_down`."""
    seconds: float
    """How long the node stays down (or paused)."""
    topic: str = ""
    """`recreate`: the topic deleted and created again."""
    node_down: bool = False

    def describe(self) -> str:
        if self.kind == "recreate":
            down = f" with node {self.node} down {self.seconds:.1f} s" if self.node_down else ""
            return f"recreate {self.topic}{down}"
        return f"{self.kind} node {self.node} ({self.seconds:.1f} s)"


def draw(settings: Settings) -> list[Fault]:
    """The schedule: `settings.faults` faults, each of a kind drawn uniformly from
    `settings.kinds`, on a node drawn uniformly."""
    rng = random.Random(settings.seed)
    topics = settings.topic_names()
    faults: list[Fault] = []
    for number in range(1, settings.faults + 1):
        kind = rng.choice(settings.kinds)
        node = rng.choice((1, 2, 3))
        seconds = rng.uniform(*(settings.pause if kind == "pause" else settings.down))
        topic = rng.choice(topics) if kind == "recreate" else ""
        node_down = kind == "recreate" and rng.random() < 0.5
        faults.append(Fault(number, kind, node, round(seconds, 1), topic, node_down))
    return faults
