"""``python -m visualize reproduce-paper [--figure N] [--json] [--out FILE]``: the PagedAttention paper's figures on
the simulator, as tables, JSON or charts (the runs: ``engine/experiments/``; matplotlib lives here, never in engine/)."""

from __future__ import annotations

import argparse
import functools

from engine.cli import HelpFormatter
from engine.experiments.cli import register_cli
from visualize.paper import save_paper_figure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m visualize", description="PagedAttention Lab's charts of the paper's figures",
                                     epilog="The engine's own commands: python -m engine --help", formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=functools.partial(argparse.ArgumentParser, formatter_class=HelpFormatter))
    register_cli(sub, save_chart=save_paper_figure)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as error:  # bad input or an unwritable file: one readable line
        parser.exit(2, f"error: {error}\n")
