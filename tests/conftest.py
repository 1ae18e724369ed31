"""Test-wide settings: tier markers from folders, and deterministic Hypothesis in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_TIERS = {"unit", "integration"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the tier of the folder it lives in (tests/unit, tests/integration)."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in _TIERS & set(parts):
            item.add_marker(getattr(pytest.mark, tier))
