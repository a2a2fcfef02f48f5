"""Adapters for the databases real queue and task libraries write.

- ``litequeue``: a ``LiteQueue`` table (``data, message_id, status, in_time,
  lock_time, done_time``); status READY 0 / LOCKED 1 / DONE 2 / FAILED 3.
- ``persist-queue``: a ``SQLiteAckQueue`` table ``ack_queue_<name>`` (``_id,
  data, timestamp, status``); status inited 0 / ready 1 / unack 2 / acked 5 /
  ack_failed 9.
- ``celery-db``: Celery's database result backend, table ``celery_taskmeta``
  (``task_id, status, result, date_done, traceback``, and with
  ``result_extended`` ``name, args, kwargs, worker, retries``).

A message a worker took and never finished (LOCKED, unack, STARTED) is our
``unknown``: the worker may have done the work before it died. These files are
read with SQL through the read-only connection of ``sqlite.read_database``,
never through the libraries: persist-queue's ``auto_resume`` turns every
``unack`` row back into ``ready`` on open, erasing the very evidence audited,
and nothing here imports them (``import toolkit`` stays free of them).

Payloads are decoded only when they are JSON or one line of text; anything
else (a pickle, msgpack) is opaque and reported as ``opaque_payload``. A
pickle is never unpickled: unpickling runs code the file names, and an audit
must not execute the file it audits. These queues record no artifact, so a
``done`` from them is ``done_without_artifact`` (a Celery result that names
its ``output`` is the exception).

A text cell that is not UTF-8 is read as bytes (``_lenient``): its payload is opaque,
its key or state is kept with the odd bytes escaped (``bad\\xff``); the other rows are
audited. Tables of the file that the adapter does not read (a second kind of queue, a
plain persist-queue ``SQLiteQueue``) are listed in one ``unaudited_table`` finding.
"""

import json
import re

from toolkit.forensics.foreign import (INPUT_DIGEST_FIELDS, SOURCE_FIELDS, first, foreign_item,
                                       foreign_key, key_fault)
from toolkit.forensics.model import Raw, register

_MAX_NAME = 4096  # a text payload longer than this is not a file name


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _text_or_bytes(value: bytes):
    """sqlite3 text_factory: UTF-8 text as str, anything else as its bytes (the default
    raises on the first bad cell and the whole database would go unaudited)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _lenient(db):
    db.text_factory = _text_or_bytes
    return db


def _escaped(value):
    """A key or state read as non-UTF-8 bytes, with its odd bytes escaped; else as it is."""
    return value.decode("utf-8", "backslashreplace") if type(value) is bytes else value


def decode_payload(value):
    """(decoded JSON value or text, None) or (None, why it is opaque); None/"" → ({}, None).

    Only bytes that are UTF-8 are looked at as text; a pickle (binary from its
    first byte, 0x80, in protocols 2 and later; protocol 0/1 pickles are
    multi-line text and fail the one-line rule) is never decoded.
    """
    if value is None or value == b"" or value == "":
        return {}, None
    if isinstance(value, bytes):
        if value[:1] == b"\x80":
            return None, "a pickle"
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, "binary, neither JSON nor text"
    if not isinstance(value, str):
        return {}, None  # a number: nothing it could name
    try:
        return json.loads(value), None
    except (ValueError, RecursionError):
        pass
    if not value.isprintable():
        return None, "not JSON and not one line of text"
    if not value.strip():
        return None, "not JSON, only blanks"
    if len(value) > _MAX_NAME:
        return None, f"not JSON, and one line of {len(value)} characters: no file name"
    return value, None  # one line of text: a file name, as people put them


def named_source(decoded):
    """The input a decoded payload names: a string, a JSON object's file/source/name
    field, or the first string of a list (Celery's ``args``); else None."""
    if type(decoded) is str:
        return decoded or None
    if type(decoded) is dict:
        return first(decoded, SOURCE_FIELDS, str)
    if type(decoded) is list:
        return next((arg for arg in decoded if type(arg) is str and arg), None)
    return None


class _Collector:
    """Fills a Raw: one record per key (a key seen twice is a ``duplicate_key``, the
    later row wins) and one ``opaque_payload`` finding per table that has any."""

    def __init__(self, name: str):
        self.name, self.raw, self.where = name, Raw(), {}
        self.opaque: dict[str, dict[str, str]] = {}  # table → {key: why}, in row order

    def add(self, record, where: str):
        key = record.key
        if key in self.where:
            self.raw.finding(key, "duplicate_key", f"{self.name} rows {self.where[key]} and "
                             f"{where} hold the same key")
        self.where[key] = where
        self.raw.items[key] = record

    def bad_row(self, key, detail):
        self.raw.finding(key if type(key) is str and key else None, "corrupt_record",
                         f"{self.name} {detail}")

    def decode(self, table, key, value, what="payload"):
        """decode_payload, noting an opaque value under its table and key."""
        decoded, opaque = decode_payload(value)
        if opaque is not None:
            self.opaque.setdefault(table, {}).setdefault(key, f"{what}: {opaque}")
        return decoded

    def payload(self, table, key, value):
        """(source, input digest) that a payload names; (None, None) when opaque."""
        decoded = self.decode(table, key, value)
        digest = first(decoded, INPUT_DIGEST_FIELDS, str) if type(decoded) is dict else None
        return named_source(decoded), digest

    def finish(self, totals: dict, schema: dict, companions=()) -> Raw:
        """``companions``: tables the library writes beside the audited ones (not items)."""
        left = sorted(name for name in schema if name not in totals and name not in companions
                      and not name.startswith("sqlite_"))
        if left:
            self.raw.finding(None, "unaudited_table", f"{self.name}: tables not audited "
                             f"(not of this format): {', '.join(left)}; audit them apart")
        for table, found in self.opaque.items():
            whys = sorted(set(found.values()))
            keys = ", ".join(list(found)[:5]) + (" …" if len(found) > 5 else "")
            self.raw.finding(None, "opaque_payload", f"{self.name} table {table}: {len(found)} "
                             f"of {totals[table]} rows hold {'; '.join(whys)} ({keys}); never "
                             "decoded (unpickling runs code from the file), so what they name "
                             "is not reported")
        return self.raw


# --- litequeue ---------------------------------------------------------------------------

LITEQUEUE_COLUMNS = frozenset(("data", "message_id", "status", "in_time", "lock_time",
                               "done_time"))
# litequeue.MessageStatus, by value: (its word, our state)
LITEQUEUE_STATES = {0: ("READY", "pending"), 1: ("LOCKED", "unknown"), 2: ("DONE", "done"),
                    3: ("FAILED", "failed")}


def _litequeue_tables(schema):
    return sorted(name for name, columns in schema.items() if LITEQUEUE_COLUMNS <= columns)


def _ns_seconds(*stamps):
    """The latest of litequeue's nanosecond stamps, in epoch seconds (None if none is a number)."""
    numbers = [stamp for stamp in stamps if type(stamp) is int]
    return max(numbers) / 1e9 if numbers else None


@register("litequeue", "sqlite", lambda db, schema: bool(_litequeue_tables(schema)),
          "litequeue SQLite queue: message_id, data, status READY|LOCKED|DONE|FAILED")
def read_litequeue(db, schema) -> Raw:
    """One item per message, keyed by ``message_id``; ``data`` names the input."""
    found, totals = _Collector("litequeue"), {}
    _lenient(db)
    for table in _litequeue_tables(schema):
        rows = db.execute("SELECT rowid, message_id, status, data, in_time, lock_time, done_time "
                          f"FROM {_quote(table)} ORDER BY rowid")
        totals[table] = 0
        for rowid, key, status, data, in_time, lock_time, done_time in rows:
            where = f"{table} rowid={rowid}"
            totals[table] += 1
            key = foreign_key(key)
            if type(key) is not str or not key:
                found.bad_row(None, f"row {where}: message_id {key!r} {key_fault(key)}")
                continue
            if type(status) is not int or status not in LITEQUEUE_STATES:
                found.bad_row(key, f"row {where}: status {status!r} is not a MessageStatus")
                continue
            word, state = LITEQUEUE_STATES[status]
            source, digest = found.payload(table, key, data)
            found.add(foreign_item(key, state, word, {}, source=source, input_digest=digest,
                                   updated=_ns_seconds(in_time, lock_time, done_time)), where)
    return found.finish(totals, schema)


# --- persist-queue -----------------------------------------------------------------------

ACK_COLUMNS = frozenset(("_id", "data", "timestamp", "status"))
ACK_TABLE = re.compile(r"ack_queue_(.+)")  # SQLiteAckQueue: f"ack_queue_{name}"
# persistqueue.sqlackqueue.AckStatus, by value: (its word, our state)
ACK_STATES = {0: ("inited", "pending"), 1: ("ready", "pending"), 2: ("unack", "unknown"),
              5: ("acked", "done"), 9: ("ack_failed", "failed")}


def _ack_tables(schema):
    return sorted(name for name, columns in schema.items()
                  if ACK_TABLE.fullmatch(name) and ACK_COLUMNS <= columns)


@register("persist-queue", "sqlite", lambda db, schema: bool(_ack_tables(schema)),
          "persist-queue SQLiteAckQueue: ack_queue_<name>, status inited|ready|unack|acked|"
          "ack_failed")
def read_persist_queue(db, schema) -> Raw:
    """One item per row, keyed by its ``_id`` (the ``pqid``), or ``<name>:<_id>`` when the
    file holds several queues; ``data`` is whatever the queue's serializer wrote."""
    found, totals = _Collector("persist-queue"), {}
    _lenient(db)
    tables = _ack_tables(schema)
    for table in tables:
        prefix = f"{ACK_TABLE.fullmatch(table).group(1)}:" if len(tables) > 1 else ""
        # ``timestamp`` is when the item was put, not when its status last changed: it is
        # not ``updated`` (a stuck report would say "unack since" the put)
        rows = db.execute(f"SELECT _id, status, data FROM {_quote(table)} ORDER BY _id")
        totals[table] = 0
        for rowid, status, data in rows:
            where = f"{table} _id={rowid}"
            totals[table] += 1
            if type(rowid) is not int:
                found.bad_row(None, f"row {where}: _id is not an integer")
                continue
            key = f"{prefix}{rowid}"
            if type(status) is not int or status not in ACK_STATES:
                found.bad_row(key, f"row {where}: status {status!r} is not an AckStatus")
                continue
            word, state = ACK_STATES[status]
            source, digest = found.payload(table, key, data)
            found.add(foreign_item(key, state, word, {}, source=source, input_digest=digest),
                      where)
    return found.finish(totals, schema)


# --- Celery's database result backend ----------------------------------------------------

TASKMETA = "celery_taskmeta"  # Celery's name (database_table_names can change it: not read)
TASKMETA_COLUMNS = frozenset(("id", "task_id", "status", "result", "date_done", "traceback"))
# celery.states: (our state, failure class). RECEIVED/STARTED: a worker took it; whether the
# work ran is unknown. RETRY: Celery will run it again (a transient failure); REVOKED: cancelled.
CELERY_STATES = {"PENDING": ("pending", None), "RECEIVED": ("unknown", None),
                 "STARTED": ("unknown", None), "SUCCESS": ("done", None),
                 "FAILURE": ("failed", None), "RETRY": ("failed", "transient"),
                 "REVOKED": ("cancelled", None), "REJECTED": ("failed", None)}
TASKSETMETA = "celery_tasksetmeta"  # groups' results, written beside it: not items


def _taskmeta_tables(schema):
    return [TASKMETA] if TASKMETA_COLUMNS <= schema.get(TASKMETA, set()) else []


def _exception(result) -> str | None:
    """'ValueError: cannot read b.pdf' from Celery's JSON exception dict."""
    if type(result) is not dict or type(result.get("exc_type")) is not str:
        return None
    message = result.get("exc_message")
    if type(message) is list:
        message = ", ".join(map(str, message))
    return f"{result['exc_type']}: {message}" if message not in (None, "") else result["exc_type"]


def _last_line(traceback) -> str | None:
    """The exception line of a stored traceback (when the result itself is opaque)."""
    traceback = _escaped(traceback)
    lines = traceback.strip().splitlines() if type(traceback) is str else []
    return lines[-1][:400] if lines else None


@register("celery-db", "sqlite", lambda db, schema: bool(_taskmeta_tables(schema)),
          "Celery database result backend: celery_taskmeta, task_id, status, result")
def read_celery(db, schema) -> Raw:
    """One item per task, keyed by ``task_id``. Any other state (``update_state`` takes any
    string: 'PROGRESS', 'page-3', '') is an unfinished task: ``unknown``, its word kept.
    ``result`` is Celery's encoded return value: a JSON object naming ``output``/``sha256``
    gives the artifact; a pickled result stays opaque."""
    found, totals = _Collector("celery_taskmeta"), {}
    _lenient(db)
    for table in _taskmeta_tables(schema):
        columns = schema[table]
        extra = ", ".join(name if name in columns else "NULL"
                          for name in ("args", "kwargs", "worker", "retries"))
        rows = db.execute(f"SELECT id, task_id, status, result, date_done, traceback, {extra} "
                          f"FROM {_quote(table)} ORDER BY id")
        totals[table] = 0
        for row in rows:
            rowid, key, status, result, done, traceback, args, kwargs, worker, retries = row
            where = f"{table} id={rowid}"
            totals[table] += 1
            key, status, worker = foreign_key(key), _escaped(status), _escaped(worker)
            if type(key) is not str or not key:
                found.bad_row(None, f"row {where}: task_id {key!r} {key_fault(key)}")
                continue
            if type(status) is not str:
                found.bad_row(key, f"row {where}: status {status!r} is not a Celery state")
                continue
            state, failure = CELERY_STATES.get(status, ("unknown", None))
            source, digest = found.payload(table, key, kwargs)
            if source is None:
                source = named_source(found.decode(table, key, args))
            decoded = found.decode(table, key, result, "result")
            info = decoded if type(decoded) is dict and state == "done" else {}
            record = foreign_item(key, state, status, info, source=source, input_digest=digest,
                                  updated=done)
            record.attempt = retries if type(retries) is int else None
            record.failure = failure or record.failure
            record.reason = _exception(decoded) or _last_line(traceback) or record.reason
            if state == "unknown" and type(decoded) is dict and "hostname" in decoded:
                record.lease_owner = f"{decoded['hostname']} pid {decoded.get('pid')}"
            elif state == "unknown" and type(worker) is str:
                record.lease_owner = worker
            found.add(record, where)
    return found.finish(totals, schema, (TASKSETMETA,))
