"""The SQLite ledger's audit with SQLite doing the checking (``forensics/sqlfold.py``)
against the reference replay of every event in Python (``lines.FAST = False``)."""

import json
import random
import sqlite3
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.forensics import audit, lines, sqlfold
from toolkit.forensics.sqlrows import detail_reader
from toolkit.ledger.sqlite import SCHEMA
from toolkit.ledger.transitions import TRANSITIONS

from test_forensics_fast import _same

MOVES = {frm.value: sorted(to.value for to in tos) for frm, tos in TRANSITIONS.items()}
STATES = sorted(MOVES)
ODD_DETAILS = ["not json", "[1]", '{"n": NaN}', '{"d": [[[1]]]}', b'{"reason": "blob"}', "",
               '{"a": 1}\x00', ' {"reason": "x"}', '{"digest": "a", "digest": "b"}',
               '{"digest": "\\u00e9"}', '{"failure": "transient", "failure": "permanent"}']


def _detail(rng, to):
    """What the ledger writes with a move into ``to`` (sometimes less)."""
    if to == "failed":
        return {"failure": rng.choice(["transient", "permanent", None]), "reason": "HTTP 503"}
    if to == "done" and rng.random() < 0.9:
        return {"artifact_path": "out/a.pdf", "artifact_size": 3, "artifact_sha256": "0" * 64}
    return {}


def _history(rng, key):
    """One key's events (op, frm, to, detail), a legal walk, then maybe damaged."""
    events = [("add", None, "pending", {"source": f"{key}.pdf", "digest": f"d-{key}"})]
    state = "pending"
    for _ in range(rng.randrange(6)):
        if not MOVES[state]:
            break
        if rng.random() < 0.1:
            events.append((rng.choice(["claim", "release"]), state, state, {"lease_owner": "w"}))
        to = rng.choice(MOVES[state])
        events.append(("move", state, to, _detail(rng, to)))
        state = to
    damage = rng.random()
    if damage < 0.08:
        del events[0]  # its add is missing
    elif damage < 0.16:
        at = rng.randrange(len(events))
        op, frm, _, detail = events[at]
        events[at] = (op, frm, rng.choice(STATES), detail)  # an illegal move, maybe
    elif damage < 0.22:
        events.insert(rng.randrange(1, len(events) + 1), events[0])  # a second add
    elif damage < 0.30:
        at = rng.randrange(len(events))
        events[at] = (*events[at][:3], rng.choice(ODD_DETAILS))  # a detail json may refuse
    elif damage < 0.34:
        at = rng.randrange(len(events))
        events[at] = ("bogus", *events[at][1:])  # not an op
    return events, state


def _begin_ledger(path):
    """A connection to a new ledger at ``path`` with its tables made, inside one BEGIN
    (the rows a test writes then cost one commit, not one fsync per row)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    for statement in SCHEMA.strip().split(";"):
        if statement.strip():
            db.execute(statement)
    return db


def write_ledger(path, seed):
    """A toolkit SQLite ledger of a few keys with random (seeded) histories, interleaved,
    some damaged; its items rows mostly agree with the events, some do not."""
    rng = random.Random(seed)
    db = _begin_ledger(path)
    stories = {f"k{n}": _history(rng, f"k{n}") for n in range(rng.randrange(1, 7))}
    queues = {key: list(events) for key, (events, _) in stories.items() if events}
    rows = []
    while queues:
        key = rng.choice(sorted(queues))
        op, frm, to, detail = queues[key].pop(0)
        if not queues[key]:
            del queues[key]
        text = detail if not isinstance(detail, dict) else json.dumps(detail)
        attempt = "x" if rng.random() < 0.02 else 1  # a wrong type, now and then
        # a token no packed integer holds (sqlevents.WORD), now and then: still an event
        token = rng.choice([-1, 2**40]) if rng.random() < 0.02 else 0
        rows.append((1.0 + len(rows), op, key, frm, to, attempt, None, token, text))
    db.executemany('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, '
                   "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    for key, (_, state) in stories.items():
        roll = rng.random()
        if roll < 0.1:
            continue  # no item row
        if roll < 0.2:
            state = rng.choice(STATES)  # a row that may disagree with its events
        db.execute("INSERT INTO items (key, state, source, attempt, token, updated) "
                   "VALUES (?, ?, ?, 1, 0, 1.0)", (key, state, f"{key}.pdf"))
    if rng.random() < 0.2:
        db.execute("INSERT INTO items (key, state, attempt, token, updated) "
                   "VALUES ('stray', 'done', 1, 0, 1.0)")  # an item without events
    db.execute("COMMIT")
    db.close()


def _both(path):
    with mock.patch.object(sqlfold, "scan", wraps=sqlfold.scan) as scan:
        fast = audit(path, now=0.0)
    assert scan.called  # the SQL path read it, not the fallback
    with mock.patch.object(lines, "FAST", False):
        reference = audit(path, now=0.0)
    return fast, reference


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1))
def test_sql_checked_audit_equals_the_python_replay_on_damaged_histories(tmp_path, seed):
    """Fault: seeded random histories with a missing add, an illegal move, a second add, a
    detail json refuses or SQLite would misread (NaN, nested, NUL, duplicate names,
    escapes, BLOB), an unknown op, a wrongly typed column, an item row that disagrees with
    its events or is missing. Property: the report (anomalies with their words, per-item
    actions, items and events frames) is exactly the full Python replay's."""
    path = tmp_path / f"{seed}.sqlite"
    write_ledger(path, seed)
    fast, reference = _both(path)
    _same(fast, reference)


def test_sql_checked_audit_replays_only_the_keys_with_anomalies(tmp_path):
    """Fault: one illegal move among a hundred clean histories (a retried transient
    failure included). Property: the findings are the reference's, and the only key Python
    replays is the damaged one: not the other 98, nor the failed item's retry (the fold
    tracks the failure each detail sets and asks the policy itself)."""
    path = tmp_path / "ledger.sqlite"
    db = _begin_ledger(path)
    done = {"artifact_path": "out/a.pdf", "artifact_size": 3, "artifact_sha256": "0" * 64}
    clean = [("add", None, "pending", {"source": "a.pdf"}), ("move", "pending", "unknown", {}),
             ("move", "unknown", "submitted", {}), ("move", "submitted", "done", done)]
    retried = clean[:2] + [("move", "unknown", "failed", {"failure": "transient"}),
                           ("move", "failed", "unknown", {})]
    histories = {f"k{n:03d}": clean for n in range(99)}
    histories["retry"] = retried
    histories["k050"] = clean[:2] + [("move", "submitted", "done", done)]  # from the wrong state
    for key, events in histories.items():
        for op, frm, to, detail in events:
            db.execute('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, '
                       "detail) VALUES (1.0, ?, ?, ?, ?, 1, NULL, 0, ?)",
                       (op, key, frm, to, json.dumps(detail)))
        db.execute("INSERT INTO items (key, state, attempt, token, updated) "
                   "VALUES (?, ?, 1, 0, 1.0)", (key, events[-1][2]))
    db.execute("COMMIT")
    db.close()
    fast, reference = _both(path)
    _same(fast, reference)
    # (items rows carry no artifact; the retried item is left unknown)
    history = [(a.key, a.kind) for a in fast.anomalies
               if a.kind not in ("done_without_artifact", "stuck_unknown")]
    assert history == [("k050", "illegal_transition")]
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        _, state, _ = sqlfold.scan(db, lambda text: (json.loads(text), None))
    assert {key for key, last in state.items() if last is sqlfold.SLOW} == {"k050"}


def test_quiet_moves_come_from_the_transition_policy():
    """Fault: none; the moves SQLite lets through unreplayed. Property: they are the
    policy's plain moves plus the moves into done (whose only complaint, a missing
    artifact field, is the item row's done_without_artifact), and never failed -> unknown
    or pending -> failed (judged by the item's failure). failed -> cancelled is legal from
    any failure (a person closes a permanent one: ``resolve --cancel``), so it is quiet."""
    from toolkit.forensics.history import PLAIN_MOVES, VOCABULARY

    extra = {VOCABULARY[code][1:] for code in sqlfold.QUIET_MOVES - PLAIN_MOVES}
    assert extra == {(frm, "done") for frm in ("unknown", "submitted", "done", "needs_review")}
    judged = {VOCABULARY[code][1:] for code in range(len(VOCABULARY))
              if VOCABULARY[code][0] == "move" and code not in sqlfold.QUIET_MOVES}
    assert {("failed", "unknown"), ("pending", "failed")} <= judged
    assert ("failed", "cancelled") not in judged


FAILURES = ["transient", "permanent", None, "", 1, True, 1.5, ["transient"], {"f": 1}]


def write_failure_ledger(path, seed):
    """Legal-looking histories (retries of failures included) whose events' details set
    ``failure`` now and then, on any op, to a word or a value of another type."""
    rng = random.Random(seed)
    db = _begin_ledger(path)
    rows = []
    for n in range(rng.randrange(1, 6)):
        key, state = f"k{n}", None
        for _ in range(rng.randrange(1, 8)):
            if state is None:
                op, to = "add", "pending"
            elif rng.random() < 0.2:
                op, to = rng.choice(["claim", "release"]), state
            elif MOVES[state]:
                op, to = "move", rng.choice(MOVES[state] + ["failed", "unknown"])
            else:
                break
            detail = _detail(rng, to) if op == "move" else {}
            if rng.random() < 0.4:
                detail["failure"] = rng.choice(FAILURES)
            rows.append((key, op, state, to, json.dumps(detail)))
            state = to
    slots = [row[0] for row in rows]
    rng.shuffle(slots)  # the keys interleaved, each key's own events in order
    queues = {}
    for row in rows:
        queues.setdefault(row[0], []).append(row)
    written = [queues[key].pop(0) for key in slots]
    db.executemany('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, '
                   "detail) VALUES (1.0, ?, ?, ?, ?, 1, NULL, 0, ?)",
                   [(op, key, frm, to, text) for key, op, frm, to, text in written])
    last = {row[0]: row[3] for row in rows}
    db.executemany("INSERT INTO items (key, state, attempt, token, updated) "
                   "VALUES (?, ?, 1, 0, 1.0)", last.items())
    db.execute("COMMIT")
    db.close()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1))
def test_folded_failures_give_the_python_replay_verdicts(tmp_path, seed):
    """Fault: a detail that sets ``failure`` on any event (an add, a claim, a move), to a
    policy word, null, an empty text, a number, a bool, a list or an object, before a
    retry out of failed or a pending -> failed. Property: the report the lean fold gives
    (which judges those moves itself from the failure each detail set) is exactly the
    full Python replay's."""
    path = tmp_path / f"{seed}.sqlite"
    path.unlink(missing_ok=True)  # hypothesis may try a seed twice in one tmp_path
    write_failure_ledger(path, seed)
    fast, reference = _both(path)
    _same(fast, reference)


def test_a_failure_set_by_a_claim_or_a_release_decides_the_retry(tmp_path):
    """Fault: a claim (or release) whose detail changes a failed item's failure before its
    retry: permanent made transient (the retry is legal), transient made permanent or
    unclassified (illegal). Property: the fold's verdicts are the replay's, and only the
    keys whose retry is illegal are replayed."""
    path = tmp_path / "ledger.sqlite"
    db = _begin_ledger(path)
    cases = {"made-transient": ("permanent", "claim", "transient"),
             "made-permanent": ("transient", "release", "permanent"),
             "made-unclassified": ("transient", "claim", None),
             "kept": ("transient", "claim", "absent")}
    for key, (first, op, then) in cases.items():
        middle = {} if then == "absent" else {"failure": then}
        for event in (("add", None, "pending", {"source": f"{key}.pdf"}),
                      ("move", "pending", "unknown", {}),
                      ("move", "unknown", "failed", {"failure": first}),
                      (op, "failed", "failed", middle), ("move", "failed", "unknown", {})):
            db.execute('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, '
                       "detail) VALUES (1.0, ?, ?, ?, ?, 1, NULL, 0, ?)",
                       (event[0], key, event[1], event[2], json.dumps(event[3])))
        db.execute("INSERT INTO items (key, state, attempt, token, updated) "
                   "VALUES (?, 'unknown', 1, 0, 1.0)", (key,))
    db.execute("COMMIT")
    db.close()
    fast, reference = _both(path)
    _same(fast, reference)
    illegal = sorted(a.key for a in fast.anomalies if a.kind == "illegal_transition")
    assert illegal == ["made-permanent", "made-unclassified"]
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        _, state, _ = sqlfold.scan(db, lambda text: (json.loads(text), None))
    assert {key for key, last in state.items() if last is sqlfold.SLOW} == set(illegal)


def test_sql_move_code_is_the_vocabulary_lookup_of_the_values_python_reads():
    """Fault: an events table whose op/frm/to columns are declared NOCASE or without a type,
    holding words in other cases, BLOBs, numbers, NULLs, unknown words and words with a
    NUL or a space. Property: the code SQLite computes for each row (``sqlfold.CODE``) is
    exactly ``CODES.get((op, frm, to), -1)`` of the values sqlite3 hands Python."""
    from toolkit.forensics.history import CODES

    db = sqlite3.connect(":memory:")
    db.execute('CREATE TABLE events (op TEXT COLLATE NOCASE, frm, "to" TEXT COLLATE NOCASE)')
    words = ["add", "move", "claim", "release", "ADD", "Move", "bogus", "move\x00", "move ",
             b"move", 1, 2.5, None, "pending", "PENDING", "done", b"done", "unknown", "paused",
             "needs_review", "partial", "cancelled", "failed", "submitted"]
    rng = random.Random(5)
    rows = [(rng.choice(words), rng.choice(words), rng.choice(words)) for _ in range(3000)]
    rows += [(op, frm, to) for op, frm, to in CODES]  # every known move at least once
    db.executemany('INSERT INTO events VALUES (?, ?, ?)', rows)
    read = db.execute(f'SELECT op, frm, "to", {sqlfold.CODE} FROM events').fetchall()
    assert len(read) == len(rows)
    for op, frm, to, code in read:
        assert code == CODES.get((op, frm, to), -1), (op, frm, to)
    assert {code for *_, code in read} >= set(CODES.values())


def _odd_ledger(path, op_type: str):
    """A ledger whose events table declares op, frm and to ``op_type`` (a collation or no
    type), with clean histories, one written in capitals, one with a BLOB op, and details
    with brackets inside strings, nested past SHALLOW, and nested past any parser."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    for statement in SCHEMA.strip().split(";"):
        if statement.strip() and "CREATE TABLE IF NOT EXISTS events" not in statement:
            db.execute(statement)
    db.execute(f'CREATE TABLE events (seq INTEGER PRIMARY KEY, ts REAL NOT NULL, op {op_type}, '
               f'key TEXT NOT NULL, frm {op_type}, "to" {op_type}, attempt INTEGER NOT NULL, '
               "worker TEXT, token INTEGER NOT NULL, detail TEXT NOT NULL)")
    done = json.dumps({"artifact_path": "out/a.pdf", "artifact_size": 3,
                       "artifact_sha256": "0" * 64})
    details = {"plain": "{}", "brackets": json.dumps({"reason": "[{" * 80}),
               "nested": json.dumps({"reason": [[[[[[1]]]]]] * 20}),
               "deep": '{"d": ' + "[" * 70 + "]" * 70 + "}",
               "deeper": '{"d": ' + "[" * 5000 + "]" * 5000 + "}"}
    for n, (name, text) in enumerate(details.items()):
        for key, ops in ((f"{name}", ("add", "move", "move", "move")),
                         (f"{name}-caps", ("ADD", "MOVE", "move", "move")),
                         (f"{name}-blob", ("add", b"move", "move", "move"))):
            events = [(ops[0], None, "pending", json.dumps({"digest": f"d-{key}"})),
                      (ops[1], "pending", "unknown", text),
                      (ops[2], "unknown", "submitted", "{}"),
                      (ops[3], "submitted", "done", done)]
            for op, frm, to, detail in events:
                db.execute('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, '
                           "token, detail) VALUES (1.0, ?, ?, ?, ?, 1, NULL, 0, ?)",
                           (op, key, frm, to, detail))
            db.execute("INSERT INTO items (key, state, attempt, token, updated) "
                       "VALUES (?, 'done', 1, 0, 1.0)", (key,))
    db.execute("COMMIT")
    db.close()


def test_odd_column_declarations_and_bracketed_details_audit_as_the_python_replay(tmp_path):
    """Fault: events columns declared NOCASE (or with no type) holding "ADD"/"MOVE" and a
    BLOB op, and details with 160 brackets inside a string, nested lists, nesting past
    SHALLOW and nesting no parser takes. Property: the report of the lean fold (SQL's move
    codes, the details decoded a batch at a time) is exactly the full Python replay's;
    the keys with capitals, a BLOB op or the unparseable detail are the ones replayed."""
    for op_type in ("TEXT COLLATE NOCASE", ""):
        path = tmp_path / f"odd-{len(op_type)}.sqlite"
        _odd_ledger(path, op_type)
        fast, reference = _both(path)
        _same(fast, reference)
        reader = detail_reader()
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            _, state, _ = sqlfold.scan(db, reader, reader.many)
        slow = {key for key, last in state.items() if last is sqlfold.SLOW}
        assert {key for key in slow if not key.endswith(("-caps", "-blob"))} == {"deeper"}
        assert {key for key in state if key.endswith(("-caps", "-blob"))} <= slow
