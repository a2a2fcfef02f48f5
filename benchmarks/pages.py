"""Section 8: a long document page by page -- what checkpoints cost, what resuming saves.

One document of ``cfg.long_pages`` pages, real PDF work, SQLite ledger, the
fake provider under a non-idempotent contract (every submit bills):

* as one request, then page by page with a checkpoint per page (the same
  document, timed back to back in each repetition);
* killed (a ``BaseException`` no handler catches, as in the drills) right
  after page ``3/4 * pages`` was checkpointed, then rerun by the safe runner
  (resume at the next page) and by ``restart-long-docs`` (page 1 again).
  Only the rerun is timed; its page executions are counted at the provider.
"""

import shutil
from pathlib import Path

from measure import Figure, Row, interleave, ratio
from sections import log


class _Killed(BaseException):
    """The process dies here."""


def long_documents(cfg, folder: Path) -> list[Row]:
    import time

    from toolkit.documents import make_corpus
    from toolkit.ledger import open_ledger
    from toolkit.provider import Contract, FakeProvider
    from toolkit.runner import RetryPolicy, Runner
    from toolkit.runner.naive import RestartLongDocs

    pages = cfg.long_pages
    crash_at = pages * 3 // 4
    inputs = make_corpus(folder / "long", docs=0, poison=0, long_docs=1, long_pages=pages)
    count, billed = [0], {"resume": [], "restart": []}

    def die_after_checkpoint(point, key, **context):
        if point == "after_checkpoint" and context["page"] == crash_at:
            raise _Killed()

    def batch(work, strategy=Runner, paged=True, hook=None):
        provider = FakeProvider(work / "provider.sqlite", work / "provider",
                                Contract(idempotent_keys=False))
        runner = strategy(open_ledger(work / "ledger.sqlite"), provider, work / "out",
                          policy=RetryPolicy(base_delay=0.0), hook=hook,
                          page_by_page_from=pages if paged else None)
        started = time.perf_counter()
        try:
            counts = runner.run(inputs)
        except _Killed:
            counts = None
        finally:
            seconds = time.perf_counter() - started
            runner.close()
            executions = provider.stats()["executions"]
            provider.close()
        return seconds, counts, executions

    def fresh():
        count[0] += 1
        return folder / f"long-{count[0]}"

    def whole(paged):
        def go():
            work = fresh()
            try:
                seconds, counts, _ = batch(work, paged=paged)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            assert counts["done"] == 1, counts
            return seconds
        return go

    def rerun(name, strategy):
        def go():
            work = fresh()
            try:
                _, died, before = batch(work, hook=die_after_checkpoint)  # untimed
                seconds, counts, after = batch(work, strategy)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            assert died is None and counts["done"] == 1, counts
            billed[name].append(after - before)  # executions of the rerun alone
            return seconds
        return go

    log(f"8 a {pages}-page document: one request vs page by page; resume vs restart")
    r = interleave(cfg.heavy_reps, {"whole": whole(False), "paged": whole(True),
                                    "resume": rerun("resume", Runner),
                                    "restart": rerun("restart", RestartLongDocs)})
    shutil.rmtree(folder / "long", ignore_errors=True)
    return [Row("8", f"{pages}-page document as one request (SQLite ledger, real PDF work)",
                Figure(r["whole"], "s")),
            Row("8", "  same document page by page, one checkpoint per page", Figure(r["paged"], "s")),
            Row("8", "  ratio page by page / one request", ratio(r["paged"], r["whole"])),
            Row("8", f"killed after page {crash_at}: the rerun resumes at page {crash_at + 1}",
                Figure(r["resume"], "s")),
            Row("8", "  same kill, rerun by restart-long-docs (page 1 again)",
                Figure(r["restart"], "s")),
            Row("8", "  ratio restart / resume (time of the rerun)",
                ratio(r["restart"], r["resume"])),
            Row("8", "  pages billed by the rerun: resume", Figure(billed["resume"], "")),
            Row("8", "  pages billed by the rerun: restart-long-docs",
                Figure(billed["restart"], ""))]
