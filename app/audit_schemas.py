"""The audit trail's answer (SPEC §16), shared by the API and the client."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

AuditAction = Literal["create", "cancel", "retry", "approve", "reject", "erase", "chat",
                      "passthrough"]


class AuditEntry(BaseModel):
    time: datetime
    tenant: str
    key_id: str | None = Field(description="the id of the caller's API key (never the key); "
                               "null while the API has no keys")
    action: AuditAction
    swarm_id: str | None = Field(description="the swarm the change is about (a retry's: the "
                                 "new swarm); null for a passthrough call")
    request_id: str | None = Field(description="the request's X-Request-Id, else its trace "
                                   "id, else one the service made")
    client: str | None = Field(description="the client's address as the service saw it")


class AuditPage(BaseModel):
    items: list[AuditEntry]
    next_cursor: str | None
