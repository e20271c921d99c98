"""The migrations build the schema the models describe (nothing autogenerate would add or
drop), and a migration that gives existing rows a new meaning fills it in:
`gateway_calls.at_bound` is true for the attempts `unresolved_usd` summed before it
(`unknown`, and `in_flight` ones, billed at their reservation if their answer never comes).
SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, text

from app.db.migrate import alembic_config, upgrade_head
from app.db.tables import METADATA
from tests.helpers import on_sync

BEFORE_AT_BOUND = "0006_tenant_quotas"


def test_the_migrations_build_the_models_schema(empty_url: str) -> None:
    upgrade_head(empty_url)

    def differences(conn: Connection) -> list[Any]:
        return list(compare_metadata(MigrationContext.configure(conn), METADATA))

    assert on_sync(empty_url, differences) == []


LEDGER_ROW = ("INSERT INTO gateway_calls (tenant, model, idempotency_key, attempt, outcome, "
              "prompt_tokens, completion_tokens, cached_tokens, cost_usd, reserved_usd, "
              "latency_ms, created_at) VALUES ('t', 'm', :key, 1, :outcome, 0, 0, 0, 0, 0, 0, "
              "'2026-12-01 00:00:00')")


def test_at_bound_marks_the_rows_unresolved_usd_summed(empty_url: str) -> None:
    command.upgrade(alembic_config(empty_url), BEFORE_AT_BOUND)
    outcomes = ("ok", "unknown", "in_flight", "server_error", "cancelled")

    def fill(conn: Connection) -> None:
        for outcome in outcomes:
            conn.execute(text(LEDGER_ROW), {"key": f"k-{outcome}", "outcome": outcome})

    on_sync(empty_url, fill)
    upgrade_head(empty_url)

    def marked(conn: Connection) -> dict[str, bool]:
        rows = conn.execute(text("SELECT outcome, at_bound FROM gateway_calls")).all()
        return {str(o): bool(b) for o, b in rows}

    assert on_sync(empty_url, marked) == {"ok": False, "unknown": True, "in_flight": True,
                                          "server_error": False, "cancelled": False}
    command.downgrade(alembic_config(empty_url), BEFORE_AT_BOUND)  # and back
    assert on_sync(empty_url, lambda c: c.execute(text("SELECT count(*) FROM gateway_calls"))
                   .scalar_one()) == len(outcomes)
