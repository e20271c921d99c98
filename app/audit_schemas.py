"""The audit trail's answer (SPEC §16), shared by the API and the client."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "items": [{"time": "2026-12-05T10:31:07.412000Z", "tenant": "acme", "key_id": "ci",
                   "action": "cancel", "swarm_id": "0b6f1c2e-8d1a-4a57-9c3e-2f7d9e6b1a44",
                   "request_id": "4bf92f3577b34da6a3ce929d0e0e4736", "client": "10.0.3.7"}],
        "next_cursor": "YTEyMw"}]})

    items: list[AuditEntry]
    next_cursor: str | None
