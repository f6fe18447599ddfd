"""``--store``: which durable store a broker uses.

Without it, the SMQP front end opens the SQLite file in DATA_DIR (one node, no dependency).
With ``--store postgresql://user@host:port/db`` (or ``postgres://``) every node of a cluster
keeps its durable state in that database (:mod:`brokerd.store.postgresql`); the password comes
from the URL or from ``--store-password-file``.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from brokerd.errors import INSTALL_CLUSTER, ConfigurationError
from brokerd.interfaces import IBrokerReactor
from brokerd.store.pg_writer import connection_info, is_postgres_url, redacted

if TYPE_CHECKING:  # imported when a PostgreSQL store is made (psycopg's extra)
    from brokerd.store.postgresql import PostgreSQLStore


def check_store_url(url: str, password_file: Path | None) -> str:
    """The libpq connection string of ``--store``; ConfigurationError (one line) when the URL
    is not usable or psycopg is not installed."""
    if not is_postgres_url(url):
        raise ConfigurationError(f"--store {redacted(url)}: only postgresql:// URLs are supported"
                                 " (without --store: the SQLite file in --data-dir)")
    try:
        info = connection_info(url, password_file)
    except ValueError as exc:
        raise ConfigurationError(f"--store {redacted(url)}: {exc}") from None
    if importlib.util.find_spec("psycopg") is None:
        raise ConfigurationError(f"--store postgresql:// needs psycopg: {INSTALL_CLUSTER}")
    return info


REFUSED_AT_LOGIN = ("does not exist", "password authentication failed", "no pg_hba.conf entry",
                    "certificate authentication failed")
"""What a PostgreSQL server says (FATAL, at connection) when the URL names what it does not
have: a database or role that does not exist, a wrong password, a client it does not admit.
Its answers for a passing state (starting up, shutting down, too many connections) are not
among them."""


def check_database(url: str, info: str) -> None:
    """Connect once, at start: a server that answers that the URL is wrong is a
    ConfigurationError (one line, exit 1), as any other option that names what does not
    exist.  A server that cannot be reached is an outage, not an error: the store waits for
    it (docs/cluster.md), so that is left to the store."""
    import psycopg

    try:
        psycopg.connect(info).close()
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        fatal = text.partition("FATAL: ")[2]
        if fatal and any(refusal in fatal for refusal in REFUSED_AT_LOGIN):
            raise ConfigurationError(f"--store {redacted(url)}: the server refuses it: {fatal}") from None


def store_for(url: str, password_file: Path | None, reactor: IBrokerReactor) -> PostgreSQLStore:
    """The (not yet opened) store ``--store`` names."""
    from brokerd.store.postgresql import PostgreSQLStore

    return PostgreSQLStore(url, check_store_url(url, password_file), reactor)
