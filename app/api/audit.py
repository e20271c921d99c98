"""GET /audit: the caller's tenant's audit trail, newest first (SPEC §16; scope audit:read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import SessionDep, TenantDep
from app.api.errors import error_responses
from app.api.usage import Instant
from app.db import audit
from app.errors import RequestInvalid
from app.schemas import AuditAction, AuditEntry, AuditPage

router = APIRouter(tags=["audit"])


@router.get("/audit", response_model=AuditPage, responses=error_responses(401, 403, 422),
            summary="Who changed what: the tenant's audit trail, newest first")
async def list_audit(
    session: SessionDep, tenant: TenantDep,
    start: Annotated[Instant, Query(alias="from", description="inclusive start: ISO-8601 "
                                    "date or datetime (naive = UTC)")] = None,
    end: Annotated[Instant, Query(alias="to", description="exclusive end: ISO-8601 date or "
                                  "datetime (naive = UTC)")] = None,
    action: Annotated[AuditAction | None, Query(description="only this action")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=500,
                                        description="`next_cursor` of the previous page")] = None,
) -> AuditPage:
    """Every change a caller of this tenant made (create, cancel, retry, approve, reject, erase,
    a facade swarm `chat`, a `passthrough` call): when, by which key (its id), on which swarm,
    from which request and address."""
    if start is not None and end is not None and end < start:
        raise RequestInvalid("to: must not be before from", details=[
            {"field": "to", "message": "must not be before from", "type": "value_error",
             "input": end.isoformat()}])
    try:
        async with session.begin():
            items, next_cursor = await audit.page(session, tenant, since=start, until=end,
                                                  action=action, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise RequestInvalid(str(exc), code="invalid_cursor",
                             details={"field": "cursor"}) from exc
    return AuditPage(items=[AuditEntry.model_validate(i) for i in items], next_cursor=next_cursor)
