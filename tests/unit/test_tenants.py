"""A tenant's limits alone: which of the tenant's locks its admission holds to its commit."""

from __future__ import annotations

import pytest

from app.tenants import TenantLimits

# (requests_per_minute, max_active_swarms) -> the lock of a creation, of a token alone
CASES = [((None, None), (None, None)),
         ((60, None), ("bucket", "bucket")),
         ((None, 3), ("count", None)),
         ((60, 3), ("bucket", "bucket")),
         ((None, 0), ("count", None))]


@pytest.mark.parametrize(("limits", "locks"), CASES)
def test_the_bucket_row_else_the_count_lock_when_it_counts(
        limits: tuple[float | None, int | None], locks: tuple[str | None, str | None]) -> None:
    rate, active = limits
    tenant = TenantLimits(requests_per_minute=rate, max_active_swarms=active,
                          daily_budget_usd=1)  # a cap adds no lock of the tenant's
    assert (tenant.admission_lock(), tenant.admission_lock(counts=False)) == locks
    assert tenant.admission_locks is (locks[0] is not None)


def test_spec_defaults_lock_the_bucket() -> None:
    assert TenantLimits.spec_defaults().admission_lock() == "bucket"
