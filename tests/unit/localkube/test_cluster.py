"""`make cluster` on this host: whether root may lower oom scores here (this VM's root may not),
and what a user without root is told."""

from pathlib import Path

import pytest

from localkube import cluster
from localkube.__main__ import main as localkube_main
from localkube.host import may_lower_oom_scores


def _status(tmp_path: Path, effective: str) -> Path:
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython\nCapPrm:\t{effective}\nCapEff:\t{effective}\n")
    return path


def test_full_root_may_lower_oom_scores(tmp_path: Path) -> None:
    assert may_lower_oom_scores(_status(tmp_path, "000001ffffffffff"))


def test_root_without_cap_sys_resource_may_not(tmp_path: Path) -> None:
    # This VM's root: every capability but CAP_SYS_RESOURCE (bit 24).
    assert not may_lower_oom_scores(_status(tmp_path, "000001fffeffffff"))


def test_a_user_without_root_is_told_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Faked: the suite runs as root, so a non-root uid is simulated rather than caused.
    monkeypatch.setattr("localkube.cluster.os.geteuid", lambda: 1000)
    monkeypatch.setattr(cluster, "_kind_works", lambda: False)
    monkeypatch.delenv("LOCALKUBE_MODE", raising=False)
    for chosen in ([], ["--mode", "host"]):
        assert localkube_main(["up", *chosen]) == 1
        error = capsys.readouterr().err
        assert "needs root" in error
        assert "sudo make cluster" in error
