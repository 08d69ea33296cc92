"""Real PNG files of a given aspect ratio, made with zlib alone."""

from __future__ import annotations

import random
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


def png(width: int, height: int, seed: int, *, min_size: int = 0) -> bytes:
    """A smooth gradient between two colours taken from ``seed``: different tasks, different
    bytes, and a picture pleasant enough for a demo."""
    start = (seed & 0xFF, (seed >> 8) & 0xFF, (seed >> 16) & 0xFF)
    stop = tuple(255 - c for c in reversed(start))
    span = max(1, width + height - 2)
    # The colour depends only on x + y: one table, and each row is a slice of it.
    table = [
        bytes(round(a + (b - a) * k / span) for a, b in zip(start, stop, strict=True))
        for k in range(width + height - 1)
    ]
    rows = b"".join(b"\x00" + b"".join(table[y : y + width]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows, 6))
    end = _chunk(b"IEND", b"")
    missing = min_size - len(body) - len(end)
    if missing > 0:
        # A private ancillary chunk ("paDd") that viewers skip: large files for benchmarks,
        # incompressible and the same for the same seed.
        body += _chunk(b"paDd", random.Random(seed).randbytes(max(0, missing - 12)))
    return body + end
