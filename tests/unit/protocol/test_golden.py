"""Requests that real clients sent, committed under tests/golden, decode through our interface.

The captures are refreshed with `python -m tests.golden.capture` (see that module); what each
must satisfy is in `tests.golden.verify`. A client or codec missing from the captures fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden.verify import CLIENTS, GOLDEN_DIR, check_capture, check_coverage

pytestmark = pytest.mark.unit

CAPTURES = sorted(GOLDEN_DIR.glob("*/*.bin"))


@pytest.mark.parametrize(
    "path", [pytest.param(path, id=str(path.relative_to(GOLDEN_DIR))) for path in CAPTURES]
)
def test_capture_decodes(path: Path) -> None:
    check_capture(path)


@pytest.mark.parametrize("client", CLIENTS)
def test_captures_cover_each_client(client: str) -> None:
    check_coverage(GOLDEN_DIR / client, client)


def test_every_capture_belongs_to_a_client() -> None:
    assert {path.parent.name for path in CAPTURES} == set(CLIENTS)
