"""The frame reader cuts a byte stream into frames however the bytes arrive, and refuses
oversized or negative frames before buffering them."""

from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    DEFAULT_MAX_REQUEST_BYTES,
    FrameReader,
    FrameTooLarge,
    MalformedInput,
    encode_frame,
    framing,
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(
    payloads=st.lists(st.binary(max_size=200), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
)
def test_frames_round_trip_whatever_the_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    reader = FrameReader()
    frames: list[bytes] = []
    for chunk in _split(stream, cuts):
        reader.receive_data(chunk)
        while (frame := reader.next_frame()) is not None:
            frames.append(bytes(frame))
    assert frames == payloads
    assert reader.buffered_bytes == 0


def _gather_and_take(reader: FrameReader) -> list[bytes]:
    """What a server does after each read: gather a large pending frame, take what is whole."""
    frames = []
    reader.gather()
    while (frame := reader.next_frame()) is not None:
        frames.append(bytes(frame))
        reader.gather()
    return frames


@given(
    payloads=st.lists(st.binary(max_size=100), max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
)
def test_gathered_frames_come_out_whatever_the_chunking(
    payloads: list[bytes], cuts: list[int]
) -> None:
    """Frames over the gathering threshold (lowered to 16 bytes here), gathered as a server
    does once their size prefix is in, come out the same however their chunks straddle them
    and the frames around them."""
    stream = b"".join(encode_frame(p) for p in payloads)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "GATHER_BYTES", 16)
        reader = FrameReader()
        frames: list[bytes] = []
        for chunk in _split(stream, cuts):
            reader.receive_data(chunk)
            assert reader.buffered_bytes <= len(stream)
            frames += _gather_and_take(reader)
    assert frames == payloads
    assert reader.buffered_bytes == 0


@given(
    payloads=st.lists(st.binary(max_size=100), max_size=8),
    sizes=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=30),
)
def test_frames_received_in_place_come_out_whatever_the_reads(
    payloads: list[bytes], sizes: list[int]
) -> None:
    """A server reading its socket into `receive_buffer` while a frame is gathered, and
    through `receive_data` otherwise (each read at most `sizes[i]` bytes), gets the same frames
    as from any other chunking; the buffer offered never reaches past the gathered frame."""
    stream = memoryview(b"".join(encode_frame(p) for p in payloads))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "GATHER_BYTES", 16)
        reader = FrameReader()
        frames: list[bytes] = []
        position = 0
        for read in itertools.cycle(sizes):
            if position == len(stream):
                break
            place = reader.receive_buffer()
            if place is None:
                count = min(read, len(stream) - position)
                reader.receive_data(stream[position : position + count])
            else:
                assert len(place) <= len(stream) - position  # the rest of one frame, no more
                count = min(read, len(place))
                place[:count] = stream[position : position + count]
                reader.received_into(count)
            position += count
            frames += _gather_and_take(reader)
    assert frames == payloads
    assert reader.buffered_bytes == 0


def test_bytes_beyond_the_gathered_frame_are_refused() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "GATHER_BYTES", 16)
        reader = FrameReader()
        reader.receive_data(struct.pack(">i", 32) + b"x" * 4)
        reader.gather()
        place = reader.receive_buffer()
        assert place is not None
        assert len(place) == 28
        with pytest.raises(ValueError, match="do not fit"):
            reader.received_into(29)


def test_a_gathered_frame_is_copied_once_into_memory_of_its_own() -> None:
    """Gathering copies each chunk once into a mapping of the frame's size, allocated when
    asked (outside Python's heap, given back to the system with the frame): nothing on the
    heap holds a copy of the frame, neither a growing buffer with the frame cut out of it
    (twice the frame and more) nor the chunks joined."""
    payload = bytes(range(256)) * (4 * 1024)  # 1 MiB
    chunks = _split(encode_frame(payload), list(range(0, 1 << 20, 64 * 1024)))
    reader = FrameReader()
    tracemalloc.start()
    try:
        for chunk in chunks:
            reader.receive_data(chunk)
            reader.gather()
        frame = reader.next_frame()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(frame, memoryview)
    assert frame.readonly
    assert frame == payload
    assert peak < 128 * 1024, peak  # the first 64 KiB read, buffered until the prefix is known


def test_nothing_is_allocated_for_a_large_frame_until_it_is_gathered() -> None:
    """Without `gather` (the server has not reserved the memory yet), a large frame's prefix
    costs only the bytes that came with it."""
    reader = FrameReader()
    tracemalloc.start()
    try:
        reader.receive_data(struct.pack(">i", 8 * 1024 * 1024) + b"abc")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.next_frame() is None
    assert peak < 64 * 1024


def test_default_limit_is_kafkas_socket_request_max_bytes() -> None:
    assert DEFAULT_MAX_REQUEST_BYTES == 100 * 1024 * 1024


def test_frame_over_the_limit_is_refused_from_its_size_prefix_alone() -> None:
    reader = FrameReader(max_frame_bytes=1000)
    reader.receive_data(struct.pack(">i", 1001))
    with pytest.raises(FrameTooLarge) as caught:
        reader.next_frame()
    assert caught.value.size == 1001
    assert "socket.request.max.bytes=1000" in str(caught.value)
    # The stream is out of sync: the reader keeps refusing rather than guessing.
    reader.receive_data(encode_frame(b"ok"))
    with pytest.raises(FrameTooLarge):
        reader.next_frame()


def test_frame_at_the_limit_is_accepted() -> None:
    reader = FrameReader(max_frame_bytes=10)
    reader.receive_data(encode_frame(b"x" * 10))
    assert reader.next_frame() == b"x" * 10


def test_negative_size_is_malformed() -> None:
    reader = FrameReader()
    reader.receive_data(struct.pack(">i", -5))
    with pytest.raises(MalformedInput, match="negative frame size -5"):
        reader.next_frame()


def test_announced_size_allocates_nothing_until_bytes_arrive() -> None:
    """A client announcing 90 MiB and sending a few bytes costs a few bytes."""
    reader = FrameReader()
    tracemalloc.start()
    try:
        reader.receive_data(struct.pack(">i", 90 * 1024 * 1024) + b"abc")
        assert reader.next_frame() is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.pending_frame_size() == 90 * 1024 * 1024
    assert peak < 64 * 1024


def test_partial_size_prefix_waits() -> None:
    reader = FrameReader()
    reader.receive_data(b"\x00\x00")
    assert reader.next_frame() is None
    assert reader.pending_frame_size() is None
    reader.receive_data(b"\x00\x01z")
    assert reader.next_frame() == b"z"
