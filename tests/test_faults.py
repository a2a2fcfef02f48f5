"""Injected faults behave like the real thing: crashes stop everything, torn writes tear."""

import pytest

from toolkit.errors import LedgerError
from toolkit.faults import FAULTS, Crash, Injector, fill_disk, tear_jsonl_writes
from toolkit.ledger import State, open_ledger


def test_crash_is_not_caught_by_except_exception():
    def careless_code():
        try:
            Injector(["crash_after_intent"])("after_intent", "k")
        except Exception:  # noqa: BLE001 - this is what careless code does
            return "swallowed"
        return "went on"

    with pytest.raises(Crash):
        careless_code()


def test_injector_fires_on_the_nth_arrival_only_and_records_it():
    injector = Injector(["crash_after_second_intent"])
    injector("after_intent", "a")  # first arrival: nothing
    with pytest.raises(Crash):
        injector("after_intent", "b")
    injector("after_intent", "c")  # fired once only
    assert injector.fired == [("crash_after_second_intent", "b")]


def test_lost_reply_is_a_timeout_and_half_download_cuts_the_file(tmp_path):
    with pytest.raises(TimeoutError):
        Injector(["lost_reply"])("after_submit", "k", job=None)
    part = tmp_path / "a.part"
    part.write_bytes(b"x" * 1000)
    Injector(["half_download"])("during_fetch", "k", path=part)
    assert part.stat().st_size == 500


def test_unknown_fault_name_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        Injector(["cosmic_ray"])


def test_torn_jsonl_write_leaves_half_a_line_that_the_next_open_ignores_and_cuts(tmp_path):
    path = tmp_path / "l.jsonl"
    ledger = tear_jsonl_writes(open_ledger(path), nth=3)
    ledger.add("a")
    ledger.add("b")
    with pytest.raises(Crash):
        ledger.move("a", State.PENDING, State.UNKNOWN)
    ledger.close()
    assert not path.read_bytes().endswith(b"\n")  # half a line really is on disk
    with open_ledger(path) as reopened:
        assert reopened.torn_tail is not None and reopened.get("a").state is State.PENDING
        reopened.move("a", State.PENDING, State.UNKNOWN)
    with open_ledger(path) as again:
        assert again.torn_tail is None and again.corrupt_lines == []


def test_full_disk_fails_every_write_after_the_first_ones_and_changes_nothing(ledger):
    fill_disk(ledger, after=1)
    ledger.add("a")
    with pytest.raises(LedgerError, match="No space left"):
        ledger.move("a", State.PENDING, State.UNKNOWN)
    assert ledger.get("a").state is State.PENDING and len(ledger.events()) == 1


def test_every_fault_names_a_point_the_runner_or_a_naive_strategy_reaches():
    from toolkit.runner import HOOK_POINTS

    from toolkit.faults import PROVIDER_POINTS

    reached = set(HOOK_POINTS) | {"during_state_write"} | set(PROVIDER_POINTS)
    assert {fault.point for fault in FAULTS.values()} <= reached
