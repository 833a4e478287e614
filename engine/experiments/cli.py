"""``python -m visualize reproduce-paper``: the paper's figures on the simulator, as tables, JSON or (``--out``) charts.

The command's parser and its runs live here, beside the experiments; ``visualize/cli.py`` registers it with its
``save_chart`` (matplotlib lives in visualize/, never in engine/). ``python -m engine reproduce-paper`` only
points to it.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

from engine.experiments.figures import format_figure, reproduce_figure
from engine.experiments.memory import format_paper_table, reproduce_paper
from engine.experiments.paper_data import PAPER_FIGURES

SaveChart = Callable[[str, object, str], object]  # (figure, result, out path)


def _cmd_reproduce_paper(args: argparse.Namespace) -> None:
    if args.figure:
        result = reproduce_figure(args.figure, num_requests=args.num_requests, seed=args.seed, progress=not args.json)
        print(json.dumps(result, indent=2) if args.json else format_figure(args.figure, result))
        _save_chart(args, args.figure, result)
        return
    rows = reproduce_paper(num_requests=args.num_requests or 5000, seed=args.seed, watermark=args.watermark,
                           progress=not args.json)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_paper_table(rows))
    _save_chart(args, "memory", rows)


def _save_chart(args: argparse.Namespace, figure: str, result) -> None:
    if not args.out:
        return
    args.save_chart(figure, result, args.out)
    if not args.json:
        print(f"figure written to {args.out}")


def register_cli(subparsers, save_chart: SaveChart) -> None:
    """Add the ``reproduce-paper`` subcommand to an argparse subparsers object; ``save_chart(figure, result,
    path)`` draws ``--out`` (``visualize.paper.save_paper_figure``)."""
    p = subparsers.add_parser("reproduce-paper", help="PagedAttention paper figures 2, 12, 13, 15, 16, 18b and 19 on the simulator")
    p.add_argument("--figure", choices=PAPER_FIGURES, default=None,
                   help="one figure with time (engine/experiments/figures.py); default: the memory table at saturation")
    p.add_argument("--num-requests", type=int, default=None,
                   help="requests per run (default: 5000 for the saturation table, each figure's own otherwise)")
    p.add_argument("--seed", type=int, default=0, help="seeds the workloads (default: 0)")
    p.add_argument("--watermark", type=float, default=0.01,
                   help="vLLM: share of the blocks admission leaves free (vLLM's default 0.01)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--out", default=None, help="also save the figure's chart to this PNG")
    p.set_defaults(func=_cmd_reproduce_paper, save_chart=save_chart)
