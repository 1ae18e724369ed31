"""The consumer groups' clock: wall time that is never stepped. The machine's clock cannot be
stepped in a test without disturbing everything else on it, so the step is faked by replacing
`time.time_ns`, which is what an NTP step or `date -s` changes."""

from __future__ import annotations

import time

import pytest

from broker.handlers.context import steady_clock_ms, wall_clock_ms


@pytest.mark.parametrize("step_s", [3_600, -3_600], ids=["ahead", "back"])
def test_a_wall_clock_step_does_not_move_the_group_clock(
    monkeypatch: pytest.MonkeyPatch, step_s: int
) -> None:
    clock = steady_clock_ms()
    before = clock()
    assert abs(before - wall_clock_ms()) < 1_000
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + step_s * 1_000_000_000)

    after = clock()
    time.sleep(0.05)
    later = clock()

    # Session deadlines an hour away neither fire at once nor an hour late.
    assert 0 <= after - before < 1_000
    assert later - after >= 50
    assert abs(wall_clock_ms() - after - step_s * 1_000) < 1_000  # the wall clock did move
