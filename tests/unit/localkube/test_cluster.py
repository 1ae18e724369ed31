from pathlib import Path

from localkube.cluster import may_lower_oom_scores


def _status(tmp_path: Path, effective: str) -> Path:
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython\nCapPrm:\t{effective}\nCapEff:\t{effective}\n")
    return path


def test_full_root_may_lower_oom_scores(tmp_path: Path) -> None:
    assert may_lower_oom_scores(_status(tmp_path, "000001ffffffffff"))


def test_root_without_cap_sys_resource_may_not(tmp_path: Path) -> None:
    # This VM's root: every capability but CAP_SYS_RESOURCE (bit 24).
    assert not may_lower_oom_scores(_status(tmp_path, "000001fffeffffff"))
