"""One transaction, retried with tenacity while the database is unreachable (a restart, a
failover); any other error is raised at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from app.db.session import SessionFactory

log = logging.getLogger(__name__)
T = TypeVar("T")


def database_unavailable(exc: BaseException) -> bool:
    """A lost or refused database connection (restart, failover), not a bad statement."""
    if isinstance(exc, (OSError, ConnectionError, PoolTimeout)):
        return True  # a pool with no connection to give within its timeout counts as down
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError)):
            return True
        return _lost_connection(exc.orig) or isinstance(exc.orig, OSError)
    # asyncpg's own errors, from a connection used without SQLAlchemy (the group commit's)
    return isinstance(exc, asyncpg.InterfaceError) or _lost_connection(exc)


# SQLSTATE 42P01 (undefined table), 42703 (undefined column), 42883 (undefined function: a
# migration's function, as `tenant_admit`): a schema behind the code's
_SCHEMA_BEHIND = ("42P01", "42703", "42883")


def database_not_migrated(exc: BaseException) -> bool:
    """A statement that names a table, column or function the database does not have yet:
    `serve` started before `swarm-api migrate` (PostgreSQL; SQLite migrates itself on
    start)."""
    orig = _driver_error(exc)
    return str(getattr(orig, "sqlstate", "") or "") in _SCHEMA_BEHIND


def log_db_failure(logger: logging.Logger, what: str, exc: BaseException,
                   then: str = "retrying") -> None:
    """A background round that failed and will be tried again (`then` says when): an outage
    or a schema not yet migrated is one line (each would be the same traceback, about once a
    second); anything else keeps its traceback."""
    if database_unavailable(exc):
        logger.warning("%s: database unavailable (%s); %s", what, reason(exc), then)
    elif database_not_migrated(exc):
        logger.warning("%s: database not migrated (run `swarm-api migrate`); %s", what, then)
    else:
        logger.error("%s failed; %s", what, then, exc_info=exc)


def _lost_connection(exc: BaseException | None) -> bool:
    # SQLSTATE classes 08 (connection exception), 57 (operator intervention: shutdown) and 28
    # (authorization: a password being rotated), and 3D000 (the database is not created yet):
    # no connection to work with, which retrying may get once its operator acts
    state = str(getattr(exc, "sqlstate", "") or "")
    return state[:2] in ("08", "57", "28") or state == "3D000"


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's own error inside SQLAlchemy's wrapper (which carries its SQLSTATE)."""
    return exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc


def reason(exc: BaseException) -> str:
    """A database error in one line for a log: the driver's type and first line (a refused
    port, a missing database, a failed password); never the statement or its parameters."""
    orig = _driver_error(exc)
    first = next(iter(str(orig).splitlines()), "")[:200]
    return f"{type(orig).__name__}: {first}" if first else type(orig).__name__


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("database unavailable (%s); retrying transaction",
                reason(exc) if exc else None)


# stateless: built once, not per transaction (every group commit goes through here)
_RETRY = retry_if_exception(database_unavailable)
_WAIT = wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05)


async def in_transaction(sessions: SessionFactory, op: Callable[[AsyncSession], Awaitable[T]],
                         *, retry_for_s: float) -> T:
    """Run `op` in one transaction; while the database is unavailable, retry with jittered
    exponential backoff for up to `retry_for_s` seconds, then raise the last error."""
    async def once() -> T:
        async with sessions() as session, session.begin():
            return await op(session)
    return await retrying(once, retry_for_s)


async def retrying(once: Callable[[], Awaitable[T]], retry_for_s: float) -> T:
    """`once()`, retried like `in_transaction` while the database is unavailable."""
    # The first try is made before tenacity is entered, as the gateway client's is: an
    # AsyncRetrying per transaction (its call state, thread-local statistics, lock) is a
    # reference cycle each, garbage only the collector's rare full passes free (~12 objects
    # per group commit), and nearly every transaction commits at once. A failure that is an
    # outage is tenacity's first attempt, so every decision after it is still tenacity's.
    started = time.monotonic()
    try:
        return await once()
    except Exception as exc:
        if not database_unavailable(exc):
            raise
        first: Exception | None = exc
    async for attempt in AsyncRetrying(
        retry=_RETRY, wait=_WAIT,
        stop=stop_after_delay(max(retry_for_s - (time.monotonic() - started), 0.0)),
        before_sleep=_log_retry,
        reraise=True,
    ):
        with attempt:
            if first is not None:
                failed, first = first, None
                raise failed
            return await once()
    raise AssertionError("unreachable: tenacity re-raises")
