"""A recorded fault-injection run from the command line:

    python -m tests.faults [--kind gregor|kafka] [--faults N] [--seed N] [--report FILE]
                           [--dir DIR] [--kinds kill,pause,...] [--rate R] [--minutes M]
                           [--session-timeout-ms MS]

One line per fault as it recovers, the checker's verdicts, then the figures. The JSON report
(`--report`) is rewritten after every fault, its `summary` field the figures so far, so a
long run can be followed while it goes. The nodes' data and logs stay under `--dir` (a new
temporary directory by default) for the evidence. Exit status 0 if every check held, 1 if not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.faults.plan import FAULT_KINDS, Settings
from tests.faults.run import run
from tests.support.clusters import KINDS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--kind", choices=KINDS, default="gregor", help="the system under test")
    parser.add_argument("--faults", type=int, default=Settings.faults)
    parser.add_argument("--seed", type=int, default=Settings.seed)
    parser.add_argument("--report", type=Path, help="the JSON report's file")
    parser.add_argument("--dir", type=Path, help="where the nodes keep their data and logs")
    parser.add_argument(
        "--kinds",
        default=",".join(FAULT_KINDS),
        help="the fault kinds to draw from, comma-separated (default: all)",
    )
    parser.add_argument("--rate", type=float, default=Settings.rate, help="records/s per topic")
    parser.add_argument(
        "--minutes",
        type=float,
        help="stop injecting after this many minutes, however many faults were played",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=Settings.session_timeout_ms,
        help="the nodes' broker.session.timeout.ms; pauses and heartbeats scale with it",
    )
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if unknown := set(kinds) - set(FAULT_KINDS):
        parser.error(f"no such fault kinds: {sorted(unknown)}")
    settings = Settings(
        faults=args.faults,
        seed=args.seed,
        kinds=kinds,
        rate=args.rate,
        session_timeout_ms=args.session_timeout_ms,
        budget_seconds=None if args.minutes is None else args.minutes * 60,
    )
    directory = args.dir or Path(tempfile.mkdtemp(prefix=f"faults-{args.kind}-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"{args.kind}: {settings.faults} faults, seed {settings.seed}, nodes under {directory}")
    report = run(
        args.kind,
        directory,
        settings,
        say=lambda line: print(line, flush=True),
        report_file=args.report,
    )
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
