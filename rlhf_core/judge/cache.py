"""A persistent judgement cache: SQLite under the workdir, so a re-run sends no request twice.

Keyed by sha256 of (judge kind, model, template version, criteria text, prompt, first answer,
second answer). Each put is one SQLite transaction, so a killed run keeps every judgement it
finished and never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

from rlhf_core.judge.protocol import Judgement


def judgement_key(kind: str, model: str, template_version: str, criteria: str, prompt: str, first: str,
                  second: str) -> str:
    """sha256 of the seven parts as a JSON list (unambiguous whatever the texts contain)."""
    parts = [kind, model, template_version, criteria, prompt, first, second]
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


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

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM judgements").fetchone()[0]

    def close(self) -> None:
        self._db.close()
