"""Configuration changes applied to running brokers, without a restart.

What it owns: which of the spec's broker configs a running broker takes as they change (the
broker's own `LIVE_PER_BROKER_CONFIGS`: every topic's defaults, the connection limits), and,
from what each broker says of them, what to set or delete on which broker
(IncrementalAlterConfigs on `BROKER <node.id>`, as Kafka's `kafka-configs --entity-name`
does) and which brokers still run with a value the spec no longer has. Their values are left
out of the pods' configuration hash (`objects.config_hash`), so changing one rolls nothing;
each pod's `server.properties` still carries them, so a pod that restarts for another reason
starts with them, and its per-broker value, now the same, is deleted. It is pure, as the
planner is. What it must never do: ask a broker anything, or touch a config it does not own:
per-broker values of the live configs are the operator's, others (throttles a reassignment
set, say) are not.

Per broker and live config, with `wanted` the spec's value:
1. `wanted` set, and the broker runs with another value: set `wanted` for it.
2. `wanted` set and run with, from a per-broker value while its file says the same: delete
   the per-broker value (it restarted since).
3. `wanted` not set: a per-broker value goes; and a broker whose file still has the config
   (it started before the spec dropped it) is to restart, as for any other change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.metadata.broker_configs import LIVE_PER_BROKER_CONFIGS

from .observed import LiveConfig

__all__ = ["LIVE_PER_BROKER_CONFIGS", "LiveChanges", "live_changes", "live_part"]


@dataclass(frozen=True, slots=True)
class LiveChanges:
    updates: Mapping[int, Mapping[str, str | None]] = field(default_factory=dict)
    """By node id: each config to set (None: to delete) for that broker alone."""
    stale: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """By node id: the configs it runs with from its file that the spec no longer has."""


def live_part(properties: Mapping[str, str]) -> dict[str, str]:
    """Those of `properties` a running broker takes (rule 1)."""
    return {key: value for key, value in properties.items() if key in LIVE_PER_BROKER_CONFIGS}


def live_changes(
    wanted: Mapping[str, str], configs: Mapping[int, Mapping[str, LiveConfig]]
) -> LiveChanges:
    """The module's rules, for the brokers in `configs` (what each one said)."""
    updates: dict[int, dict[str, str | None]] = {}
    stale: dict[int, tuple[str, ...]] = {}
    for node, said in sorted(configs.items()):
        changes: dict[str, str | None] = {}
        left: list[str] = []
        for key in sorted(LIVE_PER_BROKER_CONFIGS):
            found = said.get(key)
            if found is None:
                continue  # the broker does not list it: nothing to compare
            value = wanted.get(key)
            if value is not None:
                if found.value != value:  # 1
                    changes[key] = value
                elif found.dynamic is not None and found.static == value:  # 2
                    changes[key] = None
            else:
                if found.dynamic is not None:  # 3
                    changes[key] = None
                if found.static is not None:
                    left.append(key)
        if changes:
            updates[node] = changes
        if left:
            stale[node] = tuple(left)
    return LiveChanges(updates, stale)
