"""Spark's Kafka connector (`spark-sql-kafka-0-10`) and its dependencies, from Maven Central.

What it owns: the connector's coordinates, pinned to the PySpark release the project installs;
resolving them once with Spark's own resolver (Ivy, given a cache of its own and Maven Central
as its only repository: entries that hold only a pom in `~/.m2` make Ivy fail) into
`${GREGOR_CACHE:-~/.cache/gregor}/spark/<version>`, under a file lock so that concurrent
processes share one resolution; and telling a Spark session which jars to load. The jars that
PySpark already ships (Hadoop's client, the compression codecs, SLF4J) are left out, so that no
class is on the class path twice. In the `gregor-spark` image the connector is baked into
PySpark's own `jars/` (`python -m gregor_audit.connector --into DIR`), and a session needs
nothing more.

What it must never do: resolve inside a running Spark driver (a JVM takes its jars at start),
reach any repository but Maven Central, or write into the repository.

`python -m gregor_audit.connector` resolves (`make install` runs it) and prints the jars.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "CONNECTOR",
    "SPARK_VERSION",
    "ConnectorUnavailable",
    "bundled",
    "jars",
    "session_config",
]

SPARK_VERSION = "4.2.0"
"""PySpark's version (pyproject.toml pins the same): the connector must match it exactly."""
CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2/"
_RESOLVED = "resolved.txt"
_RESOLVE_TIMEOUT = 900.0

_IVY_SETTINGS = f"""\
<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{MAVEN_CENTRAL}"/>
  </resolvers>
</ivysettings>
"""


class ConnectorUnavailable(RuntimeError):
    """Spark's Kafka connector could not be resolved (no Java, no route to Maven Central)."""


def cache_dir(version: str = SPARK_VERSION) -> Path:
    """`$GREGOR_CACHE/spark/<version>`, by default under `~/.cache/gregor`: outside any work
    tree, so that every clone and CI run reuses it."""
    root = os.environ.get("GREGOR_CACHE") or Path.home() / ".cache" / "gregor"
    return Path(root).expanduser() / "spark" / version


def _pyspark_jars() -> Path:
    import pyspark  # noqa: PLC0415 - PySpark is the audit's optional dependency

    return Path(pyspark.__file__).parent / "jars"


def require_java() -> None:
    """Spark needs a JVM: say so in one line rather than through the JVM's launch failure."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    if java is None or not Path(java).exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise ConnectorUnavailable(f"Spark needs Java 17 or 21 ({where})")


def _require_pyspark_version() -> None:
    import pyspark  # noqa: PLC0415

    if pyspark.__version__ != SPARK_VERSION:
        raise ConnectorUnavailable(
            f"PySpark {pyspark.__version__} is installed, and the audit's Kafka connector is "
            f"for {SPARK_VERSION}: pip install 'gregor[audit]'"
        )


def bundled() -> bool:
    """Whether PySpark's own jars already hold the connector (the `gregor-spark` image)."""
    return any(_pyspark_jars().glob(f"*spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar"))


def _shipped_by_pyspark(jar: Path, shipped: set[str]) -> bool:
    """Ivy names a jar `<group>_<artifact>-<version>.jar`, PySpark `<artifact>-<version>.jar`."""
    return jar.name.split("_", 1)[-1] in shipped or jar.name in shipped


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _listed(directory: Path) -> list[Path] | None:
    listing = directory / _RESOLVED
    if not listing.exists():
        return None
    found = [directory / "ivy" / "jars" / name for name in listing.read_text().split()]
    return found if found and all(jar.exists() for jar in found) else None


def jars(directory: Path | None = None) -> list[Path]:
    """The jars a session loads for the connector, resolved on first use (in a process of its
    own: Spark resolves packages only when its JVM starts). Empty when PySpark bundles it."""
    _require_pyspark_version()
    if bundled():
        return []
    directory = directory or cache_dir()
    found = _listed(directory)
    if found is not None:
        return found
    with _locked(directory):
        found = _listed(directory)
        if found is None:
            found = _resolve(directory)
    return found


def session_config(directory: Path | None = None) -> dict[str, str]:
    """What a `SparkSession` builder needs for `spark.read.format("kafka")`."""
    found = jars(directory)
    return {"spark.jars": ",".join(str(jar) for jar in found)} if found else {}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _resolve(directory: Path) -> list[Path]:
    require_java()
    ivy = directory / "ivy"
    settings = directory / "ivysettings.xml"
    settings.write_text(_IVY_SETTINGS)
    code = (
        "from pyspark.sql import SparkSession\n"
        "SparkSession.builder.master('local[1]').appName('gregor-connector')"
        f".config('spark.jars.packages', {CONNECTOR!r})"
        f".config('spark.jars.ivy', {str(ivy)!r})"
        f".config('spark.jars.ivySettings', {str(settings)!r})"
        ".config('spark.ui.enabled', 'false').getOrCreate().stop()\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=_RESOLVE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ConnectorUnavailable(
            f"resolving {CONNECTOR} from {MAVEN_CENTRAL} took over {_RESOLVE_TIMEOUT:.0f} s"
        ) from exc
    if done.returncode != 0:
        raise ConnectorUnavailable(
            f"could not resolve {CONNECTOR} from {MAVEN_CENTRAL}: {_last_line(done.stderr)}"
        )
    shipped = {jar.name for jar in _pyspark_jars().glob("*.jar")}
    needed = sorted(
        jar for jar in (ivy / "jars").glob("*.jar") if not _shipped_by_pyspark(jar, shipped)
    )
    if not any(
        jar.name.endswith(f"spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar") for jar in needed
    ):
        raise ConnectorUnavailable(f"Ivy reported success but left no {CONNECTOR} jar in {ivy}")
    partial = directory / f".{_RESOLVED}.partial"
    partial.write_text("".join(f"{jar.name}\n" for jar in needed))
    partial.replace(directory / _RESOLVED)  # readers outside the lock see it whole or not at all
    return needed


def _install_into(target: Path) -> list[Path]:
    """Copy the connector's jars into `target` (PySpark's `jars/` in the image build), named
    as PySpark names its own (`<artifact>-<version>.jar`)."""
    with tempfile.TemporaryDirectory(prefix="gregor-connector-") as scratch:
        found = _resolve(Path(scratch))
        target.mkdir(parents=True, exist_ok=True)
        copied = []
        for jar in found:
            copied.append(target / jar.name.split("_", 1)[-1])
            shutil.copy2(jar, copied[-1])
        return copied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gregor_audit.connector",
        description=f"resolve Spark's Kafka connector ({CONNECTOR}) from Maven Central",
    )
    parser.add_argument(
        "--into", type=Path, help="copy the jars into this directory (an image's pyspark/jars)"
    )
    args = parser.parse_args(argv)
    try:
        found = _install_into(args.into) if args.into else jars()
    except ConnectorUnavailable as exc:
        print(f"gregor: {exc}", file=sys.stderr)
        return 1
    for jar in found:
        print(jar)
    if not found:
        print(f"{CONNECTOR} is bundled with PySpark here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
