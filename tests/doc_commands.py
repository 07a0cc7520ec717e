"""The commands the README and the docs show, and checks that each one runs as written.

Convention for fenced blocks in README.md and docs/:

- ``bash``/``sh``/``shell`` blocks run as written (after the page's earlier steps, in the
  activated venv, from the repository root); every line is checked here;
- ``console`` blocks are excerpts: what to type where the command needs something of yours
  (a cluster, a downloaded trace, a file you write); each command line starts with ``$ ``;
- ``python`` blocks must compile and import only modules that exist;
- ``text``, ``json``, ``yaml`` and other blocks are output or data, not checked.

A command is checked without running it: ``cloudrl`` lines must parse with the real
argparse parser, ``make`` targets must exist, scripts must exist and define every
``--flag`` the line passes, and repository paths must exist.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUNNABLE = {"bash", "sh", "shell"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
REPO_DIRS = ("experiments/", "serve_apps/", "cloudrl/", "envs/", "models/", "tests/", "docs/",
             ".ci/")
# commands a page may use besides cloudrl, make and python (what each needs is its own docs)
OTHER_COMMANDS = {"source", "export", "curl", "mlflow", "ray", "serve", "git", "cd", "apt-get",
                  "pip", "open", "xdg-open"}
RAY_SUBCOMMANDS = {"up", "down", "attach", "exec", "dashboard", "job", "rsync-down", "rsync-up",
                   "start", "stop", "status", "get-auth-token", "submit"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # line of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


@dataclass(frozen=True)
class Command:
    where: str
    line: str  # the logical line, continuations joined, comment dropped


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    """Every fenced block of a markdown file (indented fences inside lists included)."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        yield Block(path, i + 1, lang.lower(), "\n".join(body))
        i = j + 1


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` outside quotes."""
    out, quote = [], None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            break
        out.append(ch)
    return "".join(out).rstrip()


def commands(block: Block) -> list[Command]:
    """Logical lines of a runnable block: continuations joined, comments and blanks dropped."""
    out, pending, start = [], "", 0
    for k, raw in enumerate(block.text.splitlines()):
        line = strip_comment(raw) if not pending else raw.rstrip()
        if not pending:
            start = k
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            out.append(Command(f"{block.where}+{start + 1}", strip_comment(full)))
    return out


def runnable_commands(paths: list[Path] | None = None) -> list[Command]:
    return [c for p in (paths or doc_files()) for b in blocks(p) if b.lang in RUNNABLE
            for c in commands(b)]


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for m in re.finditer(r"^([A-Za-z][\w .-]*?):(?!=)", text, flags=re.M):
        targets.update(m.group(1).split())
    return targets


def _words(line: str) -> list[str]:
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)  # VAR=value prefixes
    if words[:1] == ["nice"]:
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    if words[:1] == ["time"]:
        words = words[1:]
    return words


def _script_flags(path: Path) -> str:
    return path.read_text()


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from cloudrl.cli import build_parser

    return build_parser()


def check(cmd: Command) -> str | None:
    """None when the command would run as written, else one line saying why not."""
    try:
        words = _words(cmd.line)
    except ValueError as e:
        return f"{cmd.where}: `{cmd.line}` does not split as a shell line ({e})"
    if not words:
        return None
    for w in words:  # repository paths must exist (outputs under results/ are made by the run)
        for piece in re.split(r"[=,]", w):
            if piece.startswith(REPO_DIRS) and "<" not in piece and "*" not in piece \
                    and not (ROOT / piece.rstrip("/")).exists():
                return f"{cmd.where}: `{piece}` does not exist"
            if piece == "cluster.yaml" and not (ROOT / piece).exists():
                return f"{cmd.where}: cluster.yaml does not exist"
    head = words[0]
    if head in ("cloudrl", ".venv/bin/cloudrl") or words[:3] in (
            ["python", "-m", "cloudrl"], [".venv/bin/python", "-m", "cloudrl"]):
        argv = words[1:] if "cloudrl" in head else words[3:]
        try:
            _parser().parse_args(argv)
        except SystemExit as e:
            if e.code not in (0, None):
                return f"{cmd.where}: `{cmd.line}` does not parse (exit {e.code})"
        return None
    if head == "make":
        missing = [t for t in words[1:] if "=" not in t and t not in make_targets()]
        return f"{cmd.where}: no make target {missing}" if missing else None
    if head in ("python", ".venv/bin/python", "python3"):
        rest = words[1:]
        if rest[:2] == ["-m", "pytest"] or rest[:1] == ["-c"]:
            return None
        if rest[:1] == ["-m"]:
            spec = importlib.util.find_spec(rest[1])
            if spec is None or spec.origin is None:
                return f"{cmd.where}: no module {rest[1]}"
            script, flags = Path(spec.origin), rest[2:]
        else:
            script, flags = ROOT / rest[0], rest[1:]
            if not script.exists():
                return f"{cmd.where}: {rest[0]} does not exist"
        source = _script_flags(script)
        unknown = [f.split("=")[0] for f in flags
                   if f.startswith("--") and f.split("=")[0] not in source]
        return f"{cmd.where}: {script.name} defines no {unknown}" if unknown else None
    if head == "pytest":
        return None
    if head == "ray":
        sub = words[1] if len(words) > 1 else ""
        return None if sub in RAY_SUBCOMMANDS else f"{cmd.where}: unknown `ray {sub}`"
    if head in OTHER_COMMANDS:
        return None
    return f"{cmd.where}: `{head}` is not a command these docs know how to check; " \
           "mark the block as an excerpt (```console) or extend tests/doc_commands.py"


def python_problems(block: Block) -> list[str]:
    """A python block must compile and import only modules that exist."""
    try:
        tree = ast.parse(block.text)
    except SyntaxError as e:
        return [f"{block.where}: python block does not compile: {e.msg} (line {e.lineno})"]
    problems = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            if importlib.util.find_spec(name.split(".")[0]) is None or (
                    name.split(".")[0] in ("cloudrl", "envs", "models", "serve_apps")
                    and importlib.util.find_spec(name) is None):
                problems.append(f"{block.where}: imports {name}, which does not exist")
    return problems


def console_problems(block: Block) -> list[str]:
    """An excerpt block shows commands with a ``$ `` prompt (continuations indented)."""
    first = next((ln for ln in block.text.splitlines() if ln.strip()), "")
    return [] if first.startswith("$ ") else [
        f"{block.where}: console block (an excerpt) should start its commands with `$ `"]


# "issue 12", "issue-12", "issue #12" and commit hashes (7-40 hex digits with a digit and a letter)
ISSUE = re.compile(r"\bissues?[ -]?#?\d+", re.I)
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/-])")


def history_mentions(text: str) -> list[str]:
    """Issue numbers and commit hashes in text a user reads."""
    return ISSUE.findall(text) + HASH.findall(text)
