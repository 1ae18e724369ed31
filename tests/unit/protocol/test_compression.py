"""Codecs: every codec round-trips, both snappy framings decode, zstd frames without a content
size decode, and decompression stops at its cap instead of exhausting memory."""

from __future__ import annotations

import gzip
import io
import struct

import cramjam
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import Codec, MalformedInput
from broker.protocol.compression import compress, decompress


@given(codec=st.sampled_from(list(Codec)), data=st.binary(max_size=4096))
def test_every_codec_round_trips(codec: Codec, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


def test_xerial_snappy_as_java_writes_it() -> None:
    """snappy-java framing: magic, version 1, compatible version 1, then length-prefixed raw
    snappy blocks."""
    blocks = [b"first block " * 50, b"second " * 30]
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for block in blocks:
        raw = bytes(cramjam.snappy.compress_raw(block))
        framed += struct.pack(">i", len(raw)) + raw
    assert decompress(Codec.SNAPPY, framed) == b"".join(blocks)


def test_zstd_streamed_frames_without_content_size() -> None:
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as writer:
        writer.write(b"streamed " * 1000)
    frame = out.getvalue()
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(Codec.ZSTD, frame + frame) == b"streamed " * 2000


def test_gzip_from_the_stdlib_module() -> None:
    assert decompress(Codec.GZIP, gzip.compress(b"abc" * 100)) == b"abc" * 100


@pytest.mark.parametrize("codec", [c for c in Codec if c is not Codec.NONE])
def test_decompression_bomb_is_refused_at_the_cap(codec: Codec) -> None:
    bomb = compress(codec, b"\x00" * (4 * 1024 * 1024))
    assert len(bomb) < 300 * 1024
    with pytest.raises(MalformedInput, match="more than 1048576 bytes"):
        decompress(codec, bomb, max_bytes=1024 * 1024)


@pytest.mark.parametrize("codec", [c for c in Codec if c is not Codec.NONE])
def test_corrupt_compressed_data_is_malformed(codec: Codec) -> None:
    data = bytearray(compress(codec, b"hello world " * 100))
    del data[len(data) // 2 :]
    with pytest.raises(MalformedInput):
        decompress(codec, bytes(data))
