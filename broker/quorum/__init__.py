"""The metadata quorum on a real clock, disk and network: the Raft core's driver, the metadata
log's files in Kafka's layout, and the core's messages as Kafka's quorum requests."""

from .driver import NotController, QuorumDriver, QuorumStatus, StateMachine, StateMachineFault
from .store import METADATA_TOPIC, QuorumStore

__all__ = [
    "METADATA_TOPIC",
    "NotController",
    "QuorumDriver",
    "QuorumStatus",
    "QuorumStore",
    "StateMachine",
    "StateMachineFault",
]
