"""`gregor audit retention`: the audit from a command line, on any Kafka cluster.

What it owns: the command's arguments, the Spark session (local mode by default; the master
spark-submit gave when it launched the command), and its output: one line per topic on stdout,
the report under `--output`, exit status 0 once every topic has a verdict. Whatever stops the
audit (bad input, an unreachable cluster, no Java) is one line on stderr and exit status 1.
Launched by the operator, the command also leaves its outcome where the operator reads it
(gregor_audit.result).

What it must never do: import PySpark before the command runs (`gregor` runs brokers without
it), or print a traceback for a failure the user can act on.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gregor_audit.settings import (
    DEFAULT_FUTURE_SKEW_MS,
    AuditSettings,
    InvalidSettings,
    parse_duration,
    read_properties,
)

__all__ = ["add_arguments", "main", "run_command", "spark_session"]

DEFAULT_MASTER = "local[2]"
log = logging.getLogger("gregor.audit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-server", required=True, metavar="HOST:PORT", help="the Kafka cluster"
    )
    parser.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="NAME",
        help="a topic to audit (repeat for more)",
    )
    parser.add_argument(
        "--max-age",
        metavar="DURATION",
        help="no record may be older (90m, 1d, 30d); without it, each topic is held to what "
        "its configuration promises",
    )
    parser.add_argument(
        "--future-skew",
        metavar="DURATION",
        default=None,
        help="how far ahead of now a timestamp may be "
        f"(default {DEFAULT_FUTURE_SKEW_MS // 60_000}m)",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="where summary.json and the Parquet detail go (a directory or a Hadoop URI)",
    )
    parser.add_argument(
        "--master",
        help=f"Spark's master (default {DEFAULT_MASTER}, or the one spark-submit launched with)",
    )
    parser.add_argument(
        "--command-config",
        type=Path,
        metavar="FILE",
        help="Kafka client properties (security.protocol, sasl.*, ssl.*), as Kafka's tools take",
    )
    parser.add_argument(
        "--timeout",
        default="30s",
        metavar="DURATION",
        help="how long any one call to the cluster may take (default 30s)",
    )


def settings_from(args: argparse.Namespace) -> AuditSettings:
    return AuditSettings(
        bootstrap_servers=args.bootstrap_server,
        topics=tuple(dict.fromkeys(args.topic)),
        output=args.output,
        max_age_ms=parse_duration(args.max_age) if args.max_age else None,
        future_skew_ms=(
            parse_duration(args.future_skew, zero=True)
            if args.future_skew
            else DEFAULT_FUTURE_SKEW_MS
        ),
        client_properties=read_properties(args.command_config) if args.command_config else {},
        timeout_ms=parse_duration(args.timeout),
    )


def spark_session(master: str | None = None) -> Any:
    """The audit's session: `master` (default local[2], or spark-submit's), with the connector."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only the audit needs PySpark

    from gregor_audit.connector import require_java, session_config  # noqa: PLC0415

    builder = SparkSession.builder
    launched = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    if master or not launched:  # otherwise spark-submit's settings and name stand
        require_java()
        builder = builder.appName("gregor-retention-audit")
        master = master or DEFAULT_MASTER
        if master.startswith("local"):  # no other host to reach: no guessing at addresses
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master(master)
        builder = builder.config("spark.ui.enabled", "false")
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        builder = builder.config("spark.sql.debug.maxToStringFields", "200")
        logging_config = Path(__file__).with_name("log4j2.properties")
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{logging_config}"
        )
        for key, value in session_config().items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _print(summary: dict[str, Any]) -> None:
    for topic, report in summary["topics"].items():
        codes = sorted({f["code"] for f in report["findings"]})
        age = report["oldest_record_age_s"]
        line = f"{topic}: {report['verdict']}"
        if report.get("reason"):
            line += f" ({report['reason']})"
        if age is not None:
            line += f", oldest record {age} s old"
        if codes:
            line += f", findings: {', '.join(codes)}"
        print(line)
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}")
    print(f"report: {summary['report']}")


def _failed(message: str) -> int:
    """Stop the command: one line on stderr, and the same line as the run's result for the
    operator when it launched the run (gregor_audit.result)."""
    from gregor_audit.result import failure, publish  # noqa: PLC0415

    print(f"gregor: {message}", file=sys.stderr)
    publish(failure(message))
    return 1


def run_command(args: argparse.Namespace) -> int:
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        settings = settings_from(args)
    except InvalidSettings as exc:
        return _failed(str(exc))
    try:
        import pyspark  # noqa: F401, PLC0415
    except ImportError:
        return _failed("the retention audit needs PySpark: pip install 'gregor[audit]'")
    from gregor_audit.connector import ConnectorUnavailable  # noqa: PLC0415
    from gregor_audit.facts import ClusterUnreachable, ConnectorMissing, java_failure  # noqa: PLC0415
    from gregor_audit.job import run  # noqa: PLC0415
    from gregor_audit.result import compact, publish  # noqa: PLC0415

    try:
        spark = spark_session(args.master)
    except ConnectorUnavailable as exc:
        return _failed(str(exc))
    except Exception as exc:  # Spark's JVM did not start: named, without its stack
        log.debug("Spark did not start", exc_info=True)
        return _failed(f"Spark did not start: {java_failure(exc)}")
    try:
        summary = run(spark, settings)
    except (ClusterUnreachable, ConnectorMissing) as exc:
        return _failed(str(exc))
    except Exception as exc:  # a Spark or Kafka failure mid-scan: named, without its stack
        log.debug("the audit failed", exc_info=True)
        return _failed(f"the audit failed: {java_failure(exc)}")
    finally:
        spark.stop()
    publish(compact(summary))
    _print(summary)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`gregor audit retention` on its own: the Python application spark-submit runs (the
    `gregor-spark` image's `/opt/gregor/retention_audit.py`)."""
    parser = argparse.ArgumentParser(
        prog="gregor audit retention",
        description="check what retention and compaction really deliver, topic by topic",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_command(args)
