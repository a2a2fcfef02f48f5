"""``python -m toolkit …``: argparse subcommands, tables for people, ``--json`` for programs.

The framework lives here; each module of this package registers its
subcommands with ``@command`` (``batch``: fixtures, run; ``drill``;
``inspect``: ledger, provider-stats).

Bad input is one line on stderr and exit status 2, never a traceback; a storage
failure (``StorageError``: disk full, no free inode, I/O error), a ledger not ready
(``NotReadyError``) or busy in another live process (``LedgerBusyError``) is one line
and exit status 1: "run again" once that is over. With
``--json`` stdout holds exactly one JSON document; progress goes to stderr.
"""

import argparse
import json
import math
import os
import sys

from toolkit.errors import LedgerBusyError, NotReadyError, StorageError, ToolkitError
from toolkit.storage import FULL_OR_FAILING

COMMANDS = {}
# Exit status 1, "run again": the input was right, the storage or the moment was not.
RUN_AGAIN = (StorageError, NotReadyError, LedgerBusyError)


def command(name, help):
    """Register ``func(parser)`` that adds arguments and returns the handler."""
    def register(func):
        COMMANDS[name] = (help, func)
        return func
    return register


def emit(document, as_json, text):
    print(json.dumps(document, indent=2, sort_keys=True) if as_json else text)


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments (``--jobs x``, a missing flag) are the CLI rule's one line, exit 2:
    argparse's multi-line usage block stays for ``--help``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m toolkit",
        description="Interruption-safe batch document processing: drills, runs and audits.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=OneLineParser)
    for name, (help, add_arguments) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help, description=help)
        sub_parser.set_defaults(handler=add_arguments(sub_parser))
    return parser


def _tolerant_streams() -> None:
    """Text that is not encodable (a key with a lone surrogate, read from a JSONL ledger)
    is printed as its escape, ``\\ud800``, as JSON writes it, never a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv=None) -> int:
    _tolerant_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if not getattr(args.handler, "takes_signals", False):  # run, drill let them in themselves
            from toolkit.cli.signals import release_early

            release_early()  # held by __main__; a Ctrl-C held meanwhile raises here, in the try
        status = args.handler(args) or 0
        sys.stdout.flush()  # a reader that left fails here, inside the handling below
        return status
    except RUN_AGAIN as exc:  # not the input: fix it (or wait) and run again
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ToolkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (| head): not an error of ours, nothing to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush has nowhere to fail
        return 141  # as if SIGPIPE had ended us, as it ends other commands in a pipe
    except OSError as exc:  # one that no layer below named: the storage's (full) or the input's
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1 if exc.errno in FULL_OR_FAILING else 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def finite(flag: str, value):
    """``value`` unless it is NaN or infinite (argparse's ``float`` takes both).

    Raises:
        ToolkitError: one line naming ``flag``.
    """
    if value is not None and not math.isfinite(value):
        raise ToolkitError(f"{flag} must be a finite number, got {value!r}")
    return value


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width text table (no pandas needed for a few rows)."""
    widths = {c: max([len(c)] + [len(str(row[c])) for row in rows]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns),
             "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(str(row[c]).ljust(widths[c]) for c in columns) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


# Subcommand modules register themselves on import; their order is the --help order.
from toolkit.cli import acceptance, batch, drill, explore, inspect, ops, review, serve  # noqa: E402,F401,E501
