"""API keys (SPEC §16): hashed, scoped, expiring, from SWARM_API_KEYS and the tenants file.

A key is looked up by its SHA-256 in a dict: the service keeps digests, never needs a key in
plain text, and the one comparison made (the digest found with the digest presented) is
constant-time. A key's id (the one the file gives, else the first 8 hex digits of its digest:
not a secret) is what audit rows, log lines and traces name. The tenants file's keys are read
again when the file changes (its mtime, looked at most once a second) or on SIGHUP, so a
rotation needs no restart.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

log = logging.getLogger(__name__)

Scope = Literal["swarms:read", "swarms:write", "usage:read", "audit:read", "chat"]
SCOPES: frozenset[str] = frozenset(Scope.__args__)  # type: ignore[attr-defined]
_HEX = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
CHECK_EVERY_S = 1.0  # how often a request looks at the tenants file's mtime


@dataclass(frozen=True)
class ApiKey:
    """One accepted key: whose it is, its id, what it may do, until when (None: forever)."""

    tenant: str
    key_id: str
    scopes: frozenset[str]
    expires_at: datetime | None
    digest: bytes

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def derived_id(digest: bytes) -> str:
    """A key's id when none is given: its digest's first 8 hex digits (naming, not revealing)."""
    return digest.hex()[:8]


def parse_api_keys(raw: str) -> list[ApiKey]:
    """`tenant:key` or `tenant:sha256:<hex>` items, comma-separated. Refuses what would silently
    mean something else: a value with no key at all (open mode by accident), a malformed item,
    a digest that is not 64 hex digits, and a key listed twice (which tenant would it be?)."""
    out: dict[bytes, ApiKey] = {}
    if not raw.strip():
        return []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        tenant, sep, key = item.partition(":")
        tenant, key = tenant.strip(), key.strip()
        if not sep or not tenant or not key:
            raise ValueError("SWARM_API_KEYS must be 'tenant:key,tenant:key' (or "
                             "tenant:sha256:<hex>)")
        if key.lower().startswith("sha256:"):
            hexed = key[7:].strip().lower()
            if not _HEX.match(hexed):
                raise ValueError(f"SWARM_API_KEYS: tenant {tenant!r}'s sha256 must be 64 hex "
                                 "digits")
            digest = bytes.fromhex(hexed)
        else:
            digest = digest_of(key)
        if digest in out:
            raise ValueError(f"SWARM_API_KEYS lists one key twice (tenants "
                             f"{out[digest].tenant!r} and {tenant!r})")
        out[digest] = ApiKey(tenant, derived_id(digest), SCOPES, None, digest)
    if not out:
        raise ValueError("SWARM_API_KEYS is set but names no key: leave it empty for open mode")
    return list(out.values())


class FileKey(BaseModel):
    """One entry of a tenant's `keys` in the tenants file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    key: SecretStr | None = None
    scopes: list[Scope] | None = None  # None: every scope
    expires_at: datetime | None = None
    id: str | None = Field(default=None, pattern=_ID.pattern)

    @model_validator(mode="after")
    def _one_form(self) -> FileKey:
        if (self.sha256 is None) == (self.key is None):
            raise ValueError("give exactly one of sha256 and key")
        if self.key is not None and not self.key.get_secret_value().strip():
            raise ValueError("key is empty")
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            raise ValueError("expires_at needs a time zone (such as 2027-01-31T00:00:00Z)")
        return self

    def api_key(self, tenant: str) -> ApiKey:
        digest = (bytes.fromhex(self.sha256) if self.sha256 is not None
                  else digest_of(self.key.get_secret_value().strip()  # type: ignore[union-attr]
                                 ))
        scopes = SCOPES if self.scopes is None else frozenset(self.scopes)
        expires = self.expires_at.astimezone(UTC) if self.expires_at is not None else None
        return ApiKey(tenant, self.id or derived_id(digest), scopes, expires, digest)


def file_keys(path: Path, tables: dict[str, Any]) -> list[ApiKey]:
    """The `keys` of each `[tenants.<name>]` table (already removed from the limits)."""
    out: list[ApiKey] = []
    owners: dict[bytes, str] = {}
    for tenant, entries in tables.items():
        if not isinstance(entries, list):
            raise ValueError(f"SWARM_TENANTS_FILE {path}: [tenants.{tenant}] keys must be a "
                             "list of tables")
        ids: set[str] = set()
        for i, entry in enumerate(entries):
            try:
                key = FileKey.model_validate(entry).api_key(tenant)
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'key'}: "
                                     f"{e['msg']}" for e in exc.errors())
                raise ValueError(f"SWARM_TENANTS_FILE {path}: [tenants.{tenant}] keys[{i}]: "
                                 f"{problems}") from None
            if key.digest in owners:
                raise ValueError(f"SWARM_TENANTS_FILE {path}: one key is listed twice "
                                 f"(tenants {owners[key.digest]!r} and {tenant!r})")
            owners[key.digest] = tenant
            if key.key_id in ids:
                raise ValueError(f"SWARM_TENANTS_FILE {path}: [tenants.{tenant}] two keys "
                                 f"have the id {key.key_id!r}")
            ids.add(key.key_id)
            out.append(key)
    return out


def merge(env: list[ApiKey], from_file: list[ApiKey]) -> dict[bytes, ApiKey]:
    """One table of both sources: a key in both is one key with the file's scopes and expiry;
    one key given to two tenants is refused."""
    out = {k.digest: k for k in env}
    seen_in_file: set[bytes] = set()
    for key in from_file:
        other = out.get(key.digest)
        if other is not None and (other.tenant != key.tenant or key.digest in seen_in_file):
            raise ValueError(f"one key is listed twice (tenants {other.tenant!r} and "
                             f"{key.tenant!r})")
        out[key.digest] = key
        seen_in_file.add(key.digest)
    return out


class KeyRing:
    """The keys in force: SWARM_API_KEYS's, and the tenants file's, read again when it changes."""

    def __init__(self, env: list[ApiKey], tenants_file: str | None,
                 read_file: Callable[[Path], list[ApiKey]]) -> None:
        self.env = env
        self.path = Path(tenants_file) if tenants_file else None
        self.read_file = read_file
        self.keys = merge(env, read_file(self.path) if self.path is not None else [])
        self.check_every_s = CHECK_EVERY_S
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        """Auth is on (decided once, at start: a reload never opens the API)."""
        return bool(self.keys)

    def find(self, token: str) -> ApiKey | None:
        """The key `token` is, if any (expired or not: the caller tells them apart)."""
        self._maybe_reload()
        digest = digest_of(token)
        key = self.keys.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            return None
        return key

    def _file_stamp(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _maybe_reload(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._checked < self.check_every_s:
            return
        self._checked = now
        if self._file_stamp() != self._stamp:
            self.reload()

    def reload(self) -> bool:
        """Read the tenants file's keys again (SIGHUP, or its mtime changed); a file that no
        longer reads or validates keeps the keys in force, and says why in the log."""
        if self.path is None:
            return False
        with self._lock:
            stamp = self._file_stamp()
            try:
                keys = merge(self.env, self.read_file(self.path))
            except ValueError as exc:
                self._stamp = stamp  # not again until it changes once more
                log.error("tenants file not reloaded, the keys in force stay: %s", exc)
                return False
            self.keys, self._stamp = keys, stamp
        log.info("tenants file reloaded: %d keys in force", len(keys))
        return True


def now_utc() -> datetime:
    return datetime.now(UTC)
