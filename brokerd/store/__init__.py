"""Durable state: the SMQP topic tree, contacts, retained messages and durable subscriptions.

Two implementations of one contract (:class:`brokerd.store.base.IStore`): :mod:`.sqlite`
(SQLite in WAL mode, one writer thread, group commit) and :mod:`.memory` (for tests and for a
broker that needs no durability).  Every call returns a Deferred; nothing blocks the reactor.
"""
