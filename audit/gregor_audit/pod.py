"""The `gregor-spark` image's entry point: a Spark-on-Kubernetes driver or executor, or the audit.

Spark on Kubernetes starts its pods from the application's image with no command of its own,
only arguments: `driver --properties-file … --class … <app> <args>` for the driver and
`executor` (with everything else in `SPARK_*` variables) for each executor, and the image's
entry point turns them into processes. This module is that entry point for the audit's image:

- `driver …`: `spark-submit --deploy-mode client --conf spark.driver.bindAddress=<pod IP> …`, the
  driver running in its pod;
- `executor`: `java … KubernetesExecutorBackend`, from the variables Spark's driver set on the
  executor's pod (`SPARK_JAVA_OPT_<n>` in order, `SPARK_EXECUTOR_MEMORY`, then
  `SPARK_DRIVER_URL`, `SPARK_EXECUTOR_ID`, `SPARK_EXECUTOR_CORES`, `SPARK_APPLICATION_ID`,
  `SPARK_EXECUTOR_POD_IP`, `SPARK_RESOURCE_PROFILE_ID` and `SPARK_EXECUTOR_POD_NAME`);
- anything else: `gregor audit retention <arguments>`, so that `docker run gregor-spark:dev
  --bootstrap-server …` audits from a laptop as the command line does;
- `--`, then a command: that command (a shell, spark-submit).

What it owns: those command lines, built from the arguments and environment it is given (pure,
`command`), and replacing this process with them (`main`). What it must never do: start a
process of its own rather than become the one it names (the pod's signals go to it).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["IncompletePod", "command", "main"]

_EXECUTOR_VARIABLES = (
    ("--driver-url", "SPARK_DRIVER_URL"),
    ("--executor-id", "SPARK_EXECUTOR_ID"),
    ("--cores", "SPARK_EXECUTOR_CORES"),
    ("--app-id", "SPARK_APPLICATION_ID"),
    ("--hostname", "SPARK_EXECUTOR_POD_IP"),
    ("--resourceProfileId", "SPARK_RESOURCE_PROFILE_ID"),
    ("--podName", "SPARK_EXECUTOR_POD_NAME"),
)
_JAVA_OPT = re.compile(r"SPARK_JAVA_OPT_(\d+)")


class IncompletePod(RuntimeError):
    """Spark did not give the pod what its role needs (a variable it sets is missing)."""


def _spark_home(environment: Mapping[str, str]) -> Path:
    if environment.get("SPARK_HOME"):
        return Path(environment["SPARK_HOME"])
    import pyspark  # noqa: PLC0415 - only a pod of the image needs it

    return Path(pyspark.__file__).parent


def _class_path(environment: Mapping[str, str], home: Path) -> str:
    """In the order Spark's own images use: its configuration, Hadoop's (for `s3a://` and the
    like), the executor's extra class path (`SPARK_CLASSPATH`, ahead of Spark's jars so that it
    can take precedence), the jars PySpark ships (the connector baked in among them), then
    whatever else the pod adds."""
    parts = [environment.get("SPARK_CONF_DIR") or str(home / "conf")]
    parts += [
        environment[key] for key in ("HADOOP_CONF_DIR", "SPARK_CLASSPATH") if environment.get(key)
    ]
    parts.append(str(home / "jars" / "*"))
    parts += [
        environment[key]
        for key in ("SPARK_EXTRA_CLASSPATH", "SPARK_DIST_CLASSPATH")
        if environment.get(key)
    ]
    return ":".join(parts)


def _java_options(environment: Mapping[str, str]) -> list[str]:
    numbered = sorted(
        (int(match.group(1)), value)
        for key, value in environment.items()
        if (match := _JAVA_OPT.fullmatch(key))
    )
    return [value for _, value in numbered]


def _required(environment: Mapping[str, str], key: str, role: str) -> str:
    value = environment.get(key)
    if not value:
        raise IncompletePod(f"a Spark {role} pod needs {key}, which Spark sets: it is missing")
    return value


def command(arguments: Sequence[str], environment: Mapping[str, str]) -> list[str]:
    """The command line this pod's process becomes."""
    role, rest = (arguments[0], list(arguments[1:])) if arguments else ("", [])
    if role == "--":
        if not rest:
            raise IncompletePod("nothing to run after --")
        return rest
    if role == "driver":
        home = _spark_home(environment)
        address = _required(environment, "SPARK_DRIVER_BIND_ADDRESS", "driver")
        return [
            str(home / "bin" / "spark-submit"),
            "--conf",
            f"spark.driver.bindAddress={address}",
            "--deploy-mode",
            "client",
            *rest,
        ]
    if role == "executor":
        home = _spark_home(environment)
        memory = _required(environment, "SPARK_EXECUTOR_MEMORY", "executor")
        java_home = environment.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else "java"
        backend = [
            part
            for flag, key in _EXECUTOR_VARIABLES
            for part in (flag, _required(environment, key, "executor"))
        ]
        return [
            java,
            *_java_options(environment),
            f"-Xms{memory}",
            f"-Xmx{memory}",
            "-cp",
            _class_path(environment, home),
            "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
            *backend,
        ]
    return ["gregor", "audit", "retention", *arguments]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        line = command(arguments, os.environ)
    except IncompletePod as exc:
        print(f"gregor-spark: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    # Python ignores SIGPIPE and SIGXFSZ, and what is ignored stays ignored across exec.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execvp(line[0], line)  # on success, this process is now that command
    except OSError as exc:
        print(f"gregor-spark: cannot run {line[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main())
