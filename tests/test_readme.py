"""The README runs as written: every ``cloudrl`` command line in it parses with the real CLI,
and the bare ``cloudrl`` lines come after the README says how to put it on PATH."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
ACTIVATE = "source .venv/bin/activate"


def _code_lines() -> list[tuple[int, str]]:
    """(line number, logical line) of every shell code block: continuations joined,
    comments dropped."""
    out: list[tuple[int, str]] = []
    in_block, pending, start = False, "", 0
    for no, raw in enumerate(README.read_text().splitlines(), 1):
        if raw.startswith("```"):
            in_block = raw.strip() in ("```bash", "```sh", "```console")
            continue
        if not in_block:
            continue
        line = raw.rstrip()
        if not pending:
            start = no
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def _strip(line: str) -> str:
    """Drop a trailing ``# comment`` (outside quotes) and ``[optional]`` parts."""
    line = re.sub(r"\s+#\s.*$", "", line)
    return re.sub(r"\s*\[[^\]]*\]", "", line).strip()


def cloudrl_commands() -> list[tuple[int, list[str]]]:
    cmds = []
    for no, line in _code_lines():
        line = _strip(line)
        for prefix in ("cloudrl ", ".venv/bin/cloudrl ", "python -m cloudrl "):
            if line.startswith(prefix):
                cmds.append((no, shlex.split(line[len(prefix):])))
    return cmds


def test_readme_has_cloudrl_commands() -> None:
    assert len(cloudrl_commands()) >= 10


@pytest.mark.parametrize(("line_no", "argv"), cloudrl_commands(),
                         ids=[f"README:{n}" for n, _ in cloudrl_commands()])
def test_readme_cloudrl_command_parses(line_no: int, argv: list[str]) -> None:
    from cloudrl.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as e:  # argparse's way of saying "bad command line"
        pytest.fail(f"README line {line_no}: `cloudrl {shlex.join(argv)}` does not parse "
                    f"(exit {e.code})")


def test_bare_cloudrl_comes_after_activation() -> None:
    """A newcomer who copies the Usage lines after `make demo` has `cloudrl` on PATH."""
    lines = _code_lines()
    activate = next((no for no, line in lines if ACTIVATE in line), None)
    assert activate is not None, f"README never says `{ACTIVATE}`"
    bare = [no for no, line in lines if _strip(line).startswith(("cloudrl ", "mlflow "))]
    assert bare, "no bare cloudrl lines found"
    assert min(bare) > activate, f"README line {min(bare)} uses bare `cloudrl` before line " \
                                 f"{activate} says `{ACTIVATE}`"
