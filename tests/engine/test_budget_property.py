"""Property: whatever the DAG, answers, faults and prices, a swarm's recorded spend never
exceeds its budget and equals its ledger exactly (SPEC §4 "Budget is a hard cap")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from tests.conftest import Harness, make_settings, start_harness
from tests.helpers import MODELS_TOML, PROPERTY, check_budget, swarms


@PROPERTY
# cheap models drawn more often, so that both outcomes (done within budget, stopped by it) occur
@given(body=swarms(("deepseek-v3.2", "kimi-k2.5", "deepseek-v3.2", "gemini-2.5-flash",
                    "gpt-4.1", "claude-sonnet-4.5"), False))
async def test_spend_never_exceeds_budget_and_matches_ledger(api: Harness,
                                                             body: dict[str, Any]) -> None:
    await check_budget(api, body)


@pytest.fixture
async def custom_prices(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    path = tmp_path / "models.toml"
    path.write_text(MODELS_TOML)
    h, close = await start_harness(make_settings(sqlite_url, models_file=str(path),
                                                 default_model="m-cheap"))
    yield h
    await close()


@PROPERTY
@given(body=swarms(("m-cheap", "m-cheap", "m-pricey"), True))
async def test_custom_prices_with_cached_tokens(custom_prices: Harness,
                                               body: dict[str, Any]) -> None:
    await check_budget(custom_prices, body)
