"""Real clients, as installed, against the recording broker: everything they send must decode.

The same capture as `python -m tests.golden.capture`, run live into a temporary directory and
held to the same checks as the committed captures, so a client upgrade that sends something
`broker.protocol` cannot decode fails here before it fails in production.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.golden.capture import capture
from tests.golden.verify import CLIENTS, check_capture, check_coverage

pytestmark = [
    pytest.mark.integration,
    # kafka-python loads its protocol schemas with importlib.resources.read_text, deprecated
    # on Python 3.11–3.12 and undeprecated in 3.13; read_text warns, and so does the open_text
    # it calls, from inside importlib.
    pytest.mark.filterwarnings(
        "ignore:read_text is deprecated:DeprecationWarning:kafka.protocol.schemas.load_json"
    ),
    pytest.mark.filterwarnings(
        "ignore:open_text is deprecated:DeprecationWarning:importlib.resources._legacy"
    ),
]


@pytest.mark.parametrize("client", CLIENTS)
def test_live_capture_decodes(client: str, tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    result = capture(client, tmp_path)
    for path in result.files:
        check_capture(path)
    assert not result.failures
    check_coverage(tmp_path / client, client)
    assert set(threading.enumerate()) <= threads_before, "a client or the recorder leaked a thread"
