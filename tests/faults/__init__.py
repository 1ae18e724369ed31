"""Fault injection on three combined nodes (Gregor's or Apache Kafka's), with a checker.

An idempotent `acks=all` producer writes stamped records (topic, topic incarnation, partition,
a sequence number unique in the run) while faults drawn from a seeded random generator hit
the cluster one after another: SIGKILL, SIGSTOP, SIGTERM, a lost disk, a topic deleted and
created again. After each, the run waits until every node is back and every partition has
its full ISR. At the end it reads every partition back and checks that no acknowledged record
was lost, none is there twice, and none belongs to another topic or to an earlier topic of
the same name.

- `stamps`: what a record's value says, and the ledger of what was sent and acknowledged;
- `checker`: the verdict on one topic incarnation from the ledger and what was read (pure);
- `workload`: the producers, in a thread of their own;
- `cluster_view`: what each node says of the topics (ISR, leaders); creating and deleting
  them;
- `readback`: what the nodes hold: the records, their batches' producer epochs, the logs;
- `plan`: the settings and the seeded schedule of faults (pure);
- `run`: the faults, the recovery after each, the checks; `report`: the figures.

`python -m tests.faults --help` runs it from the command line (`docs/fault-injection.md`);
`tests/integration/test_faults.py` runs a short schedule against both systems.
"""
