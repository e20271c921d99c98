"""`make bench` rewrites bench/RESULTS.md's performance table in place (the rest of the file
kept) and, for several builds, renders a column per build (tests/results_md.py)."""

from __future__ import annotations

from pathlib import Path

from tests.results_md import Row, render, rewrite, section

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """# Benchmark results

How to read this file.

## The performance table (issue 14), 2026-12-05 11:40 UTC

Command: an old one.

| workload | swarm-api | peers, same run | target |
|---|---|---|---|
| old row | **1.00** | - | <= 1 |

Below target: a note of the old run.

## Other workloads

| workload | latest | goal | command | date |
|---|---|---|---|---|
| kept row | 1 | - | `x` | 2026-12-01 |

## A/B and diagnostic tools

- kept.
"""

EXPECTED = """# Benchmark results

How to read this file.

## The performance table

Command: `make bench`, 2026-12-06 07:30 UTC, load 0.4.

| workload | swarm-api | peers, same run | target |
|---|---|---|---|
| fan-out | **1.02** | bare 1.01 | <= 1.03 |
| tools | **1.2x** | - | <= 1.25x |

## Other workloads

| workload | latest | goal | command | date |
|---|---|---|---|---|
| kept row | 1 | - | `x` | 2026-12-01 |

## A/B and diagnostic tools

- kept.
"""

ROWS = [Row("fan-out", "**1.02**", "bare 1.01", "<= 1.03"),
        Row("tools", "**1.2x**", "-", "<= 1.25x")]
INTRO = "Command: `make bench`, 2026-12-06 07:30 UTC, load 0.4."


def test_the_table_replaces_its_section_and_keeps_every_other_line() -> None:
    assert rewrite(SAMPLE, section(INTRO, {"": ROWS})) == EXPECTED


def test_a_second_rewrite_replaces_the_first_instead_of_appending() -> None:
    once = rewrite(SAMPLE, section("Command: first.", {"": ROWS}))
    assert rewrite(once, section(INTRO, {"": ROWS})) == EXPECTED


def test_a_file_without_the_section_gets_it_before_its_first_heading() -> None:
    without = SAMPLE.replace(SAMPLE[SAMPLE.index("## The performance"):
                                    SAMPLE.index("## Other workloads")], "")
    assert rewrite(without, section(INTRO, {"": ROWS})) == EXPECTED


def test_the_last_section_is_replaced_to_the_end_of_the_file() -> None:
    head = "# Benchmark results\n\n"
    old = head + "## The performance table\n\nold\n\n| a | b |\n"
    assert rewrite(old, section(INTRO, {"": ROWS[:1]})) == head + (
        "## The performance table\n\n" + INTRO + "\n\n"
        "| workload | swarm-api | peers, same run | target |\n|---|---|---|---|\n"
        "| fan-out | **1.02** | bare 1.01 | <= 1.03 |\n")


def test_the_repository_results_file_has_one_table_section_that_a_rewrite_replaces() -> None:
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    new = rewrite(text, section(INTRO, {"": ROWS}))
    assert new.count("## The performance table") == 1
    assert "| fan-out | **1.02** | bare 1.01 | <= 1.03 |" in new
    kept = text[text.index("## Other workloads"):]
    assert new.endswith(kept)


def test_builds_render_one_column_each_with_their_own_peers() -> None:
    before = [Row("fan-out", "**1.10**", "bare 1.01", "<= 1.03"),
              Row("throughput", "**3.0x**", "-", ">= 3x")]
    after = [Row("fan-out", "**1.02**", "bare 1.02", "<= 1.03"),
             Row("throughput", "**3.4x**", "-", ">= 3x"),
             Row("tools", "**1.2x**", "-", "<= 1.25x")]
    assert render({"before": before, "after": after}) == [
        "| workload | `before` | `after` | target |",
        "|---|---|---|---|",
        "| fan-out | **1.10**; peers: bare 1.01 | **1.02**; peers: bare 1.02 | <= 1.03 |",
        "| throughput | **3.0x** | **3.4x** | >= 3x |",
        "| tools | not measured | **1.2x** | <= 1.25x |",
    ]


def test_one_named_build_keeps_the_peers_column() -> None:
    assert render({"main": ROWS[:1]}) == [
        "| workload | swarm-api (`main`) | peers, same run | target |",
        "|---|---|---|---|",
        "| fan-out | **1.02** | bare 1.01 | <= 1.03 |",
    ]
