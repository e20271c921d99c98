"""The typed Python client of the Swarm API (SPEC §13).

    from swarm_api_client import SwarmClient
    with SwarmClient("http://127.0.0.1:8000", api_key="...") as client:
        swarm = client.wait(client.create({"task": "Summarise the Q3 incidents"}).id)

Answers are the service's own pydantic models (`app.schemas`); errors are `SwarmApiError`
subclasses carrying the SPEC error code. Needs only httpx, httpx-sse, pydantic and tenacity.
"""

from app.schemas import (
    SubtaskDetail,
    SubtaskRead,
    SwarmCreate,
    SwarmEvent,
    SwarmList,
    SwarmRead,
    ToolList,
    ToolRead,
    UsageReport,
)
from swarm_api_client._base import TERMINAL, RetryPolicy
from swarm_api_client.aio import AsyncSwarmClient
from swarm_api_client.client import SwarmClient
from swarm_api_client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SwarmApiError,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)

__all__ = [
    "TERMINAL",
    "AsyncSwarmClient",
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "RetryPolicy",
    "SubtaskDetail",
    "SubtaskRead",
    "SwarmApiError",
    "SwarmClient",
    "SwarmCreate",
    "SwarmEvent",
    "SwarmList",
    "SwarmRead",
    "ToolList",
    "ToolRead",
    "Unauthorized",
    "Unavailable",
    "UsageReport",
    "WaitTimeout",
]
