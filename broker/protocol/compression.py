"""The record batch codecs: gzip, snappy, lz4 and zstd, with a cap on what decompression may
produce so that a small hostile batch cannot expand into gigabytes.

Libraries: zlib (stdlib) for gzip; cramjam for snappy; lz4's frame module for LZ4 frames (what
Kafka ≥ 0.10 and every current client write); zstandard's incremental decompressor, because
producers may write frames without a content size and may concatenate frames.

Snappy arrives in two shapes: raw snappy blocks (librdkafka) and the xerial framing that
snappy-java, kafka-python and aiokafka write (an 8-byte magic, two int32 versions, then
int32-length-prefixed raw blocks). Both are accepted; raw is written.
"""

from __future__ import annotations

import enum
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from .errors import MalformedInput
from .primitives import Buffer

__all__ = ["DEFAULT_MAX_DECOMPRESSED_BYTES", "Codec", "compress", "decompress"]

DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
"""Cap on one batch's decompressed records; a produce request is at most 100 MiB compressed,
and real batches are far smaller (`max.request.size` defaults to 1 MiB)."""

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_INT32 = struct.Struct(">i")


class Codec(enum.IntEnum):
    """Bits 0–2 of a record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def compress(codec: Codec, data: Buffer) -> bytes:
    raw = bytes(data)
    if codec is Codec.NONE:
        return raw
    if codec is Codec.GZIP:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        return compressor.compress(raw) + compressor.flush()
    if codec is Codec.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(raw))
    if codec is Codec.LZ4:
        return bytes(lz4.frame.compress(raw))
    if codec is Codec.ZSTD:
        return bytes(zstandard.ZstdCompressor().compress(raw))
    raise ValueError(f"unknown codec {codec!r}")


def decompress(
    codec: Codec, data: Buffer, *, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
) -> bytes:
    """Decompress a batch's records; `MalformedInput` if corrupt or larger than `max_bytes`."""
    where = f"{codec.name.lower()} records"
    try:
        if codec is Codec.NONE:
            out = bytes(data)
        elif codec is Codec.GZIP:
            decompressor = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, detected
            out = decompressor.decompress(bytes(data), max_bytes + 1)
            if not decompressor.eof and len(out) <= max_bytes:
                raise MalformedInput("truncated gzip stream", where=where)
        elif codec is Codec.SNAPPY:
            out = _snappy_decompress(bytes(data), max_bytes, where)
        elif codec is Codec.LZ4:
            lz4_decompressor = lz4.frame.LZ4FrameDecompressor()
            out = lz4_decompressor.decompress(bytes(data), max_length=max_bytes + 1)
            if not lz4_decompressor.eof and len(out) <= max_bytes:
                raise MalformedInput("truncated lz4 frame", where=where)
        elif codec is Codec.ZSTD:
            out = _zstd_decompress(memoryview(data), max_bytes, where)
        else:
            raise MalformedInput(f"unknown compression codec {int(codec)}", where=where)
    except MalformedInput:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # each library has its own error types; all mean corrupt input
        raise MalformedInput(f"corrupt compressed data: {exc}", where=where) from exc
    if len(out) > max_bytes:
        raise MalformedInput(f"decompresses to more than {max_bytes} bytes", where=where)
    return out


_ZSTD_STEP = 1024
"""Compressed bytes fed to zstd per call. A zstd block can expand ~30 000-fold, so small steps
keep the overshoot past `max_bytes` to a few tens of MiB at most."""


def _zstd_decompress(data: memoryview, max_bytes: int, where: str) -> bytes:
    """Decompress one or more concatenated zstd frames, with or without a content size."""
    context = zstandard.ZstdDecompressor()
    out = bytearray()
    remaining = data
    while remaining:
        frame = context.decompressobj()
        fed = 0
        while not frame.eof:
            if fed >= len(remaining):
                raise MalformedInput("truncated zstd frame", where=where)
            step = remaining[fed : fed + _ZSTD_STEP]
            fed += len(step)
            out += frame.decompress(step)
            if len(out) > max_bytes:
                raise MalformedInput(f"decompresses to more than {max_bytes} bytes", where=where)
        remaining = remaining[fed - len(frame.unused_data) :]
    return bytes(out)


def _snappy_decompress(data: bytes, max_bytes: int, where: str) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, max_bytes, where)
    if len(data) < _XERIAL_HEADER.size:
        raise MalformedInput("truncated xerial snappy header", where=where)
    out = bytearray()
    pos = _XERIAL_HEADER.size
    while pos < len(data):
        if pos + 4 > len(data):
            raise MalformedInput("truncated xerial snappy block length", where=where)
        (size,) = _INT32.unpack_from(data, pos)
        pos += 4
        if size < 0 or pos + size > len(data):
            raise MalformedInput(f"xerial snappy block of {size} bytes is truncated", where=where)
        out += _snappy_block(data[pos : pos + size], max_bytes - len(out), where)
        pos += size
    return bytes(out)


def _snappy_block(block: bytes, max_bytes: int, where: str) -> bytes:
    # The raw format starts with the uncompressed length: check it before allocating.
    claimed = cramjam.snappy.decompress_raw_len(block)
    if claimed > max_bytes:
        raise MalformedInput(f"decompresses to more than {max_bytes} bytes", where=where)
    return bytes(cramjam.snappy.decompress_raw(block))
