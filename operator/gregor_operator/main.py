"""`gregor operator`: the operator's process (kopf's loop, the handlers, a metrics endpoint).

What it owns: turning the command line into kopf's settings — which namespaces to watch,
where the liveness endpoint and the metrics are served, and whether it runs alone or as one
of several replicas of which only one is active (kopf's peering, the operator's leader
election).
"""

from __future__ import annotations

import argparse
import logging

from prometheus_client import start_http_server

__all__ = ["add_arguments", "run"]

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable); the default is every namespace",
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="where kopf answers liveness probes",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=8081, help="Prometheus metrics on this port; 0: none"
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object per line, with the namespace and name of the resource a "
        "line is about (for log collectors); the level is `gregor --log-level`",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        help="run as one of several replicas: only the one holding the peering NAME "
        "(a KopfPeering object, installed by the chart) reconciles; without it, run alone",
    )


def run(args: argparse.Namespace) -> int:
    import kopf  # noqa: PLC0415 - here, so that `gregor broker` never pays for importing it

    from . import handlers  # noqa: F401, PLC0415 - registers the handlers with kopf

    configure_logging(args.log_format)
    if args.metrics_port:
        start_http_server(args.metrics_port)
        log.info("operator metrics on :%d/metrics", args.metrics_port)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        standalone=args.peering is None,
        peering_name=args.peering,
    )
    return 0


def configure_logging(log_format: str) -> None:
    """kopf's formatter, which names the resource a line is about, in JSON when asked; and
    kopf's "handler succeeded" lines, one per reconciliation, only at DEBUG: the operator
    logs what it did itself."""
    import kopf  # noqa: PLC0415 - as in `run`

    root = logging.getLogger()
    level = root.level
    if log_format == "json":
        root.handlers.clear()  # `gregor`'s text handler: kopf's takes its place
        kopf.configure(log_format=kopf.LogFormat.JSON, log_refkey="object")
        root.setLevel(level)
    if level > logging.DEBUG:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
