"""A throwaway PostgreSQL server for the tests that share a study across processes (the ``pg``
extra: pgserver and psycopg; the tests skip without it). Imported as ``from pg_helpers import ...``."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import tempfile
from pathlib import Path

import pytest


def pg_available() -> bool:
    """Whether the pg extra is installed (the PostgreSQL cases run rather than skip)."""
    return all(importlib.util.find_spec(m) is not None for m in ("pgserver", "psycopg"))


@contextlib.contextmanager
def pg_server():
    """A running pgserver, stopped and removed afterwards. Its data lives outside pytest's temporary
    folders: run as root, pgserver runs PostgreSQL as its own user, who must reach the folder, but
    every pytest session starting on the machine makes /tmp/pytest-of-USER private again (0700),
    which cuts a running server off (initdb then fails: pg_control "Permission denied")."""
    pgserver = pytest.importorskip("pgserver", reason="the pg extra (pgserver, psycopg) is not installed")
    pytest.importorskip("psycopg", reason="the pg extra (pgserver, psycopg) is not installed")
    root = Path(tempfile.mkdtemp(prefix="kvtune-test-pg-"))
    srv = pgserver.get_server(str(root / "pg"), cleanup_mode="stop")
    try:
        yield srv
    finally:
        srv.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def pg_url(srv, database: str | None = None) -> str:
    """The SQLAlchemy URL of ``database`` (None: the default one) on ``srv``, with the psycopg 3 driver."""
    if database is not None:
        srv.psql(f"CREATE DATABASE {database};")
    return srv.get_uri(database).replace("postgresql://", "postgresql+psycopg://", 1)
