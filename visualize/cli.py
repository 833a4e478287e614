"""``python -m visualize reproduce-paper ... --out FILE``: the engine's ``reproduce-paper`` command with
its chart drawn (matplotlib lives here, never in engine/)."""

from __future__ import annotations

import argparse

from engine.experiments.cli import register_cli
from visualize.paper import save_paper_figure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m visualize", description="PagedAttention Lab's charts of the paper's figures")
    register_cli(parser.add_subparsers(dest="command", required=True), save_chart=save_paper_figure)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as error:  # bad input or an unwritable file: one readable line
        parser.exit(2, f"error: {error}\n")
