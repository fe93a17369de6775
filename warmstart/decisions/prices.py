"""On-demand prices shipped as data (warmstart/data/ondemand_prices.csv, its source and date in
warmstart/data/SOURCES.md), used where a stack gives no `hourlyPriceUsd` (pure)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    as_of: str
    """The month the figure was read (YYYY-MM)."""


@cache
def table() -> dict[tuple[str, str], Price]:
    text = resources.files("warmstart.data").joinpath("ondemand_prices.csv").read_text()
    return {(r["region"], r["instance_type"]): Price(float(r["usd_per_hour"]), r["as_of"])
            for r in csv.DictReader(io.StringIO(text))}


def on_demand(region: str, instance_type: str) -> Price | None:
    """The shipped on-demand price of one instance-hour, None where the table has none."""
    return table().get((region, instance_type))


def pool_price(region: str, instance_types: tuple[str, ...] | list[str]) -> Price | None:
    """A pool's node-hour at on-demand: the dearest of its instance types (the pool may get any
    of them), None unless every one is in the table."""
    found = [on_demand(region, t) for t in instance_types]
    if not found or any(p is None for p in found):
        return None
    return max(found, key=lambda p: p.usd_per_hour)  # type: ignore[arg-type,return-value]
