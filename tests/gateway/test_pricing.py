"""The model table (SPEC §2): file loading, exact costs, worst cases, money formatting."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from app.pricing import (
    BUILTIN_MODELS,
    ModelPrice,
    PriceTable,
    metric_model_label,
    quantize_usd,
    usd_str,
)
from tests.conftest import make_settings, start_harness

TOML = """
[models.fast]
input = 0.10
cached_input = "0.025"
output = 0.40
context_window = 64000
concurrency = 4

[models.big]
input = "3"
output = "15"
"""


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(TOML)
    table = PriceTable.from_file(path)
    assert table.names() == ["big", "fast"]
    fast = table["fast"]
    assert (fast.input, fast.cached_input, fast.output) == (
        Decimal("0.1"), Decimal("0.025"), Decimal("0.4"))
    assert (fast.context_window, fast.concurrency) == (64000, 4)
    big = table["big"]
    assert big.cached_input is None and big.concurrency is None
    assert big.context_window == 128_000
    assert "fast" in table and "kimi-k2.5" not in table
    assert table.cheapest().name == "fast"


def test_json_file_with_or_without_a_models_key(tmp_path: Path) -> None:
    models = {"a": {"input": "0.5", "output": 1}, "b": {"input": 2, "output": 4,
                                                        "cached_input": 0.5}}
    for name, doc in (("wrapped.json", {"models": models}), ("bare.json", models)):
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        table = PriceTable.from_file(path)
        assert table.names() == ["a", "b"]
        assert table["b"].cached_input == Decimal("0.5")
        assert table["a"].output == Decimal(1)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("no_output.toml", "[models.x]\ninput = 1\n", "needs 'input' and 'output'"),
    ("empty.toml", "[models]\n", "empty"),
    ("list.json", "[1, 2]", "table of models"),
    ("scalar.json", '{"models": 3}', "table of models"),
    ("word.json", '{"x": {"input": "cheap", "output": 1}}', "not a number"),
    ("negative.json", '{"x": {"input": -1, "output": 1}}', ">= 0"),
    ("infinite.json", '{"x": {"input": "Infinity", "output": 1}}', ">= 0"),
    ("bool.json", '{"x": {"input": true, "output": 1}}', "not a number"),
])
def test_bad_files_are_refused_with_a_clear_message(tmp_path: Path, name: str, text: str,
                                                    message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        PriceTable.from_file(path)


def test_bad_toml_syntax_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[models.x\ninput = 1")
    with pytest.raises(ValueError):  # tomllib.TOMLDecodeError is a ValueError
        PriceTable.from_file(path)


def test_cost_bills_cached_tokens_at_the_cached_price() -> None:
    m = ModelPrice("m", input=Decimal("0.60"), output=Decimal("2.50"),
                   cached_input=Decimal("0.15"))
    assert m.cost(1000, 500) == Decimal("0.00185")
    # 400 of the 1000 prompt tokens were cached: 600 * 0.60 + 400 * 0.15 + 500 * 2.50
    assert m.cost(1000, 500, 400) == Decimal("0.00167")
    assert m.cost(1000, 500, 5000) == m.cost(1000, 500, 1000)  # never more than the prompt
    assert m.cost(1000, 500, -3) == m.cost(1000, 500)
    assert m.cost(0, 0) == 0


def test_without_a_cached_price_cached_tokens_cost_the_input_price() -> None:
    kimi = BUILTIN_MODELS["kimi-k2.5"]
    assert kimi.cost(1000, 500, 400) == kimi.cost(1000, 500) == Decimal("0.00185")


def test_worst_case_is_every_token_uncached_and_rounds_up() -> None:
    kimi = BUILTIN_MODELS["kimi-k2.5"]
    assert kimi.worst_case(100, 1000) == Decimal("0.00256")
    assert kimi.worst_case(100, 1000) >= kimi.cost(100, 1000, 100)
    tiny = ModelPrice("tiny", input=Decimal("0.0000001"), output=Decimal(0))
    assert tiny.cost(1, 0) == 0  # 1e-13 USD: half-even to the 1e-12 grid
    assert tiny.worst_case(1, 0) == Decimal("1e-12")  # a reservation never rounds down


def test_amounts_live_on_the_1e_12_grid() -> None:
    assert quantize_usd(Decimal("0.0000001234565")) == Decimal("0.000000123456")  # half-even
    assert quantize_usd(Decimal("0.0000001234575")) == Decimal("0.000000123458")
    odd = ModelPrice("odd", input=Decimal("0.123457"), output=Decimal("0.000001"))
    assert odd.cost(7, 3) == Decimal("0.000000864202")  # exact: 6-decimal prices fit the grid
    assert odd.cost(7, 3).as_tuple().exponent == -12


@pytest.mark.parametrize(("amount", "text"), [
    (Decimal("0.002087200000"), "0.0020872"), (Decimal(0), "0"), (Decimal("0E-12"), "0"),
    (Decimal("5.000"), "5"), (Decimal("1E+1"), "10"), (Decimal("1e-12"), "0.000000000001"),
    (Decimal("1234.5"), "1234.5"),
])
def test_usd_str_is_exact_without_exponent_or_trailing_zeros(amount: Decimal,
                                                             text: str) -> None:
    assert usd_str(amount) == text


def test_version_names_the_table_content() -> None:
    a = PriceTable({"x": ModelPrice("x", Decimal(1), Decimal(2)),
                    "y": ModelPrice("y", Decimal(3), Decimal(4))})
    b = PriceTable({"y": ModelPrice("y", Decimal(3), Decimal(4)),
                    "x": ModelPrice("x", Decimal(1), Decimal(2))})
    c = PriceTable({"x": ModelPrice("x", Decimal(1), Decimal(2)),
                    "y": ModelPrice("y", Decimal(3), Decimal("4.01"))})
    assert a.version == b.version != c.version
    assert len(a.version) == 12
    assert PriceTable.builtin().version == PriceTable.builtin().version
    with pytest.raises(ValueError, match="empty"):
        PriceTable({})


def test_unpriced_models_are_labelled_other() -> None:
    table = PriceTable.builtin()
    assert metric_model_label("kimi-k2.5", table) == "kimi-k2.5"
    assert metric_model_label("my-finetune", table) == "other"


async def test_models_file_reaches_readyz_and_metrics(sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(TOML)
    settings = make_settings(sqlite_url, models_file=str(path), default_model="fast")
    h, close = await start_harness(settings)
    try:
        ready = (await h.client.get("/readyz")).json()
        text = (await h.client.get("/metrics")).text
        ok = await h.client.post("/swarms", json={"task": "t", "model": "fast"})
        unknown = await h.client.post("/swarms", json={"task": "t", "model": "kimi-k2.5"})
    finally:
        await close()
    version = settings.prices.version
    assert ready["price_table_version"] == version != PriceTable.builtin().version
    assert f'swarm_price_table_info{{version="{version}"}} 1.0' in text
    assert 'swarm_spend_usd_total{model="fast"} 0.0' in text  # its models exposed at zero
    assert ok.status_code == 202, ok.text
    assert unknown.status_code == 422  # priced only by the built-in table
