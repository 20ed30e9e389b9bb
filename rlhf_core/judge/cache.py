"""A persistent judgement cache: SQLite under the workdir, so a re-run sends no request twice.

Pairwise judgements are keyed by sha256 of (judge kind, model, template version, criteria text,
prompt, first answer, second answer); single-answer grades, in their own table, by sha256 of
(judge kind, model, grading template version, grading criteria text, prompt, answer). Each put is
one SQLite transaction, so a killed run keeps every judgement it finished and never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
from pathlib import Path

from rlhf_core.judge.grading import Grade
from rlhf_core.judge.protocol import Judgement


def cache_key(*parts: str) -> str:
    """sha256 of the parts as a JSON list (unambiguous whatever the texts contain)."""
    return hashlib.sha256(json.dumps(list(parts), ensure_ascii=False).encode()).hexdigest()


def judgement_key(kind: str, model: str, template_version: str, criteria: str, prompt: str, first: str,
                  second: str) -> str:
    """The key of a pairwise judgement of (prompt, first, second) in this order."""
    return cache_key(kind, model, template_version, criteria, prompt, first, second)


def grade_key(kind: str, model: str, template_version: str, criteria: str, prompt: str, answer: str) -> str:
    """The key of a single-answer grade of (prompt, answer)."""
    return cache_key(kind, model, template_version, criteria, prompt, answer)


class JudgementCache:
    """get/put of Judgements by key; safe to share between the threads of one judge."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        with self._lock, self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS judgements (key TEXT PRIMARY KEY, outcome TEXT NOT NULL, "
                             "rationale TEXT NOT NULL, parse_status TEXT NOT NULL, parse_reason TEXT NOT NULL)")
            # rating NULL: the reply could not be parsed
            self._db.execute("CREATE TABLE IF NOT EXISTS grades (key TEXT PRIMARY KEY, rating REAL, "
                             "rationale TEXT NOT NULL, parse_status TEXT NOT NULL, parse_reason TEXT NOT NULL)")

    def get(self, key: str) -> Judgement | None:
        with self._lock:
            row = self._db.execute("SELECT outcome, rationale, parse_status, parse_reason FROM judgements "
                                   "WHERE key = ?", (key,)).fetchone()
        return Judgement(*row) if row else None

    def put(self, key: str, judgement: Judgement) -> None:
        with self._lock, self._db:  # one transaction: committed whole or not at all
            self._db.execute("INSERT OR REPLACE INTO judgements VALUES (?, ?, ?, ?, ?)",
                             (key, judgement.outcome, judgement.rationale, judgement.parse_status,
                              judgement.parse_reason))

    def get_grade(self, key: str) -> Grade | None:
        with self._lock:
            row = self._db.execute("SELECT rating, rationale, parse_status, parse_reason FROM grades WHERE key = ?",
                                   (key,)).fetchone()
        if row is None:
            return None
        return Grade(float("nan") if row[0] is None else row[0], *row[1:])

    def put_grade(self, key: str, grade: Grade) -> None:
        rating = None if math.isnan(grade.rating) else grade.rating
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO grades VALUES (?, ?, ?, ?, ?)",
                             (key, rating, grade.rationale, grade.parse_status, grade.parse_reason))

    def __len__(self) -> int:
        """Pairwise judgements held (grades not counted)."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM judgements").fetchone()[0]

    def close(self) -> None:
        self._db.close()
