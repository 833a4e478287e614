"""``python -m lessons build [PREFIX...]`` writes the notebooks from their sources;
``python -m lessons check [PREFIX...]`` exits 1 if a committed notebook is out of date."""

from __future__ import annotations

import argparse
import sys

from lessons.build import LESSONS, LessonSourceError, build, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lessons", description=__doc__)
    parser.add_argument("command", choices=("build", "check"))
    parser.add_argument("prefixes", nargs="*", metavar="PREFIX", help="only the lessons whose name starts so (e.g. 04)")
    args = parser.parse_args(argv)
    try:
        paths = build(args.prefixes) if args.command == "build" else stale(args.prefixes)
    except LessonSourceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in paths:
        print(path.relative_to(LESSONS.parent))
    if args.command == "check" and paths:
        print("out of date: run `python -m lessons build`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
