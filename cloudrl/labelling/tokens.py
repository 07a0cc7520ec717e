"""Operators and their tokens: created once, shown once, stored only as a sha256 hash.

A token is 32 random bytes (``secrets.token_urlsafe``), so a plain sha256 is enough to
store it (no dictionary to attack); lookups compare the hash through the unique index.
An admin operator's token also opens the queue, quality and export endpoints.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
TOKEN_PREFIX = "lbl_"


@dataclass(frozen=True)
class Operator:
    """An operator as the service sees one (never the token)."""

    id: int
    name: str
    is_admin: bool


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def add_operator(conn: sqlite3.Connection, name: str, *, admin: bool = False) -> str:
    """Create operator ``name``; returns the token (the only time it exists in clear)."""
    if not NAME_RE.match(name or ""):
        raise ValueError(f"operator name {name!r}: use 1-64 letters, digits, '_', '.', '@' "
                         "or '-', starting with a letter or digit")
    token = new_token()
    try:
        conn.execute("INSERT INTO operators (name, token_hash, is_admin, created_at) "
                     "VALUES (?, ?, ?, ?)", (name, hash_token(token), int(admin), time.time()))
    except sqlite3.IntegrityError:
        raise ValueError(f"operator name {name!r}: already exists") from None
    return token


def rotate_token(conn: sqlite3.Connection, name: str) -> str:
    """A new token for ``name`` (the old one stops working)."""
    token = new_token()
    cur = conn.execute("UPDATE operators SET token_hash = ? WHERE name = ?",
                       (hash_token(token), name))
    if not cur.rowcount:
        raise ValueError(f"operator name {name!r}: no such operator")
    return token


def set_active(conn: sqlite3.Connection, name: str, active: bool) -> None:
    cur = conn.execute("UPDATE operators SET active = ? WHERE name = ?", (int(active), name))
    if not cur.rowcount:
        raise ValueError(f"operator name {name!r}: no such operator")


def list_operators(conn: sqlite3.Connection) -> list[dict]:
    rows = conn.execute("SELECT id, name, is_admin, active, created_at FROM operators "
                        "ORDER BY id").fetchall()
    return [{"id": r[0], "name": r[1], "admin": bool(r[2]), "active": bool(r[3]),
             "created_at": r[4]} for r in rows]


def operator_for_token(conn: sqlite3.Connection, token: str | None) -> Operator | None:
    """The active operator whose token this is, or None."""
    if not token or len(token) > 256:
        return None
    row = conn.execute("SELECT id, name, is_admin FROM operators WHERE token_hash = ? "
                       "AND active = 1", (hash_token(token),)).fetchone()
    return Operator(int(row[0]), str(row[1]), bool(row[2])) if row else None
