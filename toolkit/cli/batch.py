"""Making and running batches: fixtures, run."""

import contextlib
import os
import sys

from toolkit.cli import command, emit, finite
from toolkit.cli.run_summary import (emit_counts, ledger_counts, say_parked, say_refused,
                                     say_stopped, say_strays, say_unsettled)
from toolkit.errors import StorageError, ToolkitError


@command("fixtures", "Write a seeded corpus of healthy and poison PDFs (byte-identical per seed).")
def _fixtures(parser):
    parser.add_argument("dir", help="folder to write into (created if missing)")
    parser.add_argument("--docs", type=int, default=30, help="healthy documents (default 30)")
    parser.add_argument("--poison", type=int, default=3, help="poison files (default 3)")
    parser.add_argument("--long-docs", type=int, default=0,
                        help="long healthy documents, long-NNN.pdf (default 0)")
    parser.add_argument("--long-pages", type=int, default=6,
                        help="pages of each long document (default 6)")
    parser.add_argument("--scans", type=int, default=0,
                        help="scanned image-only documents, scan-NNN.pdf (default 0)")
    parser.add_argument("--mixed", type=int, default=0,
                        help="text + scanned (+ blank) page documents, mixed-NNN.pdf (default 0)")
    parser.add_argument("--scripts", type=int, default=0,
                        help="multi-script documents, script-NNN.pdf (default 0)")
    parser.add_argument("--seed", type=int, default=0)

    def run(args):
        from toolkit.documents import make_corpus

        if min(args.docs, args.poison, args.long_docs, args.scans, args.mixed, args.scripts) < 0:
            raise ToolkitError("--docs, --poison, --long-docs, --scans, --mixed and --scripts "
                               "must be >= 0")
        if args.long_pages < 1:
            raise ToolkitError("--long-pages must be >= 1")
        paths = make_corpus(args.dir, docs=args.docs, poison=args.poison, seed=args.seed,
                            long_docs=args.long_docs, long_pages=args.long_pages,
                            scans=args.scans, mixed=args.mixed, scripts=args.scripts)
        print(f"wrote {len(paths)} files ({args.docs} healthy, {args.long_docs} long, "
              f"{args.poison} poison, {args.scans} scans, {args.mixed} mixed, "
              f"{args.scripts} multi-script) to {args.dir}")
    return run


@command("run", "Run a batch: preflight, intent, submit, reconcile, fetch and verify. Safe to rerun "
                "after any crash.")
def _run(parser):
    parser.add_argument("--inputs", required=True, help="folder of input PDFs")
    parser.add_argument("--ledger", required=True, help="client ledger (.sqlite, .db, .jsonl)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--provider-db", help="the fake provider's SQLite file (in-process)")
    where.add_argument("--provider-url", help="a serve-provider service, http://127.0.0.1:PORT")
    parser.add_argument("--out", required=True, help="folder for verified artifacts")
    parser.add_argument("--strategy", default="safe",
                        help="a named strategy (safe, blind-retry, ...) or module:Class, your own "
                             "toolkit.runner.Pipeline; --workers N runs it as a pool of N")
    parser.add_argument("--contract", default=None,
                        help="provider contract, e.g. idempotent (default), non-idempotent, "
                             "idempotent,lag=2; with --provider-url the service states it")
    parser.add_argument("--read-timeout", type=float, default=30.0,
                        help="with --provider-url: seconds to wait for a reply (default 30)")
    parser.add_argument("--transient-rate", type=float, default=None,
                        help="share of submits the provider rejects with a transient error")
    parser.add_argument("--seed", type=int, default=0, help="seeds the provider and the backoff")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--workers", type=int, default=None,
                        help="run N worker processes, each with its own ledger connection "
                             "(an SQLite file or a postgresql:// URL)")
    parser.add_argument("--page-by-page-from", type=int, default=None, metavar="PAGES",
                        help="documents with at least PAGES pages are sent page by page, "
                             "checkpointed after each page and resumed at the next one")
    parser.add_argument("--verify", action="store_true",
                        help="hash every done item's artifact and read every input in full "
                             "(SHA-256), even those whose size, mtime, ctime and inode are the "
                             "ones recorded")
    parser.add_argument("--new-batch", action="store_true",
                        help="start another batch on inputs another ledger has run (a new "
                             "--ledger is refused for them otherwise)")

    def run(args):
        from toolkit.cli.signals import stopping_on_signals

        # From the run's first step: a signal during the setup (the ledger judged, the
        # witness recorded) stops it before its first chunk, as one mid-batch does.
        with stopping_on_signals() as stop:
            try:
                return _run(args, stop)
            except StorageError as exc:  # the ledger or provider cannot even be opened
                from toolkit.runner.ops import mark_unhealthy

                mark_unhealthy(args.ledger, str(exc))  # fail closed
                raise
    run.takes_signals = True  # cli.main leaves them held until ``stopping_on_signals``

    def _run(args, stop):
        import dataclasses

        from toolkit.cli.signals import to_runner
        from toolkit.provider import parse_contract, provider_at
        from toolkit.runner import RetryPolicy, StopAsked
        from toolkit.runner.registry import open_run_ledger, open_strategy, resolve_strategy

        from toolkit.runner.inputs import check_batch_paths

        resolve_strategy(args.strategy)  # a bad reference is one line, before any work
        finite("--read-timeout", args.read_timeout)
        finite("--transient-rate", args.transient_rate)
        inputs = check_batch_paths(args)
        paging = {}
        if args.page_by_page_from is not None:
            if args.page_by_page_from < 1:
                raise ToolkitError("--page-by-page-from must be >= 1")
            if not getattr(resolve_strategy(args.strategy), "sends_pages", False):
                raise ToolkitError(f"--strategy {args.strategy} does not send long documents "
                                   "page by page")
            paging["page_by_page_from"] = args.page_by_page_from
        if args.verify:  # only then: a user's own pipeline class need not know the option
            paging["verify"] = True
        if args.workers is not None:
            from toolkit.runner.workers import check_workers

            check_workers(args.ledger, args.workers, args.strategy, args.page_by_page_from)
        if not args.provider_url:
            contract = parse_contract(args.contract or "idempotent")
            changes = {"seed": args.seed}
            if args.transient_rate is not None:
                if not 0.0 <= args.transient_rate <= 1.0:
                    raise ToolkitError("--transient-rate must be within [0, 1]")
                changes["transient_rate"] = args.transient_rate
            contract = dataclasses.replace(contract, **changes)
        # Order: a refused run leaves the folder as it found it. What creates nothing comes
        # first (the checks above, the service's contract); then an existing ledger, opened
        # and judged (not ours, corrupt lines, not ready) before the provider's database is
        # created; a new ledger (no file, or an empty one) only once the provider is open,
        # its place checked by stat first, so neither refusal leaves the other's file.
        with contextlib.ExitStack() as undo:  # closes what is open if a later step refuses
            def opened(thing):
                if thing is not None:
                    undo.callback(thing.close)
                return thing

            provider = opened(_service(args)) if args.provider_url else None
            from toolkit.runner import witness, witness_progress

            # A ledger the witness in --out knows and that is gone is made anew, marked as
            # salvaged (JSONL), before anything opens it; an SQLite one is refused, naming
            # `ledger L --salvage NEW` (witness.replace_missing).
            witness.replace_missing(args.out, args.ledger)
            existing = _existing_ledger(args)  # else its place is checked, by stat alone
            from toolkit.runner import batches

            if not existing:  # refused if another ledger has run these inputs; else ours
                batches.claim(args.inputs, args.ledger, refuse=not args.new_batch)
            ledger = opened(open_run_ledger(args.strategy, args.ledger)) if existing else None
            if provider is None:
                provider = opened(provider_at(args.provider_db, contract))
            if not existing:
                ledger = opened(open_run_ledger(args.strategy, args.ledger))
            # Before anything is sent: an older copy, a copy, another ledger is refused
            # (exit 2); else the ledger's identity and seq are recorded in --out.
            seen = witness.check(args.out, ledger) if ledger is not None else None
            if existing:  # accepted: a new one elsewhere is refused (a new one: claimed)
                batches.remember(args.inputs, args.ledger)
            if args.workers is not None:
                if ledger is not None:
                    ledger.close()  # judged; each worker opens its own
                undo.pop_all()
                return _run_workers(args, inputs, provider, seen, stop)
            # The witness learns the run's progress at its intents (the first, then every
            # ~2 s), each after the intent's fsync: a run killed leaves more than its start.
            if isinstance(seen, dict):
                paging["hook"] = witness_progress.Progress(seen["outs"], ledger=ledger)
            runner = open_strategy(args.strategy, args.ledger if ledger is None else ledger,
                                   provider, args.out, policy=RetryPolicy(seed=args.seed),
                                   **paging, progress=not (args.json or args.no_progress))
            undo.pop_all()  # the runner closes the ledger; the provider is closed below
        stopped = None
        try:
            stop.attach(to_runner(runner))  # a stop asked during the setup: before any chunk
            counts = runner.run(inputs)
        except StopAsked as asked:  # at a step's end, no lease held: nothing to undo
            stopped = str(asked)
        finally:  # the seq it reached, even when halted (its path replaced, removed)
            try:
                if runner.halted:  # before the end's record: it may learn this move too
                    witness_progress.record_unsent(runner.ledger, paging.get("hook"),
                                                   runner.worker)
                witness.record_end(args.out, seen, runner.ledger)
            finally:
                if runner.halted:  # read while the ledger is open (ledger_counts)
                    counts = ledger_counts(runner.ledger)
                runner.close()
        provider.close()
        if stopped is not None:
            return say_stopped(stopped)
        if not runner.halted:  # damaged by hand under the run: never a word of rest
            from toolkit.runner.ops import pages_at_end

            pages_at_end(args.ledger)
        # Strays (items of the ledger whose input is gone) are counted too, so the summary
        # matches `ledger`: a `pending=1` there is never missing here.
        for item in runner.strays if counts is not None else ():
            counts[item.state.value] += 1
        emit_counts(counts, runner.strays, args.json, len(runner.refused_options))
        if runner.halted:
            print(f"halted, no new work taken: {runner.halted}", file=sys.stderr)
            if runner.health_recorded is False:
                print("the halt could not be recorded as the ledger's health", file=sys.stderr)
            return 2 if runner.halted_damaged else 1  # damaged: the way out is in its line
        from toolkit.roots import shown  # a name with a newline stays on its one line

        for name, first in runner.aliases:
            name, first = shown(name), shown(first)
            print(f"{name}: same content as {first}: one item, recorded under {first}",
                  file=sys.stderr)
        for error in dict.fromkeys(runner.local_errors):
            print(error, file=sys.stderr)
        if runner.refused_options:  # content the ledger holds under other options: bad input
            say_refused(list(runner.refused_options.values()))
            return 2
        if runner.unsettled or runner.strays:  # each said: run again, or put back or cancel
            if runner.unsettled:
                say_unsettled(runner.unsettled, runner.held)
            if runner.strays:  # never claim rest while older items are left behind
                say_strays(args, runner.strays)
            return 1
        if runner.local_errors:  # done items whose artifact is not under --out yet
            print("some artifacts are not in --out: clear the way and run again",
                  file=sys.stderr)
            return 1
        say_parked(args.ledger, (counts or {}).get("needs_review", 0))
        return 0
    return run


def _existing_ledger(args) -> bool:
    """True for a ledger with something in it (a URL, rewrite-state's file: always): it is
    opened and judged before the provider's database is created. A new one (no file, or an empty one) is created only
    after the provider; its place (suffix, folder) is checked now, by stat: nothing opened."""
    from pathlib import Path

    from toolkit.runner.naive import RewriteState
    from toolkit.runner.ops import require_ledger_path
    from toolkit.runner.registry import resolve_strategy

    if "://" in str(args.ledger) or resolve_strategy(args.strategy) is RewriteState:
        return True  # a URL; or rewrite-state's own .json, judged by its suffix alone
    try:
        if os.stat(args.ledger).st_size > 0:
            return True
    except OSError:
        pass
    require_ledger_path(Path(args.ledger))
    return False


def _service(args):
    """The provider service at ``--provider-url``; its contract is the one it states."""
    import dataclasses

    from toolkit.provider import parse_contract
    from toolkit.provider.client import HttpProvider

    if args.transient_rate is not None:
        raise ToolkitError("--transient-rate applies to --provider-db; start the service with "
                           "the contract you want")
    if args.read_timeout <= 0:
        raise ToolkitError("--read-timeout must be > 0")
    provider = HttpProvider(args.provider_url, read_timeout=args.read_timeout)
    stated = provider.contract
    if args.contract is not None and \
            dataclasses.replace(parse_contract(args.contract), seed=stated.seed) != stated:
        provider.close()
        raise ToolkitError(f"--contract {args.contract} differs from the service's contract "
                           f"{stated.describe()}")
    return provider


def _run_workers(args, inputs, provider, seen, stop):
    """``--workers N``: N processes, each opening its own ledger connection and provider,
    each recording the ledger's progress in the witness (``seen``: ``witness.check``'s).
    A stop (``stop``: the signals') goes to each worker, which stops at its step's end."""
    from toolkit.runner import RetryPolicy
    from toolkit.runner.witness_progress import Progress
    from toolkit.runner.workers import run_workers

    contract = provider.contract
    provider.close()  # each worker opens its own
    try:
        result = run_workers(args.ledger, args.provider_db, inputs, args.out, args.workers,
                             contract, provider_url=args.provider_url,
                             read_timeout=args.read_timeout,
                             strategy=args.strategy, policy=RetryPolicy(seed=args.seed),
                             page_by_page_from=args.page_by_page_from, verify=args.verify,
                             hook=Progress(seen["outs"], path=os.fspath(args.ledger))
                             if isinstance(seen, dict) and seen["kind"] == "sqlite" else None,
                             stop=stop)
    finally:
        _witness_end(args)
    if stop.asked is not None and not result.errors and not result.halted and \
            (result.stopped or len(result.workers) < args.workers):  # else it ended first
        return say_stopped(stop.asked)
    counts = result.counts if not result.damaged else None  # a damaged ledger's: no count
    refused = f", refused={len(result.refused)}" if result.refused else ""
    if counts is None:  # as emit_counts says it after a single run's halt
        items, text = None, (f"(items unknown: the ledger is "
                             f"{'damaged' if result.damaged else 'not readable after the workers'}"
                             f", workers={args.workers})")
    else:
        items = sum(counts.values())
        text = "  ".join(f"{state}={n}" for state, n in counts.items() if n) + \
            f"  (items={items}, workers={args.workers}{refused})"
    emit({"items": items, "by_state": counts, "workers": args.workers,
          "refused": len(result.refused)}, args.json, text)
    for error in result.errors:
        print(f"a worker failed: {error}", file=sys.stderr)
    for reason in dict.fromkeys(result.halted):  # two workers halted alike: said once
        print(f"halted, no new work taken: {reason}", file=sys.stderr)
    if result.halted and result.health_recorded is False:
        print("the halt could not be recorded as the ledger's health: the ledger is unreachable",
              file=sys.stderr)
    if result.damage is not None:  # its pages, read after the workers: the way out in it
        print(f"error: {result.damage}", file=sys.stderr)
    if result.damaged:  # the halt's line names the way out (salvage)
        return 2
    if result.errors or result.halted or result.counts is None:
        return 1
    if result.refused:  # content the ledger holds under other options: bad input
        say_refused(result.refused)
        return 2
    if result.unsettled:
        say_unsettled(result.unsettled, result.held)
        return 1
    say_parked(args.ledger, counts.get("needs_review", 0))
    return 0


def _witness_end(args) -> None:
    """After ``--workers``: the seq the workers took the ledger to, in --out's witness."""
    from toolkit.errors import LedgerError
    from toolkit.ledger import open_ledger
    from toolkit.runner import witness

    with contextlib.suppress(LedgerError, OSError):  # unreachable now: the start's entry stays
        ledger = open_ledger(args.ledger)
        try:
            witness.record_end(args.out, True, ledger)
        finally:
            ledger.close()
