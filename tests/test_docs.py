"""The documentation site: every page is in the nav, every command runs as written (argparse
level), every python block compiles, the CLI is documented, and nothing a user reads cites
issue numbers or commit hashes. ``make test`` also runs ``mkdocs build --strict`` (links,
anchors, the API pages); the slow test here does the same into a temporary directory."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.doc_commands import (
    DOCS,
    ROOT,
    Block,
    Command,
    blocks,
    check,
    console_problems,
    doc_files,
    history_mentions,
    python_problems,
    runnable_commands,
)


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may hold python tags (none today); read it as plain data."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)


def _nav_files(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in _nav_files(item)]
    if isinstance(nav, dict):
        return [f for v in nav.values() for f in _nav_files(v)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    nav = set(_nav_files(config["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert nav - pages == set(), f"nav entries without a page: {sorted(nav - pages)}"
    assert pages - nav == set(), f"pages missing from the nav: {sorted(pages - nav)}"
    for section in ("getting-started.md", "troubleshooting.md", "benchmarks.md",
                    "results/index.md", "reference/api.md"):
        assert section in nav


def test_a_page_per_task_and_concept() -> None:
    for page in ("training", "sweeps", "headline", "offline", "hierarchical", "alignment",
                 "labelling", "serving", "production-loop", "cluster"):
        assert (DOCS / "tasks" / f"{page}.md").is_file(), page
    for page in ("simulator", "scenarios", "seed-protocol", "action-interfaces"):
        assert (DOCS / "concepts" / f"{page}.md").is_file(), page


DOC_COMMANDS = runnable_commands([p for p in doc_files() if p != ROOT / "README.md"])


def test_the_docs_show_commands() -> None:
    assert len(DOC_COMMANDS) >= 40
    assert sum(c.line.startswith("cloudrl ") for c in DOC_COMMANDS) >= 25


@pytest.mark.parametrize("cmd", DOC_COMMANDS, ids=[c.where for c in DOC_COMMANDS])
def test_doc_command_runs_as_written(cmd: Command) -> None:
    problem = check(cmd)
    assert problem is None, problem


def test_python_blocks_compile_and_import_what_exists() -> None:
    problems = [p for f in doc_files() for b in blocks(f) if b.lang in ("python", "py")
                for p in python_problems(b)]
    assert problems == []


def test_excerpts_are_marked_with_a_prompt() -> None:
    problems = [p for f in doc_files() for b in blocks(f) if b.lang == "console"
                for p in console_problems(b)]
    assert problems == []


def test_unlabelled_fences_are_not_used_for_commands() -> None:
    """A bare ``` block is neither checked nor marked as an excerpt: say which it is."""
    bare = [b.where for f in doc_files() for b in blocks(f)
            if b.lang == "" and any(ln.lstrip().startswith(("cloudrl ", "make ", "python "))
                                    for ln in b.text.splitlines())]
    assert bare == []


def test_the_checker_rejects_what_would_fail_when_pasted(tmp_path: Path) -> None:
    def problem(line: str) -> str | None:
        return check(Command("x", line))

    assert problem("cloudrl evaluate --n-seeds 5") is None
    assert "does not parse" in problem("cloudrl evaluate [--policy ffd]")
    assert "does not parse" in problem("cloudrl train --algo nope")
    assert "no make target" in problem("make nonsense")
    assert problem("make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu") is None
    assert "does not exist" in problem("cloudrl sweep --config experiments/nope.yaml")
    assert "does not exist" in problem("python experiments/nope.py")
    assert "defines no" in problem("python -m cloudrl.demo_report --no-such-flag")
    assert "not a command" in problem("frobnicate --now")
    assert problem("CLOUDRL__ENV__SIM__BETA=30 cloudrl evaluate --n-seeds 5") is None
    fake = Block(tmp_path / "x.md", 1, "python", "import cloudrl.no_such_module\n")
    assert python_problems(fake) and python_problems(
        Block(tmp_path / "x.md", 1, "python", "def f(:\n"))


def _parsers(parser: argparse.ArgumentParser, prefix: str = "cloudrl"):
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prefix} {name}")


def _leaf_commands() -> list[str]:
    from cloudrl.cli import build_parser

    names = [name for name, _ in _parsers(build_parser())]
    return [n for n in names if not any(o.startswith(n + " ") for o in names)]


def test_every_cli_command_is_in_the_reference() -> None:
    text = (DOCS / "reference" / "cli.md").read_text()
    missing = [c for c in _leaf_commands() if f"`{c}`" not in text]
    assert missing == [], f"add these to docs/reference/cli.md: {missing}"


def test_no_issue_numbers_or_commit_hashes_where_a_user_reads() -> None:
    from cloudrl.cli import build_parser

    found = {str(p.relative_to(ROOT)): history_mentions(p.read_text()) for p in doc_files()}
    found.update({name: history_mentions(parser.format_help())
                  for name, parser in _parsers(build_parser())})
    assert {k: v for k, v in found.items() if v} == {}


@given(st.sampled_from(["issue 13", "Issue 17's", "issues 13 and 14", "issue-15", "issue #4",
                        "commit 601b0bc", "(59af842)", "a10e851 did"]))
def test_history_patterns_are_caught(text: str) -> None:
    assert history_mentions(f"the {text} change")


@given(st.sampled_from(["sha256 digests", "10,080 steps", "tissue 3", "cafe", "1000000",
                        "results/compare/cloudrl-demo", "2026-11-24", "0x7f"]))
def test_history_patterns_leave_ordinary_text(text: str) -> None:
    assert history_mentions(text) == []


def test_extra_css_keeps_the_themes_table_scroll() -> None:
    """Wide tables scroll inside the column: the theme wraps each table in
    .md-typeset__scrollwrap (overflow-x: auto); the site's CSS must not undo that."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    sheets = config.get("extra_css", [])
    assert sheets, "mkdocs.yml names no extra_css"
    for sheet in sheets:
        css = (DOCS / sheet).read_text()
        for rule in css.split("}"):
            selector, _, body = rule.partition("{")
            if "scrollwrap" in selector or "table" in selector:
                assert "overflow" not in body, f"{sheet}: {selector.strip()} sets overflow"
                assert "white-space: nowrap" not in body, f"{sheet}: {selector.strip()}"
            if "table" in selector and "min-width" in body:
                assert "5rem" not in body  # the theme's per-column minimum is what overflowed


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (make test installs it)")
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir",  # --quiet hides warnings
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()
