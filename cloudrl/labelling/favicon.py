"""The labelling page's icon: a 16 x 16 ICO made here (no image file in the repository).

Two bars side by side on the accent blue, the left one white and taller, the right one
orange: two segments compared. ``ICO`` holds the bytes ``GET /favicon.ico`` serves: one
32-bit BMP image (BGRA rows bottom-up, then the 1-bit AND mask, all opaque).
"""

from __future__ import annotations

import struct

SIZE = 16
BLUE, WHITE, ORANGE = (0x0B, 0x5C, 0xAD), (0xFF, 0xFF, 0xFF), (0xF5, 0x9E, 0x0B)


def pixel(x: int, y: int) -> tuple[int, int, int]:
    """The colour at column ``x``, row ``y`` (row 0 at the top)."""
    if 3 <= x <= 6 and 3 <= y <= 12:
        return WHITE
    if 9 <= x <= 12 and 6 <= y <= 12:
        return ORANGE
    return BLUE


def make_ico() -> bytes:
    """The ICO file's bytes."""
    rows = []
    for y in reversed(range(SIZE)):  # BMP rows are stored bottom-up
        rows.append(b"".join(bytes((b, g, r, 0xFF)) for r, g, b in
                             (pixel(x, y) for x in range(SIZE))))
    mask_row = ((SIZE + 31) // 32) * 4  # 1 bit a pixel, rows padded to 32 bits
    image = (struct.pack("<IiiHHIIiiII", 40, SIZE, 2 * SIZE, 1, 32, 0, 0, 0, 0, 0, 0)
             + b"".join(rows) + bytes(mask_row * SIZE))
    header = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", SIZE, SIZE, 0, 0, 1, 32, len(image), 6 + 16)
    return header + entry + image


ICO = make_ico()
