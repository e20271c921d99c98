"""`swarm-api` arguments through the CLI's own parser, stopped before the command runs: what
deployment files (docker-compose.yml, deploy/k8s) give the image as its command."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from app.cli import main


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def parse(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """`swarm-api argv` parsed as `main` parses it; an argument the parser refuses exits
    (argparse's SystemExit 2)."""
    real = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        raise Parsed(real(self, args, namespace))

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", stop)
        with pytest.raises(Parsed) as parsed:
            main(argv)
    return parsed.value.namespace
