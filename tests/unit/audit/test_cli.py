"""`gregor audit retention`'s bad input: one line naming the problem, exit status 1, and no
Spark started for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import main

pytestmark = pytest.mark.unit

BASE = ["audit", "retention", "--bootstrap-server", "localhost:9092", "--topic", "t"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-age", "30"], "gregor: '30' is not a duration"),
        (["--future-skew", "soon"], "gregor: 'soon' is not a duration"),
        (["--timeout", "0s"], "gregor: '0s': a duration must be longer than zero"),
        (["--command-config", "absent.properties"], "gregor: cannot read the client properties"),
    ],
)
def test_bad_input_is_named_and_nothing_runs(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "report"
    assert main([*BASE, "--output", str(output), *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1
    assert not output.exists()


def test_the_command_requires_its_topics_and_output(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["audit", "retention", "--bootstrap-server", "localhost:9092", "--output", "x"])
    assert exited.value.code == 2
    assert "--topic" in capsys.readouterr().err
