"""The model table: prices per 1M tokens (Decimal), context windows, optional concurrency."""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

MILLION = Decimal(1_000_000)
DEFAULT_CONTEXT_WINDOW = 128_000
# every amount is kept to 1e-12 USD: exact for prices with up to six decimals per 1M tokens
USD_QUANTUM = Decimal("1e-12")


def quantize_usd(amount: Decimal, rounding: str = ROUND_HALF_EVEN) -> Decimal:
    """An amount on the 1e-12 USD grid every table and ledger uses."""
    return amount.quantize(USD_QUANTUM, rounding=rounding)


def usd_str(amount: Decimal) -> str:
    """Money as an exact decimal string without trailing zeros ("0.0020872", "0")."""
    if amount == 0:
        return "0"
    return format(amount.normalize(), "f")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """Prices in USD per 1M tokens; cached input defaults to the input price."""

    name: str
    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    context_window: int = DEFAULT_CONTEXT_WINDOW
    concurrency: int | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Decimal:
        """Exact cost of one call; cached tokens are part of prompt_tokens."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        total = (
            (prompt_tokens - cached) * self.input
            + cached * cached_price
            + completion_tokens * self.output
        )
        return quantize_usd(total / MILLION)

    def worst_case(self, prompt_tokens: int, max_tokens: int) -> Decimal:
        """The most a call can cost: every prompt token uncached, every output token used."""
        return quantize_usd(
            (prompt_tokens * self.input + max_tokens * self.output) / MILLION, ROUND_CEILING
        )


BUILTIN_MODELS: dict[str, ModelPrice] = {
    m.name: m
    for m in (
        ModelPrice("kimi-k2.5", Decimal("0.60"), Decimal("2.50"), context_window=256_000),
        ModelPrice("deepseek-v3.2", Decimal("0.27"), Decimal("0.42"), context_window=128_000),
        ModelPrice("gpt-4.1", Decimal("2.00"), Decimal("8.00"), context_window=1_000_000),
        ModelPrice("claude-sonnet-4.5", Decimal("3.00"), Decimal("15.00"), context_window=200_000),
        ModelPrice("gemini-2.5-flash", Decimal("0.30"), Decimal("2.50"), context_window=1_000_000),
    )
}


class PriceTable:
    """Priced models by name; anything not in it is never sent to the gateway."""

    def __init__(self, models: Mapping[str, ModelPrice]) -> None:
        if not models:
            raise ValueError("the model table is empty")
        self._models = dict(models)
        canon = json.dumps(
            {n: [str(m.input), str(m.cached_input), str(m.output), m.context_window,
                 m.concurrency] for n, m in sorted(self._models.items())},
            sort_keys=True,
        )
        self.version = hashlib.sha256(canon.encode()).hexdigest()[:12]

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __getitem__(self, name: str) -> ModelPrice:
        return self._models[name]

    def names(self) -> list[str]:
        return sorted(self._models)

    def cheapest(self) -> ModelPrice:
        """The model with the lowest output price (ties: lowest input, then name)."""
        return min(self._models.values(), key=lambda m: (m.output, m.input, m.name))

    @classmethod
    def builtin(cls) -> PriceTable:
        return cls(BUILTIN_MODELS)

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """Load `{"models": {name: {input, output, cached_input?, context_window?, concurrency?}}}`
        (or the same mapping at top level) from TOML or JSON."""
        p = Path(path)
        raw: dict[str, Any]
        if p.suffix.lower() == ".json":
            raw = json.loads(p.read_text())
        else:
            raw = tomllib.loads(p.read_text())
        entries = raw.get("models", raw) if isinstance(raw, dict) else None
        if not isinstance(entries, dict):
            raise ValueError(f"{p}: expected a table of models")
        models: dict[str, ModelPrice] = {}
        for name, e in entries.items():
            if not isinstance(e, dict) or "input" not in e or "output" not in e:
                raise ValueError(f"{p}: model {name!r} needs 'input' and 'output' prices")
            cached = e.get("cached_input")
            models[name] = ModelPrice(
                name=name,
                input=_price(p, name, "input", e["input"]),
                output=_price(p, name, "output", e["output"]),
                cached_input=None if cached is None else _price(p, name, "cached_input", cached),
                context_window=int(e.get("context_window", DEFAULT_CONTEXT_WINDOW)),
                concurrency=None if e.get("concurrency") is None else int(e["concurrency"]),
            )
        return cls(models)


def _price(path: Path, model: str, key: str, value: Any) -> Decimal:
    """A price as an exact, finite, non-negative Decimal (a negative price would let spend
    shrink and so defeat every budget)."""
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{path}: model {model!r}: {key} is not a number: {value!r}") from None
    if not price.is_finite() or price < 0:
        raise ValueError(f"{path}: model {model!r}: {key} must be a price >= 0, got {value!r}")
    return price


def metric_model_label(name: str, table: PriceTable) -> str:
    """Metric label for a model: its name when priced, else `other` (bounded cardinality)."""
    return name if name in table else "other"
