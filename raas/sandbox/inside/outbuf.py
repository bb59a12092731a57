"""Collecting a command's output without holding all of it: head and tail, and what was cut."""

from __future__ import annotations

import re

# How much of the stream's end is kept for finding the end-of-command marker.
MARKER_WINDOW = 4096


class OutputBuffer:
    """Keeps the first and last ``max_bytes // 2`` bytes of a stream and counts the rest."""

    def __init__(self, max_bytes: int) -> None:
        self.half = max(max_bytes // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            keep = self.half + MARKER_WINDOW
            if len(self.tail) > 2 * keep:
                del self.tail[: len(self.tail) - keep]

    def recent(self) -> bytes:
        """The last MARKER_WINDOW bytes of the stream (nothing is ever cut from those)."""
        if len(self.tail) >= MARKER_WINDOW:
            return bytes(self.tail[-MARKER_WINDOW:])
        need = MARKER_WINDOW - len(self.tail)
        return bytes(self.head[-need:]) + bytes(self.tail)

    def find(self, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
        return pattern.search(self.recent())

    def text(self, cut_at_end: int = 0) -> tuple[str, int]:
        """The output as text, minus ``cut_at_end`` trailing bytes; and how many bytes were cut."""
        end_total = self.total - cut_at_end
        if end_total <= len(self.head):
            return self.head[:end_total].decode("utf-8", "replace"), 0
        tail = bytes(self.tail[: len(self.tail) - cut_at_end] if cut_at_end else self.tail)
        tail_len = min(len(tail), self.half, end_total - len(self.head))
        tail = tail[len(tail) - tail_len :]
        cut = end_total - len(self.head) - tail_len
        head = self.head.decode("utf-8", "replace")
        if cut <= 0:
            return head + tail.decode("utf-8", "replace"), 0
        note = (
            f"\n[... {cut} bytes of output cut:"
            f" kept the first {len(self.head)} and the last {tail_len} ...]\n"
        )
        return head + note + tail.decode("utf-8", "replace"), cut
