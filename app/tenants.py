"""Per-tenant quotas (SPEC §8): the limits file, validated once at start, and its lookups.

`SWARM_TENANTS_FILE` (TOML or JSON) has a `[defaults]` table and `[tenants.<name>]` tables. A
tenant's own table is laid over the defaults key by key (a tenant that raises one limit keeps
the others). With a file, a key absent from both means no limit; without a file every tenant
gets SPEC §8's defaults (`TenantLimits.spec_defaults()`). A tenant's table may also list its
API keys (`keys = [...]`, SPEC §16: app/keys.py); they are no limit, and not in the version.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    model_validator,
)

from app.keys import ApiKey, file_keys

Money = Decimal
# the tenant's lock an admission holds to its commit: its token bucket's row, or the lock that
# serialises its active-swarm counts (app/db/quotas.py)
AdmissionLock = Literal["bucket", "count"]
# `server` (all its tools) or `server.tool` (one), as an agent's `tools` name them (SPEC §9)
ToolSelector = Annotated[str, StringConstraints(
    pattern=r"^[A-Za-z0-9_-]{1,48}(\.[A-Za-z0-9_.\-]{1,128})?$")]


class TenantLimits(BaseModel):
    """One tenant's limits; None = no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    burst: int | None = Field(default=None, ge=1)
    max_active_swarms: int | None = Field(default=None, ge=0)
    max_agents: int | None = Field(default=None, ge=1)
    max_inflight_calls: int | None = Field(default=None, ge=1)
    default_budget_usd: Money | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_budget_usd: Money | None = Field(default=None, gt=0, allow_inf_nan=False)
    daily_budget_usd: Money | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_streams: int | None = Field(default=None, ge=0)
    webhook_secret: SecretStr | None = None
    tools: list[ToolSelector] | None = None  # the MCP servers / tools it may use (None: all)
    # its ended swarms' content is erased this many days after their end (None:
    # SWARM_RETENTION_DAYS; SPEC §16)
    retention_days: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _default_within_max(self) -> TenantLimits:
        if (self.default_budget_usd is not None and self.max_budget_usd is not None
                and self.default_budget_usd > self.max_budget_usd):
            raise ValueError("default_budget_usd is above max_budget_usd")
        return self

    @classmethod
    def spec_defaults(cls) -> TenantLimits:
        """What every tenant gets when no file is configured (SPEC §8)."""
        return cls(requests_per_minute=600, burst=100, max_active_swarms=1000, max_agents=1000,
                   max_inflight_calls=256, default_budget_usd=Decimal("10"),
                   max_budget_usd=Decimal("100"), daily_budget_usd=Decimal("500"),
                   max_streams=100)

    @property
    def refill_per_s(self) -> float | None:
        """Tokens added to the bucket per second (None: no rate limit)."""
        return None if self.requests_per_minute is None else self.requests_per_minute / 60

    @property
    def bucket_size(self) -> float | None:
        """The bucket's capacity: `burst`, else one minute of requests."""
        if self.requests_per_minute is None:
            return None
        return float(self.burst if self.burst is not None
                     else max(1, math.floor(self.requests_per_minute)))

    def admission_lock(self, *, counts: bool = True) -> AdmissionLock | None:
        """The tenant's lock an admission takes first and holds to its commit
        (app/api/admission.py): the token bucket's row when it has a rate limit, else, for an
        admission that counts its active swarms (a creation's), the count's own lock; None:
        no lock."""
        if self.requests_per_minute is not None:
            return "bucket"
        if counts and self.max_active_swarms is not None:
            return "count"
        return None

    @property
    def admission_locks(self) -> bool:
        """Whether a creation of this tenant holds a lock of the tenant's to its commit."""
        return self.admission_lock() is not None

    def agents_limit(self, global_max: int) -> int:
        """Subtasks one swarm may have: never above SWARM_MAX_AGENTS."""
        return global_max if self.max_agents is None else min(self.max_agents, global_max)


class TenantTable:
    """Every tenant's limits; unknown tenants get the defaults."""

    def __init__(self, defaults: TenantLimits, tenants: dict[str, TenantLimits],
                 version: str) -> None:
        self.defaults = defaults
        self.tenants = tenants
        self.version = version

    def limits(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.defaults)

    def __iter__(self) -> Any:
        return iter(self.tenants)

    @classmethod
    def builtin(cls) -> TenantTable:
        defaults = TenantLimits.spec_defaults()
        return cls(defaults, {}, _version({"defaults": _canon(defaults), "tenants": {}}))

    @classmethod
    def from_file(cls, path: str | Path) -> TenantTable:
        """Load and validate the file (its keys too); ValueError names the file, the table and
        the key."""
        p = Path(path)
        base, tables = _read(p)
        defaults = _limits(p, "defaults", base)
        tenants: dict[str, TenantLimits] = {}
        keys: dict[str, Any] = {}
        for name, own in tables.items():
            if not isinstance(own, dict):
                raise ValueError(f"SWARM_TENANTS_FILE {p}: [tenants.{name}] must be a table")
            own = dict(own)
            if "keys" in own:
                keys[name] = own.pop("keys")
            tenants[name] = _limits(p, f"tenants.{name}", {**base, **own})
        file_keys(p, keys)  # checked now: a bad key stops the start, as a bad limit does
        canon = {"defaults": _canon(defaults),
                 "tenants": {n: _canon(t) for n, t in sorted(tenants.items())}}
        return cls(defaults, tenants, _version(canon))


def read_tenant_keys(path: Path) -> list[ApiKey]:
    """The API keys the tenants file lists (SPEC §16), read now: a rotation's reload."""
    _, tables = _read(path)
    return file_keys(path, {name: own["keys"] for name, own in tables.items()
                            if isinstance(own, dict) and "keys" in own})


def _read(p: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The file's [defaults] and [tenants] tables, their shape checked."""
    try:
        text = p.read_text()
        raw: Any = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:  # JSON and TOML decode errors are ValueErrors
        raise ValueError(f"SWARM_TENANTS_FILE {p}: {exc}") from None
    if not isinstance(raw, dict) or set(raw) - {"defaults", "tenants"}:
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"SWARM_TENANTS_FILE {p}: expected only [defaults] and "
                         f"[tenants.<name>] tables, got {got}")
    base = raw.get("defaults", {})
    tables = raw.get("tenants", {})
    if not isinstance(base, dict) or not isinstance(tables, dict):
        raise ValueError(f"SWARM_TENANTS_FILE {p}: [defaults] and [tenants] must be tables")
    if "keys" in base:
        raise ValueError(f"SWARM_TENANTS_FILE {p}: [defaults] cannot list keys: a key names "
                         "one tenant (list it under [tenants.<name>])")
    return base, tables


def _limits(path: Path, where: str, values: dict[str, Any]) -> TenantLimits:
    try:
        return TenantLimits.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or where}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"SWARM_TENANTS_FILE {path}: [{where}] {problems}") from None


def _canon(limits: TenantLimits) -> dict[str, Any]:
    data = limits.model_dump(mode="json", exclude={"webhook_secret"})
    # the secret changes the version too, without appearing in it
    secret = limits.webhook_secret.get_secret_value() if limits.webhook_secret else ""
    data["webhook_secret"] = hashlib.sha256(secret.encode()).hexdigest() if secret else None
    return data


def _version(canon: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()[:12]
