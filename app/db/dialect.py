"""What the database behind the service can do, asked by name: the one place outside a
statement that knows which database it is. `api/`, `engine/` and the entry points ask
`dialect_of(...)` what (does it listen for changes? does a creation admit in its insert?),
never which; the statements each dialect writes its own way stay in app/db."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.listener import ChangeListener, NotifySender

__all__ = ["POSTGRESQL", "SQLITE", "ChangeListener", "Dialect", "NotifySender", "change_listener",
           "dialect_of", "engine_of", "migrates_on_start", "notify_sender"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """The capabilities of one database the service runs on."""

    name: str
    # several processes share it (API replicas, workers, `serve --workers`); else it is a local
    # file embedded in this one process, which answers at once and has no operator migrating it
    shared: bool
    # LISTEN/NOTIFY: one process's commits (a new swarm, a cancel, a token) wake the others
    listens_for_changes: bool
    # a creation is one statement that checks the tenant's quotas and the Idempotency-Key and
    # inserts (tenant_admit in the insert); an admission alone is one statement too
    admits_in_the_insert: bool
    # the hot path's statements run as transactions of their own on the driver, outside the
    # ORM (the group commit's connection, the tenant cap's batches)
    statements_alone: bool


POSTGRESQL = Dialect("postgresql", shared=True, listens_for_changes=True,
                     admits_in_the_insert=True, statements_alone=True)
SQLITE = Dialect("sqlite", shared=False, listens_for_changes=False,
                 admits_in_the_insert=False, statements_alone=False)
_BY_NAME = {d.name: d for d in (POSTGRESQL, SQLITE)}

Where = str | AsyncEngine | AsyncSession | async_sessionmaker[AsyncSession]


def dialect_of(where: Where) -> Dialect:
    """The dialect of a database URL (SWARM_DATABASE_URL, normalised by Settings), an engine,
    a session of the app's factory, or that factory."""
    if isinstance(where, str):
        return _BY_NAME[where.partition("+")[0].partition(":")[0]]
    return _BY_NAME[engine_of(where).dialect.name]


def engine_of(where: AsyncEngine | AsyncSession | async_sessionmaker[AsyncSession]
              ) -> AsyncEngine:
    """The engine an engine, a session of the app's factory, or that factory is bound to."""
    if isinstance(where, AsyncSession):
        engine = where.bind
    elif isinstance(where, async_sessionmaker):
        engine = where.kw["bind"]
    else:
        engine = where
    assert isinstance(engine, AsyncEngine)  # make_session_factory binds every session
    return engine


def migrates_on_start(database_url: str, auto_migrate: bool) -> bool:
    """Whether a process migrates the schema as it starts: when asked (SWARM_AUTO_MIGRATE), and
    always for a database embedded in it, which no operator migrates."""
    return auto_migrate or not dialect_of(database_url).shared


def change_listener(database_url: str, handlers: Mapping[str, Callable[[str], None]], *,
                    on_connect: Callable[[], None] | None = None) -> ChangeListener | None:
    """A listener of the channels of app/db/notify.py (not started), or None for a database
    that does not notify (its one process wakes its readers in memory)."""
    if not dialect_of(database_url).listens_for_changes:
        return None
    return ChangeListener(database_url, handlers, on_connect=on_connect)


def notify_sender(database_url: str, channel: str) -> NotifySender | None:
    """A sender of `channel`'s notifications from a connection of its own, or None for a
    database that does not notify."""
    if not dialect_of(database_url).listens_for_changes:
        return None
    return NotifySender(database_url, channel)
