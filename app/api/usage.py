"""GET /usage: tokens and exact spend from the gateway_calls ledger, tenant-scoped."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BeforeValidator, WithJsonSchema

from app.api.deps import SessionDep, TenantDep
from app.api.errors import error_responses
from app.db import spend
from app.db.spend import UsageRow
from app.errors import RequestInvalid
from app.pricing import usd_str
from app.schemas import GroupBy, UsageFigures, UsageItem, UsageReport

router = APIRouter(tags=["usage"])

# an unencoded "+01:00" in a query string arrives as " 01:00": put the plus sign back
_SPACED_OFFSET = re.compile(r"(\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?) (\d{2}:?\d{2})$")


def _instant(value: Any) -> Any:
    """An ISO-8601 date (midnight UTC) or datetime (naive means UTC) as an aware datetime."""
    if not isinstance(value, str):
        return value
    text = _SPACED_OFFSET.sub(r"\1+\2", value.strip())
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        when = datetime.fromisoformat(text)
        # the instant in UTC, as stored: 0001-01-01T00:00:00+14:00 has none (OverflowError)
        return when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise ValueError("expected an ISO-8601 date (2026-11-29) or datetime "
                         "(2026-11-29T12:00:00Z) between 0001-01-01 and 9999-12-31 UTC") from None


# documented as it is read: a date or a datetime (a bare `datetime` said date-time only, which
# the parameter's own example, a date, is not)
Instant = Annotated[datetime | None, BeforeValidator(_instant), WithJsonSchema({"anyOf": [
    {"type": "string", "format": "date"}, {"type": "string", "format": "date-time"},
    {"type": "null"}]})]


def _figures(rows: list[UsageRow]) -> dict[str, Any]:
    # Decimal addition of the per-group SQL sums: exact, so items always add up to the total
    cost = sum((r.cost_usd for r in rows), Decimal(0))
    unresolved = sum((r.unresolved_usd for r in rows), Decimal(0))
    return {"prompt_tokens": sum(r.prompt_tokens for r in rows),
            "completion_tokens": sum(r.completion_tokens for r in rows),
            "cached_tokens": sum(r.cached_tokens for r in rows),
            "cost_usd": usd_str(cost), "settled_usd": usd_str(cost - unresolved),
            "unresolved_usd": usd_str(unresolved),
            "gateway_calls": sum(r.gateway_calls for r in rows)}


@router.get("/usage", response_model=UsageReport, responses=error_responses(401, 422),
            summary="Spend and tokens from the ledger")
async def get_usage(
    session: SessionDep, tenant: TenantDep,
    start: Annotated[Instant, Query(alias="from", description="inclusive start: ISO-8601 "
                                    "date or datetime (naive = UTC)",
                                    openapi_examples={"a day": {"value": "2026-11-29"}})] = None,
    end: Annotated[Instant, Query(alias="to", description="exclusive end: ISO-8601 date or "
                                  "datetime (naive = UTC)",
                                  openapi_examples={"an instant": {
                                      "value": "2026-11-30T00:00:00Z"}})] = None,
    group_by: Annotated[GroupBy, Query(description="model, UTC day, or tenant")] = "model",
) -> UsageReport:
    """Every gateway attempt of the caller's tenant in [from, to), grouped; money is an exact
    decimal string and reconciles exactly with the sum of the swarms' `usage.cost_usd`."""
    if start is not None and end is not None and end < start:
        raise RequestInvalid("to: must not be before from", details=[
            {"field": "to", "message": "must not be before from", "type": "value_error",
             "input": end.isoformat()}])
    async with session.begin():
        rows = await spend.usage(session, tenant, start, end, group_by)
    return UsageReport(
        from_=start, to=end, group_by=group_by,
        items=[UsageItem(key=r.key, **_figures([r])) for r in rows],
        total=UsageFigures(**_figures(rows)))
