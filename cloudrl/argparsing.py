"""The argument parser of every cloudrl command: one-line errors that point to the help.

:class:`CliParser` is ``argparse.ArgumentParser`` with three changes, and its subcommands
(``add_subparsers``) are ``CliParser`` too:

* ``allow_abbrev=False``: a flag is taken only as spelled (``--n-server 15`` is an error,
  never a silent ``--n-servers 15``);
* every usage error is one line on stderr and exit code 2, naming the subcommand whose
  ``--help`` explains it (an unknown flag names the deepest subcommand that was chosen,
  not the top-level program);
* an option's default shows in ``--help`` unless its help already states it.
"""

from __future__ import annotations

import argparse
from typing import Any

_PROG_ATTR = "_cloudrl_parser_prog"


class HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default unless it is unset or its help already states it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
                and "default" not in text):
            text += " (default: %(default)s)"
        return text


class CliParser(argparse.ArgumentParser):
    """argparse without abbreviations, with one-line usage errors (exit code 2) that name
    the subcommand's ``--help``, and defaults in ``--help`` (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if kwargs.get("help") is None and kwargs.get("default") not in (None, False):
            kwargs["help"] = "(default: %(default)s)"  # argparse shows nothing for no help
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        # subcommands parse after their parent: the deepest one chosen writes last ...
        if not hasattr(namespace, _PROG_ATTR):
            setattr(namespace, _PROG_ATTR, self.prog)
        return namespace, extras

    def _parse_known_args(self, arg_strings, namespace, *rest):  # type: ignore[override]
        # ... so mark before parsing: the parent marks, then its chosen subcommand overwrites
        setattr(namespace, _PROG_ATTR, self.prog)
        return super()._parse_known_args(arg_strings, namespace, *rest)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        prog = getattr(namespace, _PROG_ATTR, self.prog)
        if extras:
            self.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extras)} "
                         f"(see {prog} --help)\n")
        if hasattr(namespace, _PROG_ATTR):
            delattr(namespace, _PROG_ATTR)
        return namespace

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
