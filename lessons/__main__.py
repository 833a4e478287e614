"""``python -m lessons build [PREFIX...]`` writes the notebooks from their sources;
``python -m lessons check [PREFIX...]`` exits 1 if a committed notebook is out of date;
``python -m lessons labs build|check|handout DIR [--labs ...] [--through-lesson N] [--add]|autograder ZIP`` cuts the labs from the engine
(``lessons/labs.py``); ``python -m lessons grade [LAB...] [--impl ...]`` grades them (``lessons/grade.py``);
``python -m lessons compare --impl ...`` runs a student's parts beside the engine's (``lessons/compare.py``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def labs_main(argv: list[str]) -> int:
    from lessons import labs

    parser = argparse.ArgumentParser(prog="python -m lessons labs", description=labs.__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("build", "write labs/starters/ from the engine's modules"), ("check", "exit 1 if a committed starter is out of date")):
        p = sub.add_parser(name, help=text)
        p.add_argument("names", nargs="*", metavar="LAB")
    p = sub.add_parser("handout", help="write the students' tree (no model answers) to a new directory")
    p.add_argument("dest", type=Path)
    p.add_argument("--labs", default="", metavar="LAB,LAB", help="cut out only these labs' model answers (default: every lab's)")
    p.add_argument("--through-lesson", type=int, metavar="N", help="cut out the labs that go with lessons 1..N")
    p.add_argument("--add", action="store_true", help="add the chosen labs to the handout in DEST, leaving the student's files")
    p = sub.add_parser("autograder", help="write Gradescope's autograder zip")
    p.add_argument("zip", type=Path)
    p.add_argument("--tests", type=Path, metavar="DIR", help="hidden tests to add (test_lab_<lab>*.py)")
    p.add_argument("--labs", default="", metavar="LAB,LAB", help="grade only these labs (default: every lab)")
    p.add_argument("--through-lesson", type=int, metavar="N", help="grade only the labs of lessons 1..N (a week's assignment)")
    args = parser.parse_args(argv)
    try:
        if args.command in ("build", "check"):
            paths = labs.build(args.names) if args.command == "build" else labs.stale(args.names)
            for path in paths:
                print(path.relative_to(labs.ROOT))
            if args.command == "check" and paths:
                print("out of date: run `python -m lessons labs build`", file=sys.stderr)
                return 1
        elif args.command == "handout":
            chosen = labs.chosen_labs([n.strip() for n in args.labs.split(",") if n.strip()], args.through_lesson)
            written = labs.write_handout(args.dest, chosen, add=args.add)
            given = sorted(labs.handed_out(args.dest))
            print(f"{len(written)} files written to {args.dest}; its labs: {', '.join(given) or 'none'}")
            waiting = [lab.name for lab in (chosen or labs.LABS) if lab.base and lab.name not in given]
            if waiting:
                print(f"left out until the lab each copies is in the handout (its starter holds that lab's answer): "
                      f"{', '.join(waiting)}; add them in a later week with --add")
        else:
            chosen = labs.chosen_labs([n.strip() for n in args.labs.split(",") if n.strip()], args.through_lesson)
            print(labs.write_autograder(args.zip, args.tests, chosen))
    except labs.LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["labs"]:
        return labs_main(argv[1:])
    if argv[:1] == ["compare"]:
        from lessons.compare import main as compare_main

        return compare_main(argv[1:])
    if argv[:1] == ["grade"]:
        from lessons.grade import main as grade_main

        return grade_main(argv[1:])
    from lessons.build import LESSONS, LessonSourceError, build, stale

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
