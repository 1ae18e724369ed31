"""Rebuilding the project's images does not fill the disk: each source change leaves an untagged
build stage of up to a gigabyte, and `make images` removes all but the newest of each stage (a
kubelet short of disk schedules no pods, which is how a CI run on a filled disk failed)."""

from __future__ import annotations

import subprocess

from localkube.docker import BUILD_STAGE_LABEL, docker_cli, prune_build_stages
from localkube.images import ensure_debian_image

STAGE = "e2e-prune-check"


def _stages() -> set[str]:
    listed = subprocess.run(
        [docker_cli(), "images", "--quiet", "--no-trunc", "--filter", "dangling=true",
         "--filter", f"label={BUILD_STAGE_LABEL}={STAGE}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(listed.stdout.split())


def test_a_rebuild_keeps_the_two_newest_build_stages_and_removes_older_ones() -> None:
    base = ensure_debian_image()
    built = []
    try:
        for generation in range(4):
            dockerfile = (
                f"FROM {base}\nLABEL {BUILD_STAGE_LABEL}={STAGE}\n"
                f"RUN echo {generation} > /generation\n"
            )
            result = subprocess.run(
                [docker_cli(), "build", "--quiet", "-"],
                input=dockerfile, capture_output=True, text=True, check=True,
            )  # fmt: skip
            built.append(result.stdout.strip())
        assert set(built) <= _stages()  # untagged: what a rebuild leaves behind

        removed = prune_build_stages()

        assert set(built[:2]) <= set(removed)
        assert _stages() == set(built[2:])
    finally:
        leftover = _stages()
        if leftover:
            subprocess.run([docker_cli(), "rmi", *leftover], capture_output=True, check=False)
