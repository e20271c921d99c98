"""`--cli NAME=PATH`: how a bench script is told the builds of `swarm-api` it compares."""

from __future__ import annotations

import argparse
from pathlib import Path


def build(value: str) -> tuple[str, str]:
    """One `--cli` value: the build's name and its `swarm-api`'s absolute path (the scripts
    start it from other working directories)."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, str(Path(path).absolute())


def add_builds(parser: argparse.ArgumentParser, help: str, *, required: bool = False) -> None:
    """The repeatable `--cli NAME=PATH` option; `builds(args)` reads it."""
    parser.add_argument("--cli", action="append", type=build, required=required,
                        default=None if required else [], metavar="NAME=PATH", help=help)


def builds(args: argparse.Namespace, default: tuple[str, str] | None = None
           ) -> dict[str, str]:
    """The builds named by `--cli`, in order (name → path); `default` when none is."""
    named: list[tuple[str, str]] = args.cli or ([default] if default else [])
    return dict(named)
