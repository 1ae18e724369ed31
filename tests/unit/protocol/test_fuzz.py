"""Random and mutated frames fed to the decoder: only `MalformedInput` ever comes out, and
decoding never allocates out of proportion to the frame it was given.

Three angles: mutations of real frames (encoded samples of every version, and the golden
captures from real clients); random bodies behind a valid header for every version; and every
4-byte and varint position of real frames overwritten with a hostile length, decoded in a child
process whose address space is capped, so an allocation sized from an untrusted length — even
one made by native code that Python's allocator tracing cannot see — kills the child and fails
the test.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import (
    SUPPORTED,
    MalformedInput,
    RequestHeader,
    decode_request,
    encode_request,
    request_type,
)
from broker.protocol.headers import encode_request_header
from broker.protocol.messages import request_header_version
from broker.protocol.versions import is_decodable
from tests.strategies import message, sample

REPO = Path(__file__).resolve().parents[3]
GOLDEN = sorted((REPO / "tests" / "golden").glob("*/*.bin"))
DECODABLE = [
    (key, version)
    for key, versions in SUPPORTED.items()
    for version in versions
    if is_decodable(key, version)
]

# Python objects are bigger than their wire form (a 2-byte empty string becomes a ~50-byte str
# in a tuple slot); anything beyond this factor means a length was trusted.
_ALLOCATION_FACTOR = 64
_ALLOCATION_SLACK = 256 * 1024


def _decode_checked(frame: bytes) -> None:
    tracemalloc.start()
    try:
        decode_request(frame)
    except MalformedInput:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak <= _ALLOCATION_FACTOR * len(frame) + _ALLOCATION_SLACK, (
        f"decoding {len(frame)} bytes allocated {peak} bytes"
    )


@st.composite
def sample_frames(draw: st.DrawFn) -> bytes:
    """A valid request frame (without size prefix): a golden capture or an encoded sample."""
    use_golden: bool = draw(st.booleans())
    if GOLDEN and use_golden:
        golden: Path = draw(st.sampled_from(GOLDEN))
        return golden.read_bytes()
    key, version = draw(st.sampled_from(DECODABLE))
    body: Any = draw(message(request_type(key, version)))
    return encode_request(RequestHeader(key, version, 1, "fuzz"), body)[4:]


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(sample_frames()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "overwrite", "insert", "delete", "truncate", "int"]))
        pos = draw(st.integers(0, max(len(frame) - 1, 0)))
        if kind == "flip" and frame:
            frame[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite" and frame:
            frame[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del frame[pos : pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del frame[pos:]
        elif kind == "int" and len(frame) >= 4:
            pos = min(pos, len(frame) - 4)
            value = draw(st.sampled_from([-1, -2, 0x7FFFFFFF, 0x10000, -(2**31)]))
            struct.pack_into(">i", frame, pos, value)
    return bytes(frame)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(frame=mutated_frames())
def test_mutated_frames_raise_only_malformed_input(frame: bytes) -> None:
    _decode_checked(frame)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(
    api=st.sampled_from(DECODABLE),
    client_id=st.none() | st.text(max_size=8),
    body=st.binary(max_size=256),
)
def test_random_bodies_raise_only_malformed_input(
    api: tuple[int, int], client_id: str | None, body: bytes
) -> None:
    key, version = api
    _decode_checked(_header(key, version, client_id) + body)


@settings(max_examples=500)
@given(frame=st.binary(max_size=64))
def test_random_bytes_raise_only_malformed_input(frame: bytes) -> None:
    _decode_checked(frame)


def _header(key: int, version: int, client_id: str | None) -> bytes:
    header = RequestHeader(key, version, 7, client_id)
    return encode_request_header(header, request_header_version(key, version))


_HOSTILE_CHILD = textwrap.dedent(
    """
    import resource, struct, sys
    from pathlib import Path
    from broker.protocol import MalformedInput, decode_request

    frames = [Path(p).read_bytes() for p in sys.argv[1:]]
    with open("/proc/self/status") as status:
        vm = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize"))
    limit = vm + 512 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    hostile_ints = [0x7FFFFFFF, 0x40000000, -2]
    hostile_varints = [b"\\xff\\xff\\xff\\xff\\x07", b"\\xff\\xff\\xff\\x7f"]
    decoded = 0
    for frame in frames:
        for pos in range(8, len(frame)):
            candidates = []
            if pos + 4 <= len(frame):
                for value in hostile_ints:
                    mutated = bytearray(frame)
                    struct.pack_into(">i", mutated, pos, value)
                    candidates.append(bytes(mutated))
            for varint in hostile_varints:
                candidates.append(frame[:pos] + varint + frame[pos + 1:])
            for candidate in candidates:
                try:
                    decode_request(candidate)
                except MalformedInput:
                    pass
                decoded += 1
    print(decoded)
    """
)


@pytest.mark.slow
def test_hostile_lengths_never_allocate_beyond_the_frame(tmp_path: Path) -> None:
    samples: list[Path] = list(GOLDEN)
    for key, version in DECODABLE:
        path = tmp_path / f"{key}-{version}.bin"
        body = sample(request_type(key, version))
        path.write_bytes(encode_request(RequestHeader(key, version, 1, "h"), body)[4:])
        samples.append(path)
    result = subprocess.run(
        [sys.executable, "-c", _HOSTILE_CHILD, *map(str, samples)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) > 10_000
