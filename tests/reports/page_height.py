"""An estimate of a rendered report page's height at 1400 px wide, from its HTML and PNGs alone (no
browser): what is in sight (outside folded <details>, or in a folded one's <summary>) counted as
images at their displayed size, table rows and lines of text.

Calibrated against headless Chromium 150 (window 1400 px wide) on three synthetic pages of
tests/reports: measured 10,507, 12,283 and 28,212 px (the last the page before issue 23 folded it),
estimated 11,111, 14,570 and 29,885 px. The raw count runs 5-18% low (wrapped table cells, figure
margins), so it is scaled by SAFETY and errs high: a page estimated under a bound is under it.
"""
from __future__ import annotations

import math
import struct
from html.parser import HTMLParser
from pathlib import Path

#: The page's content width at a 1400 px window: style.css's body max-width 1250 px less its padding.
CONTENT_PX = 1218
ROW_PX = 46  # a table row: one or two lines of 0.9 em text with padding
LINE_PX = 23  # a line of body text
CHARS_PER_LINE = 150
BLOCK_PX = 16  # the margins around a paragraph, heading or list item
SAFETY = 1.25
BLOCKS = {"p", "li", "h1", "h2", "h3", "summary", "figcaption", "pre"}


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG from its IHDR chunk (bytes 16-24, big-endian)."""
    head = path.read_bytes()[:24]
    return struct.unpack(">II", head[16:24])


class _Visible(HTMLParser):
    def __init__(self, folder: Path, open_all: bool):
        super().__init__(convert_charrefs=True)
        self.folder, self.open_all = folder, open_all
        self.details: list[bool] = []  # per enclosing <details>: open?
        self.in_summary: list[bool] = []
        self.height = 0.0
        self.text: list[str] = []  # text of the visible block being read
        self.blocks: list[str] = []
        self.cell_depth = 0

    def visible(self) -> bool:
        # every enclosing details open, except that the innermost closed one shows its summary
        closed = [i for i, is_open in enumerate(self.details) if not is_open]
        if not closed:
            return True
        return len(closed) == 1 and closed[0] == len(self.details) - 1 and bool(self.in_summary) and self.in_summary[-1]

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "details":
            self.details.append(self.open_all or "open" in a)
            self.in_summary.append(False)
        elif tag == "summary" and self.in_summary:
            self.in_summary[-1] = True
        if not self.visible():
            return
        if tag == "img" and a.get("src"):
            w, h = png_size(self.folder / a["src"])
            self.height += h * min(1.0, CONTENT_PX / w) + 2 * BLOCK_PX
        elif tag == "tr":
            self.height += ROW_PX
        elif tag in ("td", "th"):
            self.cell_depth += 1
        elif tag in BLOCKS and not self.cell_depth:
            self.blocks.append(tag)
            self.text = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.visible():
            self.cell_depth = max(0, self.cell_depth - 1)
        if tag in BLOCKS and self.blocks and self.blocks[-1] == tag and self.visible():
            self.blocks.pop()
            chars = len(" ".join("".join(self.text).split()))
            self.height += LINE_PX * max(1, math.ceil(chars / CHARS_PER_LINE)) + BLOCK_PX
            self.text = []
        if tag == "summary" and self.in_summary:
            self.in_summary[-1] = False
        elif tag == "details" and self.details:
            self.details.pop()
            self.in_summary.pop()

    def handle_data(self, data):
        if self.blocks and self.visible():
            self.text.append(data)


def estimate_height(page: str, folder: Path, open_all: bool = False) -> float:
    """The page's estimated height in px at 1400 px wide (``open_all``: every <details> opened).

    >>> from pathlib import Path
    >>> from tests.reports.page_height import estimate_height
    >>> page = "<p>in sight</p><details><summary>folded</summary><p>hidden</p></details>"
    >>> estimate_height(page, Path(".")) < estimate_height(page, Path("."), open_all=True)
    True
    """
    parser = _Visible(Path(folder), open_all)
    parser.feed(page)
    return SAFETY * parser.height
