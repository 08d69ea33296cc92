"""Real PNG files of a given aspect ratio, made with zlib alone."""

from __future__ import annotations

import struct
import zlib


def size_for(aspect_ratio: str, long_side: int) -> tuple[int, int]:
    """Width and height for ``W:H`` (``auto`` is square) with the longer side ``long_side``."""
    if ":" not in aspect_ratio:
        return long_side, long_side
    w, h = (int(part) for part in aspect_ratio.split(":"))
    if w >= h:
        return long_side, max(1, round(long_side * h / w))
    return max(1, round(long_side * w / h)), long_side


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, seed: int) -> bytes:
    """An RGB gradient, its colours from ``seed``: different tasks give different bytes."""
    r0, g0, b0 = seed & 0xFF, (seed >> 8) & 0xFF, (seed >> 16) & 0xFF
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        gy = (g0 + 255 * y // max(1, height - 1)) & 0xFF
        for x in range(width):
            rows += bytes(((r0 + 255 * x // max(1, width - 1)) & 0xFF, gy, b0))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(bytes(rows), 6))
        + _chunk(b"IEND", b"")
    )
