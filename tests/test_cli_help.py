"""The command line's help, as a person reads it: ``python -m engine --help`` and its commands' ``--help``, run
as commands. Every option says what it does and its default; one thing has one name (vLLM's); one command
lives in one place; a default that differs from vLLM's says so; the top help points to the app and the lessons."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def _help(*args: str) -> str:
    done = _run(*args, "--help")
    assert done.returncode == 0, done.stderr
    return re.sub(r"\s+", " ", done.stdout)  # argparse wraps lines at the terminal's width


def _option_help(text: str, option: str) -> str:
    """The help of ``option`` in a flattened --help text: what follows it up to the next option."""
    match = re.search(rf"(?:^| ){re.escape(option)}(?: [A-Z_{{][^ ]*)? (.*?)(?= --?[a-z][\w-]*(?:,| [A-Z_{{]| [a-z(])|$)", text)
    assert match, f"{option} is not in the help"
    return match.group(1)


def test_every_generate_option_says_what_it_does_and_its_default():
    text = _help("-m", "engine", "generate")
    for option, default in (("--seed", "0"), ("--allocator", "paged"), ("--reservation", "max"),
                            ("--attention-backend", "auto"), ("--block-size", "16"), ("--max-tokens", "64"),
                            ("--temperature", "0.0"), ("--num-gpu-blocks-override", "512")):
        described = _option_help(text, option)
        assert len(re.sub(r"\(default: [^)]*\)", "", described).strip()) > 5, f"{option} has no help: {described!r}"
        assert f"default: {default}" in described, f"{option} shows no default: {described!r}"


@pytest.mark.parametrize("command", ["generate", "serve", "serve-disagg", "bench-serve", "simulate", "calibrate", "bench"])
def test_an_option_with_a_default_shows_it(command):
    """Whatever a command's option defaults to (a number, a name) is in its help, written or added by the formatter."""
    from engine.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    shown = {a.option_strings[-1]: sub._get_formatter()._format_action(a) for a in sub._actions if a.option_strings}
    missing = [a.option_strings[-1] for a in sub._actions
               if a.option_strings and a.help != "==SUPPRESS==" and a.default not in (None, False, "==SUPPRESS==")
               and not isinstance(a.default, bool) and "default" not in shown[a.option_strings[-1]].lower()]
    assert missing == [], f"{command}: options without their default in the help: {missing}"


def test_the_kv_pool_has_one_name_vllms():
    text = _help("-m", "engine", "generate")
    assert "--num-gpu-blocks-override" in text and "--num-blocks" not in text
    for command in ("serve", "bench-serve"):
        assert "--num-gpu-blocks-override" in _help("-m", "engine", command)
    # the old name still works, says it is deprecated, and sets the same thing
    from engine.cli import build_parser

    args = build_parser().parse_args(["generate", "hi", "--num-blocks", "7"])
    assert args.num_gpu_blocks_override == 7


def test_reproduce_paper_is_visualizes_and_the_engine_points_to_it():
    assert "--figure" in _help("-m", "visualize", "reproduce-paper")
    done = _run("-m", "engine", "reproduce-paper", "--figure", "12")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "reproduce-paper is a command of visualize, which also draws the charts: python -m visualize reproduce-paper --figure 12"]


def test_bench_serve_says_its_ignore_eos_default_is_not_vllms():
    described = _option_help(_help("-m", "engine", "bench-serve"), "--ignore-eos,")
    assert "vllm bench serve" in described and "default is off" in described, described


def test_the_engine_help_points_to_the_app_and_the_lessons():
    text = _help("-m", "engine")
    assert "streamlit run app.py" in text and "lessons/" in text and "python -m visualize reproduce-paper" in text


def test_a_command_parses_alone_as_in_the_whole_parser():
    """``python -m engine COMMAND`` registers COMMAND alone (with the commands one function registers beside it):
    the same options and defaults as the whole parser's, and ``simulate`` starts without the model's or the
    server's libraries."""
    from engine.cli import build_parser

    def commands(parser):
        return next(a for a in parser._actions if a.dest == "command").choices

    def options(sub):
        return [(a.option_strings, a.dest, a.default, a.help) for a in sub._actions]

    whole = commands(build_parser())
    for name, sub in whole.items():
        alone = commands(build_parser(name))
        assert name in alone and len(alone) < len(whole), f"{name} registered with every command"
        assert options(alone[name]) == options(sub), f"{name}'s options differ when it is registered alone"
    check = ("import sys; from engine.cli import build_parser; build_parser('simulate'); "
             "print(sorted(m for m in ('torch', 'transformers', 'fastapi') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
