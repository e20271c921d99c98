"""Routes of SPEC §9: the tools the servers offer, one subtask with its transcript."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep, SettingsDep, TenantDep, ToolsDep
from app.api.errors import error_responses
from app.api.shared import check_id
from app.db import queries
from app.engine.planner import ID_PATTERN
from app.engine.subtask_rows import COMPRESSOR_PREFIX, PLANNER, SYNTHESIZER
from app.errors import SwarmNotFound
from app.schemas import SubtaskDetail, ToolList, ToolRead
from app.tools.registry import permitted
from app.views import subtask_read

router = APIRouter(tags=["tools"])


def subtask_name(name: str) -> bool:
    """Whether a subtask can be named so: an agent's name (planned workers' too), the
    planner's, the synthesizer's, or a compressor's (`@compress.<agent>`). Anything else (a
    NUL PostgreSQL cannot even compare) is no subtask's, without asking the database."""
    return name in (PLANNER, SYNTHESIZER) or ID_PATTERN.fullmatch(
        name.removeprefix(COMPRESSOR_PREFIX)) is not None


@router.get("/tools", response_model=ToolList, responses=error_responses(401, 422),
            summary="List the tools of the MCP servers that are up")
async def list_tools(tools: ToolsDep, tenant: TenantDep, settings: SettingsDep) -> ToolList:
    """Every tool of every configured server that is up and the tenant may use (its `tools`
    in SWARM_TENANTS_FILE), by server then name."""
    allowed = settings.tenant_limits(tenant).tools
    items = [t for t in ([] if tools is None else tools.catalogue())
             if permitted(f"{t.server}.{t.name}", allowed)]
    return ToolList(items=[ToolRead(server=t.server, name=t.name, description=t.description,
                                    input_schema=t.input_schema) for t in items])


@router.get("/swarms/{swarm_id}/subtasks/{name}", response_model=SubtaskDetail,
            responses=error_responses(401, 404, 422, 503),
            summary="One subtask with the messages of every turn")
async def get_subtask(swarm_id: str, name: str, session: SessionDep,
                      tenant: TenantDep) -> SubtaskDetail:
    """The subtask as in the swarm, plus its tools and `transcript` (tool-using subtasks)."""
    check_id(swarm_id)
    missing = SwarmNotFound(f"no subtask {name!r} in swarm {swarm_id}",
                            details={"id": swarm_id, "name": name})
    if not subtask_name(name):
        raise missing
    async with session.begin():
        swarm = await queries.get_swarm(session, swarm_id, tenant)
        sub = None if swarm is None else await queries.get_subtask(session, swarm_id, name)
        if swarm is None or sub is None:
            raise missing
        messages = await queries.get_transcript(session, swarm_id, name)
    return SubtaskDetail(**subtask_read(sub, True).model_dump(), tools=list(sub.tools),
                         max_turns=sub.max_turns, transcript=[m.message for m in messages])
