"""A fresh clone on a machine with nothing but the base image: `make install` and the unit tier
pass in a container of the project's own Debian base (bookworm with Python 3.11, venv and pip,
which is what README asks of a machine) plus `make`, with nothing else installed and the clone
placed somewhere other than where it was developed.

It would have caught what issue 11 found on a fresh machine: tests that read Kafka's schemas
from a folder outside the clone, and packages the targets used without installing them."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from localkube.images import ensure_base_image

REPO = Path(__file__).resolve().parent.parent
PLACE = "/home/someone/src/my-gregor"
SCRIPT = f"""
set -eu
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq make >/dev/null
mkdir -p {PLACE}
tar -x -C {PLACE}
cd {PLACE}
make test-unit PYTEST_ARGS='-q -p no:cacheprovider'
"""


def _clone_as_tar() -> bytes:
    """The files a clone of this checkout holds (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted({n.decode() for n in listed.split(b"\0") if n}):
            if (REPO / name).exists():
                tar.add(REPO / name, arcname=name, recursive=False)
    return buffer.getvalue()


def _what_failed(output: str, limit: int = 12_000) -> str:
    """pytest's account of the failures (from its FAILURES or ERRORS header on), else the
    output's end: the tail alone can hold nothing but the last of several tracebacks."""
    starts = [i for i in (output.find("= FAILURES ="), output.find("= ERRORS =")) if i >= 0]
    shown = output[min(starts) :] if starts else output[-limit:]
    return shown if len(shown) <= limit else f"{shown[: limit - 3000]}\n…\n{shown[-3000:]}"


# About 4 min 40 s on a quiet machine since the audit's PySpark joined the test dependencies
# (pip builds its 434 MB source distribution in the bare container): over pytest's default.
@pytest.mark.timeout(900)
def test_a_fresh_clone_installs_and_passes_the_unit_tier_on_the_bare_base() -> None:
    image = ensure_base_image()
    result = subprocess.run(
        ["docker", "run", "--rm", "-i", image, "bash", "-c", SCRIPT],
        input=_clone_as_tar(),
        capture_output=True,
        timeout=1800,
        check=False,
    )
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 0, _what_failed(output)
    assert " passed" in output
    assert " failed" not in output
