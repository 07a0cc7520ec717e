"""Every cloudrl command takes a flag only as spelled, and a usage error is one line that
names the chosen subcommand's --help (``cloudrl/argparsing.py``)."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.cli import build_parser


def _subcommands(parser: argparse.ArgumentParser, path=()):
    """(words, parser) of every subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subcommands(sub, (*path, name))


SUBCOMMANDS = list(_subcommands(build_parser()))
WITH_LONG_FLAGS = [(words, p, flags) for words, p in SUBCOMMANDS
                   if (flags := sorted({o for a in p._actions for o in a.option_strings
                                        if o.startswith("--") and len(o) > 4
                                        and o != "--help"}))]


def _parse(argv):
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(err):
        build_parser().parse_args(argv)
    return exit_.value.code, err.getvalue()


def test_every_subcommand_refuses_abbreviations():
    assert len(SUBCOMMANDS) > 20
    assert all(not p.allow_abbrev for _, p in SUBCOMMANDS)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_prefix_of_a_flag_is_refused_naming_the_subcommand(data):
    words, parser, flags = data.draw(st.sampled_from(WITH_LONG_FLAGS))
    flag = data.draw(st.sampled_from(flags))
    cut = data.draw(st.integers(3, len(flag) - 1))
    prefix = flag[:cut]
    if any(f == prefix for a in parser._actions for f in a.option_strings):
        return  # the prefix is itself a flag
    code, err = _parse([*words, prefix, "1"])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"see {parser.prog} --help" in lines[0]
    if "are required" not in lines[0]:  # a missing required flag is reported first
        assert f"unrecognized arguments: {prefix}" in lines[0]
    assert parser._parse_optional(prefix)[0] is None  # argparse matches no flag to it


def test_the_shortened_flag_of_the_report_is_refused_in_a_process():
    """The entry point as a user runs it: exit 2, one line, nothing evaluated."""
    out = subprocess.run([sys.executable, "-m", "cloudrl", "scenarios", "evaluate",
                          "--scenario", "tiny", "--n-seed", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "cloudrl scenarios evaluate: error: unrecognized arguments: --n-seed 3 "
        "(see cloudrl scenarios evaluate --help)"]


def test_other_usage_errors_are_one_line_too():
    code, err = _parse(["evaluate", "--n-servers", "many"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--n-servers" in err and "see cloudrl evaluate --help" in err
    code, err = _parse(["no-such-command"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no-such-command" in err
