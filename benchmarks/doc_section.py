"""A benchmark's own section of a markdown doc, between its markers: written again on every run, the rest kept."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf_core.artifacts import atomic_write_text  # noqa: E402


def replace_section(doc: Path, section: str, start: str, end: str, new_doc_header: str) -> None:
    """Put `section` (which begins with `start` and ends with `end`) into `doc` in place of its earlier one, or at
    the end; a doc that does not exist yet begins with `new_doc_header`. Written atomically."""
    text = doc.read_text() if doc.exists() else new_doc_header
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(doc, text)
