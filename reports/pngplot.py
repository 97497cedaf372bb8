"""A tiny scatter-plot PNG writer (stdlib only: zlib + struct).

Why not matplotlib: one small chart per run does not justify a plotting
stack (matplotlib, numpy, pillow, fonts) in the pinned dependencies. The
chart has axes, tick labels (digits only, 3x5 pixel font), series of points
and horizontal reference lines; what each colour means goes in the
attachment's name and its companion data file.
"""
from __future__ import annotations

import math
import struct
import zlib

W, H, LEFT, BOTTOM, TOP, RIGHT = 640, 360, 44, 24, 12, 12
FONT = {  # 3x5 digits, rows top to bottom
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "s": "000011010001110",
}
COLOURS = {"blue": (31, 119, 180), "orange": (255, 127, 14), "red": (214, 39, 40),
           "grey": (120, 120, 120), "green": (44, 160, 44), "black": (0, 0, 0)}


class Canvas:
    def __init__(self, w: int = W, h: int = H):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def set(self, x: int, y: int, c: tuple[int, int, int]) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def hline(self, x0, x1, y, c):
        for x in range(x0, x1 + 1):
            self.set(x, y, c)

    def vline(self, x, y0, y1, c):
        for y in range(y0, y1 + 1):
            self.set(x, y, c)

    def text(self, x: int, y: int, s: str, c=COLOURS["black"]) -> None:
        for ch in s:
            glyph = FONT.get(ch)
            if glyph:
                for r in range(5):
                    for k in range(3):
                        if glyph[r * 3 + k] == "1":
                            self.set(x + k, y + r, c)
            x += 4

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _ticks(hi: float) -> list[float]:
    step = 10 ** (math.floor(math.log10(hi)) - 1) if hi > 0 else 1
    for m in (1, 2, 5, 10, 20, 50, 100):
        if hi / (step * m) <= 6:
            step *= m
            break
    return [i * step for i in range(int(hi / step) + 1)]


def _label(v: float) -> str:
    return f"{v:g}" if v >= 1 or v == 0 else f"{v:.2g}"


def scatter(series: dict[str, list[tuple[float, float]]], hlines: dict[str, float] | None = None) -> bytes:
    """PNG of ``{colour: [(x, y), ...]}`` points and ``{colour: y}`` reference lines (x, y >= 0)."""
    hlines = hlines or {}
    pts = [p for s in series.values() for p in s if all(map(math.isfinite, p))]
    xmax = max([x for x, _ in pts] + [1e-3]) * 1.05
    ymax = max([y for _, y in pts] + list(hlines.values()) + [1e-3]) * 1.1
    c = Canvas()
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    sx = lambda x: LEFT + int(x / xmax * pw)  # noqa: E731
    sy = lambda y: TOP + ph - int(y / ymax * ph)  # noqa: E731
    black, grey = COLOURS["black"], (225, 225, 225)
    for t in _ticks(ymax):
        c.hline(LEFT, W - RIGHT, sy(t), grey)
        c.text(4, sy(t) - 2, _label(t))
    for t in _ticks(xmax):
        c.vline(sx(t), TOP, TOP + ph, grey)
        c.text(sx(t) - 4, H - BOTTOM + 6, _label(t))
    c.text(W - RIGHT - 4, H - BOTTOM + 14, "s")
    c.hline(LEFT, W - RIGHT, TOP + ph, black)
    c.vline(LEFT, TOP, TOP + ph, black)
    for colour, y in hlines.items():
        for x in range(LEFT, W - RIGHT, 6):
            c.hline(x, x + 3, sy(y), COLOURS[colour])
    for colour, points in series.items():
        rgb = COLOURS[colour]
        for x, y in points:
            if math.isfinite(x) and math.isfinite(y):
                for dx in (-1, 0, 1):
                    for dy in (-1, 0, 1):
                        c.set(sx(x) + dx, sy(y) + dy, rgb)
    return c.png()
