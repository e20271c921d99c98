"""Settings from the environment (prefix SWARM_) and an optional .env file."""

from __future__ import annotations

import ipaddress
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.crypto import Sealer
from app.keys import KeyRing, parse_api_keys
from app.logs import LEVELS
from app.pricing import PriceTable
from app.tenants import TenantLimits, TenantTable, read_tenant_keys
from app.tools.config import load_config

EMBEDDED_DATABASE_URL = "sqlite+aiosqlite:///./swarm.db"
# SPEC §2: the two async drivers; the synchronous spellings a platform's DATABASE_URL comes
# in (`postgres://`, `postgresql://`, `sqlite:///`) mean the async driver of their database
_ASYNC_DRIVERS = {"postgres": "postgresql+asyncpg", "postgresql": "postgresql+asyncpg",
                  "postgresql+asyncpg": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite",
                  "sqlite+aiosqlite": "sqlite+aiosqlite"}


def database_url_of(raw: str) -> str:
    """SWARM_DATABASE_URL with its async driver; a ValueError that names the fix (never the
    URL, which may hold a password) for a database this service does not run on, or a SQLite
    file in a directory that does not exist."""
    scheme, sep, rest = raw.strip().partition("://")
    driver = _ASYNC_DRIVERS.get(scheme.lower()) if sep else None
    if driver is None:
        raise ValueError("SWARM_DATABASE_URL must be postgresql+asyncpg://user@host/db "
                         "(PostgreSQL) or sqlite+aiosqlite:///path.db (SQLite)")
    if driver == "sqlite+aiosqlite":
        path = urlsplit(f"sqlite://{rest}").path[1:]  # `///x.db`: relative, `////x.db`: absolute
        if path and path != ":memory:" and not Path(path).parent.is_dir():
            raise ValueError(f"SWARM_DATABASE_URL: the SQLite file's directory "
                             f"{str(Path(path).parent)!r} does not exist")
    return f"{driver}://{rest}"


def parse_allowed_hosts(raw: str) -> frozenset[str]:
    """Host names or addresses from `name,name`: lowercased, an IPv6 literal's brackets and a
    trailing dot dropped. Refuses a port or a URL (a Host is compared by its name alone)."""
    names: set[str] = set()
    for item in raw.split(","):
        name = item.strip().lower()
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if not name:
            continue
        if ":" in name:
            try:
                ipaddress.IPv6Address(name)
            except ValueError:
                raise ValueError(f"SWARM_ALLOWED_HOSTS: {item.strip()!r} is not a host name: "
                                 "list names or addresses, without a scheme or port") from None
        elif any(c in name for c in "/@ \t") or not name.rstrip("."):
            raise ValueError(f"SWARM_ALLOWED_HOSTS: {item.strip()!r} is not a host name")
        names.add(name.rstrip("."))
    return frozenset(names)


class LogSettings(BaseSettings):
    """The logging knobs (SPEC §17), read before the rest: a process logs its refusal of a
    bad setting in the format asked for. `Settings` has them too."""

    model_config = SettingsConfigDict(env_prefix="SWARM_", env_file=".env", extra="ignore")

    # SPEC §17: `json` or `text` (unset: text on a terminal, else json), the root level, and
    # a line per HTTP request (method, path, status, duration)
    log_format: Literal["json", "text"] | None = None
    log_level: str = "INFO"
    access_log: bool = False

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_format(cls, v: object) -> object:
        return (v.strip().lower() or None) if isinstance(v, str) else v

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        level = v.strip().upper()
        if level not in LEVELS:
            raise ValueError(f"SWARM_LOG_LEVEL must be one of {', '.join(LEVELS)}")
        return level


class Settings(LogSettings):
    """Every knob of SPEC §2, typed; secrets never printed."""

    model_config = SettingsConfigDict(
        env_prefix="SWARM_", env_file=".env", extra="ignore", frozen=False
    )

    database_url: str = EMBEDDED_DATABASE_URL
    gateway_url: str | None = None
    gateway_api_key: SecretStr = SecretStr("")
    # idle gateway connections are closed after this: below the gateway's own keep-alive
    # timeout, or a request races the server's close (uvicorn, Node, Apache: 5 s)
    gateway_keepalive_s: float = Field(default=4.0, ge=0, le=3600)
    api_keys: SecretStr = SecretStr("")
    allow_open: bool = False
    # names (besides loopback and the bound host) an API without keys answers as Host (SPEC §17)
    allowed_hosts: str = ""
    models_file: str | None = None
    tenants_file: str | None = None  # per-tenant quotas (SPEC §8)
    default_model: str = "kimi-k2.5"
    daily_budget_usd: Decimal | None = Field(default=None, gt=0)
    max_inflight: int = Field(default=256, ge=1, le=10_000)
    lease_seconds: float = Field(default=15.0, gt=0)
    auto_migrate: bool = False
    # The latency devices, measured wins that write less often on a swarm's critical path, all
    # on or all off (`on`/`off`): the first wave written with the creation
    # (SubtaskExecutor.first_wave), the synthesizer prepared on the workers' answers
    # (SubtaskExecutor.prepare), a wave's starts in one write (SwarmJournal.started). Off, each
    # call is written ahead and each start queued on its own: slower, the same answers.
    latency_devices: bool = True
    engine: bool = True
    max_agents: int = Field(default=1000, ge=1)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_rescues: int = Field(default=10, ge=1)  # consecutive fruitless takeovers (crash loop)
    idempotency_ttl_s: float = Field(default=86_400.0, ge=86_400.0)  # SPEC: at least 24 h
    max_running_swarms: int = Field(default=64, ge=1)
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    poll_interval_s: float = Field(default=1.0, gt=0)
    # a comment line on an idle event stream, so proxies and load balancers keep it open
    sse_ping_s: float = Field(default=15.0, gt=0, le=3600)
    # `swarm-api worker` serves /metrics on this port when set (the API serves it anyway);
    # telemetry only, but keep it off public interfaces: 0.0.0.0 only inside a container
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    webhook_secret: SecretStr = SecretStr("")
    webhook_allow_http: bool = False
    webhook_allow_private: bool = False
    webhook_retry_base_s: float = Field(default=5.0, gt=0)  # doubles per attempt, capped at 10 min
    # one delivery attempt in total: connect + send + read the answer
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # deliveries in flight per process, and of one tenant (SPEC §8: a receiver that never
    # answers holds its tenant's slots only); a held slot costs a socket, not a thread
    webhook_concurrency: int = Field(default=64, ge=1, le=10_000)
    webhook_tenant_concurrency: int = Field(default=8, ge=1, le=10_000)
    # one attempt of a passthrough call of the OpenAI facade (a long generation takes minutes)
    facade_timeout_s: float = Field(default=600.0, gt=0, le=3600)
    # the in-process simulator (used when no gateway_url is set)
    simulator_latency_ms: float = Field(default=200.0, ge=0)
    simulator_latency_jitter_ms: float = Field(default=100.0, ge=0)
    # let `[[sim exit=N]]` end this process while that call is in flight (a poison swarm,
    # for crash-loop tests); off, the directive is the call's 400
    simulator_exit_allowed: bool = False
    # tools (SPEC §9): the mcpServers JSON file, and the cut of each tool result
    mcp_config: str | None = None
    # calls to a streamable-HTTP tool server spread over this many sessions (1: one session)
    mcp_http_sessions: int = Field(default=8, ge=1, le=64)
    tool_result_max_bytes: int = Field(default=16384, ge=256, le=10_000_000)
    # a model's tool-call arguments longer than this are the call's error, never sent (§9)
    tool_args_max_bytes: int = Field(default=262144, ge=256, le=100_000_000)
    # ended swarms' content is erased this many days after their end (SPEC §16; a tenant's
    # retention_days overrides it), by a sweep each process runs every retention_sweep_s, one
    # process at a time, retention_batch swarms per transaction
    retention_days: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    retention_sweep_s: float = Field(default=300.0, gt=0)
    retention_batch: int = Field(default=20, ge=1, le=10_000)
    # content encrypted at rest with the first of these base64 32-byte keys, opened with any
    # (SPEC §16, app/crypto.py); empty: stored as plaintext
    encryption_keys: SecretStr = SecretStr("")
    # the Alembic scripts (the image sets /app/migrations); unset: <repo>/migrations
    migrations_dir: str | None = None
    # crash tests only: SIGKILL this process at `<point>:<subtask>[,…]` (app/engine/faults.py)
    crash_at: str = ""

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, v: str) -> str:
        return database_url_of(v)

    @field_validator("gateway_url")
    @classmethod
    def _gateway_base(cls, v: str | None) -> str | None:
        if not v:
            return None
        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("SWARM_GATEWAY_URL must be an http(s) base URL, such as "
                             "https://gateway.example/v1")
        return v.strip().rstrip("/")

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: str) -> str:
        parse_allowed_hosts(v)
        return v

    @field_validator("crash_at")
    @classmethod
    def _crash_points(cls, v: str) -> str:
        if any(":" not in p for p in v.split(",") if p.strip()):
            raise ValueError("SWARM_CRASH_AT must be '<point>:<subtask>[,<point>:<subtask>]'")
        return v

    @field_validator("migrations_dir")
    @classmethod
    def _migrations_exist(cls, v: str | None) -> str | None:
        if v and not (Path(v) / "env.py").is_file():
            raise ValueError(f"SWARM_MIGRATIONS_DIR {v!r} holds no Alembic env.py")
        return v

    @model_validator(mode="after")
    def _refuse_ambiguity(self) -> Settings:
        # fail when built, not on the first request that needs the keys or the model's price
        parse_api_keys(self.api_keys.get_secret_value())
        _ = self.sealer  # SWARM_ENCRYPTION_KEYS: each key base64 of 32 bytes
        if self.default_model not in self.prices:
            raise ValueError(f"SWARM_DEFAULT_MODEL {self.default_model!r} has no price "
                             f"(priced: {', '.join(self.prices.names())})")
        _ = self.tenants  # SWARM_TENANTS_FILE read and checked now (ValueError says why)
        _ = self.keys  # and its keys merged with SWARM_API_KEYS' (one key, two tenants: refused)
        if self.mcp_config:  # read again when the servers start; a typo stops no running swarm
            load_config(self.mcp_config)
        return self

    @cached_property
    def keys(self) -> KeyRing:
        """The API keys in force: SWARM_API_KEYS's and the tenants file's (SPEC §16)."""
        return KeyRing(parse_api_keys(self.api_keys.get_secret_value()), self.tenants_file,
                       read_tenant_keys)

    @cached_property
    def sealer(self) -> Sealer | None:
        """The keys of SWARM_ENCRYPTION_KEYS (None: content is stored as plaintext)."""
        return Sealer.from_setting(self.encryption_keys.get_secret_value())

    @cached_property
    def allowed_host_names(self) -> frozenset[str]:
        """SWARM_ALLOWED_HOSTS as the names a Host header is compared with."""
        return parse_allowed_hosts(self.allowed_hosts)

    @cached_property
    def auth_enabled(self) -> bool:
        """Any key configured, in SWARM_API_KEYS or the tenants file: decided at start."""
        return self.keys.configured

    @cached_property
    def prices(self) -> PriceTable:
        if self.models_file:
            return PriceTable.from_file(self.models_file)
        return PriceTable.builtin()

    @cached_property
    def tenants(self) -> TenantTable:
        """Per-tenant quotas: SWARM_TENANTS_FILE, else SPEC §8's defaults for everyone."""
        if self.tenants_file:
            return TenantTable.from_file(self.tenants_file)
        return TenantTable.builtin()

    def tenant_limits(self, tenant: str) -> TenantLimits:
        """One tenant's limits (its webhook_secret included)."""
        return self.tenants.limits(tenant)
