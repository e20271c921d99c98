"""`SWARM_MCP_CONFIG`: the `mcpServers` JSON that MCP clients share, plus our limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)


# `<server>__<tool>` is the OpenAI function name and `server.tool` a selector: a server name
# holds neither `__` nor `.` so both split unambiguously at their first separator
def _no_double_underscore(name: str) -> str:
    if "__" in name:
        raise ValueError(f"server name {name!r} must not contain '__'")
    return name


ServerName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,48}$"),
                       AfterValidator(_no_double_underscore)]


class ServerConfig(BaseModel):
    """One server: `command` (stdio) or `url` (streamable HTTP), and its limits."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    max_concurrency: int = Field(default=8, ge=1, le=10_000)
    tool_concurrency: dict[str, Annotated[int, Field(ge=1, le=10_000)]] = Field(
        default_factory=dict)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("a server has either `command` (stdio) or `url` (streamable HTTP)")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


class McpConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")  # other clients' keys in a shared file are fine

    mcpServers: dict[ServerName, ServerConfig]  # the shared file's spelling


def load_config(path: str | Path) -> dict[str, ServerConfig]:
    """The servers of a config file; ValueError (with the reason) when it is unusable."""
    try:
        raw: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"SWARM_MCP_CONFIG {path}: {exc}") from exc
    try:
        return dict(McpConfig.model_validate(raw).mcpServers)
    except ValueError as exc:
        raise ValueError(f"SWARM_MCP_CONFIG {path}: {exc}") from exc
