"""The shapes of GET /usage, an event of GET /swarms/{id}/events, GET /tools and GET /audit."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

# ---- usage (GET /usage) and events (GET /swarms/{id}/events) --------------------------------

GroupBy = Literal["model", "day", "tenant"]


class UsageFigures(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="part of prompt_tokens, billed at the cached price")
    cost_usd: str = Field(description="exact decimal USD: settled + unresolved",
                          examples=["0.0020872"])
    settled_usd: str = Field(description="the part of cost_usd the gateway's answers reported",
                             examples=["0.0020872"])
    unresolved_usd: str = Field(description="the part of cost_usd recorded at an upper "
                                "bound: attempts whose answer was lost, answers that "
                                "reported no usable usage",
                                examples=["0"])
    gateway_calls: int = Field(description="ledger rows: every attempt, retries included")


class UsageItem(UsageFigures):
    key: str = Field(description="the model, the UTC day (YYYY-MM-DD) or the tenant")


class UsageReport(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: datetime | None = Field(alias="from", description="inclusive; null = all time")
    to: datetime | None = Field(description="exclusive; null = up to now")
    group_by: GroupBy
    items: list[UsageItem]
    total: UsageFigures


class SwarmEvent(BaseModel):
    """One Server-Sent Event of `GET /swarms/{id}/events`, as a client reads it."""

    id: int = Field(description="the per-swarm sequence number (consecutive from 1)")
    event: str = Field(description="swarm.status, subtask.started, subtask.succeeded, "
                       "subtask.failed, subtask.skipped, subtask.turn (a tool-using subtask's "
                       "turn: its tools and their statuses) or swarm.completed (the last one)")
    data: dict[str, Any] = Field(description="the event's JSON body: seq, swarm_id and fields")


# ---- tools (GET /tools, SPEC §9) -------------------------------------------------------------


class ToolRead(BaseModel):
    """One tool an MCP server offers; agents name it `server.name` (or the whole server)."""

    server: str
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolList(BaseModel):
    items: list[ToolRead]


# ---- the audit trail (GET /audit) ----

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
