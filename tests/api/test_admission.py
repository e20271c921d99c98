"""Admission takes the lock `TenantLimits.admission_lock` names, and no other: a creation's
checks (`check_in`), the facade's count after its token (`counting_in().check_in`) and a token
alone (`rate_limit`'s checks) — the database calls recorded, not made."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from app.api import admission as admission_module
from app.api.admission import Admission
from app.db import quotas
from app.db.types import utcnow
from app.tenants import TenantLimits

LIMITS = [TenantLimits(), TenantLimits(requests_per_minute=60),
          TenantLimits(max_active_swarms=3), TenantLimits(requests_per_minute=60, burst=5,
                                                          max_active_swarms=3),
          TenantLimits(max_active_swarms=3, daily_budget_usd=1), TenantLimits.spec_defaults()]


@pytest.fixture
def locks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tenant's locks admission takes, in order: `bucket` (a token, the bucket's row),
    `count` (the count's own lock)."""
    taken: list[str] = []

    async def take_token(_s: Any, _tenant: str, _size: float, _rate: float) -> None:
        taken.append("bucket")

    async def lock_active(_s: Any, _tenant: str, *, bucket: bool) -> None:
        taken.append("bucket" if bucket else "count")

    async def tenant_now(_s: Any, _tenant: str, *, count: bool,
                         spent: bool) -> quotas.TenantNow:
        return quotas.TenantNow(utcnow(), 0, Decimal(0))

    monkeypatch.setattr(quotas, "take_token", take_token)
    monkeypatch.setattr(quotas, "lock_active", lock_active)
    monkeypatch.setattr(quotas, "tenant_now", tenant_now)
    return taken


def expected(limits: TenantLimits, counts: bool) -> list[str]:
    lock = limits.admission_lock(counts=counts)
    return [] if lock is None else [lock]


@pytest.mark.parametrize("limits", LIMITS)
async def test_a_creation_holds_the_lock_its_limits_name(limits: TenantLimits,
                                                         locks: list[str]) -> None:
    await Admission("t", limits, 100, checked=False).check_in(object())  # type: ignore[arg-type]
    assert locks == expected(limits, counts=True)


@pytest.mark.parametrize("limits", LIMITS)
async def test_the_facades_count_locks_what_its_creation_would(limits: TenantLimits,
                                                               locks: list[str]) -> None:
    """After the token its own transaction took: the count under the same lock (the bucket's
    row when there is one), and only when the tenant counts its swarms."""
    await Admission("t", limits, 100).counting_in().check_in(object())  # type: ignore[arg-type]
    assert locks == (expected(limits, counts=True) if limits.max_active_swarms is not None
                     else [])


@pytest.mark.parametrize("limits", LIMITS)
async def test_a_token_alone_locks_the_bucket_only(limits: TenantLimits,
                                                   locks: list[str]) -> None:
    await admission_module._checks(object(), "t", limits,  # type: ignore[arg-type]
                                   count_swarms=False)
    assert locks == expected(limits, counts=False)
