"""The fake provider as a real HTTP service on 127.0.0.1 (WSGI on werkzeug's threaded server).

One ``FakeProvider`` answers every request; each request runs in its own
thread, so a job runs to its commit in the service whether or not the client
is still waiting for the reply. Routes (JSON bodies unless said)::

    GET  /health                   200 {"ready": true} | 503 {"ready": false, "reason": ...}
    GET  /contract                 {"spec": "idempotent,...", "contract": {field: value}}
    POST /jobs?task_key=T&options=JSON   body: the PDF; headers Idempotency-Key, Content-Digest
                                   -> {"job": {...}}
    GET  /lookup?key=K             {"job": {...} | null}   (null: not found, an answer)
    GET  /jobs/<job_id>            poll -> {"job": {...}}
    GET  /jobs/<job_id>/artifact   the PDF; Content-Length, Content-Digest, Toolkit-Job
    POST /jobs/<job_id>/cancel     {"job": {...}}
    GET  /jobs  /stats  /key-stats  /calls  /executions     the provider's own records
    GET  /faults                   how many times each service fault fired

Errors are ``{"error": kind, "message": ...}``: 503 ``transient`` (a definite
"not now": nothing was accepted), 409 ``conflict`` (with ``job``), 422
``key_reuse`` / ``permanent`` (a body that is not a PDF: empty or without
``%PDF-``; no job is created), 400 ``bad_request`` (options not plain JSON or
nested too deep, a Content-Length that is not a byte count), 404 ``no_route``, 500
``internal`` (anything else: the outcome is unknown to the client). Every
response names the contract in ``Toolkit-Contract``.

Faults that happen for real (``ServiceFaults``): the first N submits run
slowly (the job sits ``running`` for S seconds, then commits, then the reply
goes out, to a client that may have given up); the first N artifact responses
announce the full ``Content-Length`` and stop halfway; the first N submits are
accepted and executed, then the connection is dropped without a reply.
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from ..errors import KeyReuseError, PermanentError, ToolkitError, TransientError
from ..documents import PDF_MAGIC
from ..identity import canonical_json
from .contract import Contract, ProviderConflict
from .fake import FakeProvider

from .wire import (  # noqa: F401 - shared with the client, which never imports this module
    CHUNK, CONTRACT_HEADER, HOST, JOB_HEADER, MAX_UPLOAD, ServiceFaults, content_digest,
    parse_digest)


class _BadRequest(Exception):
    pass


class ProviderApp:
    """The WSGI application around one ``FakeProvider``; ``close()`` it."""

    def __init__(self, db_path, out_dir, contract: Contract = Contract(),
                 faults: ServiceFaults = ServiceFaults(), health_timeout: float = 0.25):
        from werkzeug.routing import Map, Rule

        self.db_path, self.faults, self.health_timeout = Path(db_path), faults, health_timeout
        self._local = threading.local()
        self.provider = FakeProvider(db_path, out_dir, contract, on_phase=self._on_phase)
        self.spool = _own_spool(Path(out_dir) / ".spool")
        self._count_lock = threading.Lock()
        self._counts = {"submit": 0, "fetch": 0, "drop": 0, "refuse": 0}
        self.not_ready: str | None = None  # set by a failed write; cleared by a good probe
        get, post = ["GET"], ["POST"]
        self.url_map = Map([
            Rule("/health", endpoint="health", methods=get),
            Rule("/contract", endpoint="contract", methods=get),
            Rule("/jobs", endpoint="submit", methods=post),
            Rule("/lookup", endpoint="lookup", methods=get),
            Rule("/jobs/<job_id>", endpoint="poll", methods=get),
            Rule("/jobs/<job_id>/artifact", endpoint="fetch", methods=get),
            Rule("/jobs/<job_id>/cancel", endpoint="cancel", methods=post),
            Rule("/faults", endpoint="faults", methods=get),
            *(Rule(f"/{name}", endpoint="records", methods=get, defaults={"name": name})
              for name in ("jobs", "stats", "key-stats", "calls", "executions"))])

    def close(self):
        self.provider.close()

    # -- WSGI --------------------------------------------------------------------
    def __call__(self, environ, start_response):
        from werkzeug.exceptions import HTTPException
        from werkzeug.wrappers import Request

        request = Request(environ)
        request.max_content_length = MAX_UPLOAD
        try:
            endpoint, args = self.url_map.bind_to_environ(environ).match()
            response = getattr(self, f"_{endpoint}")(request, **args)
        except HTTPException as exc:
            response = _error(exc.code or 400, "no_route" if exc.code in (404, 405) else
                              "bad_request", exc.description or str(exc))
        except _BadRequest as exc:
            response = _error(400, "bad_request", str(exc))
        except TransientError as exc:
            response = _error(503, "transient", str(exc))
            response.headers["Retry-After"] = "1"
        except ProviderConflict as exc:
            response = _error(409, "conflict", str(exc), job=exc.job.to_dict())
        except KeyReuseError as exc:
            response = _error(422, "key_reuse", str(exc), key=exc.key)
        except PermanentError as exc:
            response = _error(422, "permanent", str(exc))
        except sqlite3.Error as exc:
            self.not_ready = f"job table not writable: {exc}"  # stop taking work (rule 8)
            logging.getLogger(__name__).exception("provider database error")
            response = _error(500, "internal", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            logging.getLogger(__name__).exception("unexpected error")
            response = _error(500, "internal", f"{type(exc).__name__}: {exc}")
        response.headers[CONTRACT_HEADER] = self.provider.contract.describe()
        return response(environ, start_response)

    def _next(self, what: str) -> int:
        with self._count_lock:
            self._counts[what] += 1
            return self._counts[what]

    def _on_phase(self, phase, job_id):
        # Runs in the request thread that executes the job: a slow submit stalls here,
        # with the job committed as running and visible to lookups from other requests.
        if phase == "claimed" and getattr(self._local, "slow", False):
            time.sleep(self.faults.slow_seconds)

    # -- health ------------------------------------------------------------------
    def probe(self) -> str | None:
        """Write one row to the provider database; None when it worked, else why not."""
        try:
            db = sqlite3.connect(self.db_path, timeout=self.health_timeout, isolation_level=None)
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT OR REPLACE INTO meta VALUES ('health_probe', ?)", (repr(time.time()),))
                db.execute("COMMIT")
            finally:
                db.close()
        except sqlite3.Error as exc:
            return f"job table not writable: {exc}"
        return None

    def _health(self, request):
        self.not_ready = self.probe()
        if self.not_ready:
            return _json({"ready": False, "reason": self.not_ready}, 503)
        return _json({"ready": True, "db": str(self.db_path)})

    def _contract(self, request):
        contract = self.provider.contract
        return _json({"spec": contract.describe(), "contract": dataclasses.asdict(contract)})

    # -- the provider interface ------------------------------------------------------
    def _submit(self, request):
        idem_key = request.headers.get("Idempotency-Key")
        task_key = request.args.get("task_key") or None
        try:  # NaN, Infinity: Python's json reads them, JSON has no such numbers
            options = json.loads(request.args.get("options", "{}"), parse_constant=_not_json)
            canonical_json(options)
        except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: [[[[... deep
            raise _BadRequest(f"options is not plain JSON: {exc}") from exc
        if not idem_key or not isinstance(options, dict):
            raise _BadRequest("need an Idempotency-Key header and options as a JSON object")
        length = request.headers.get("Content-Length")
        if length is not None and not (length.isascii() and length.isdigit()):
            raise _BadRequest(f"Content-Length {length[:40]!r} is not a byte count")
        expected = parse_digest(request.headers.get("Content-Digest"))
        if expected is None:
            raise _BadRequest("need a Content-Digest: sha-256=:...: header for the document")
        if self.not_ready and (reason := self.probe()):
            raise TransientError(f"not ready, no new work taken: {reason}")
        self.not_ready = None
        upload = self._receive(request, expected)
        try:
            self._local.slow = self._next("submit") <= self.faults.slow_submits
            # A refusal goes through the provider, which counts and logs it as its own
            # transient refusals are (a drill's history shows the 503 the program met).
            refuse = self._next("refuse") <= self.faults.refuse_submits
            job = self.provider.submit(idem_key, upload, options, task_key=task_key, refuse=refuse)
        except PermanentError as exc:
            if upload.exists():
                raise
            # Our spool file vanished (removed by hand, or by a sweep): a server problem,
            # never the document's; no job was created. Transient: the client sends again.
            raise TransientError(f"upload lost by the service: nothing accepted ({exc})") from exc
        finally:
            self._local.slow = False
            upload.unlink(missing_ok=True)
        if self._next("drop") <= self.faults.drop_submits:
            _drop(request.environ)  # the job is accepted and ran; its reply never leaves
        return _json({"job": job.to_dict()})

    def _receive(self, request, expected: str) -> Path:
        """Spool the request body to a file and check it against its digest."""
        path, digest = self.spool / f"in-{uuid.uuid4().hex}.pdf", hashlib.sha256()
        try:  # an aborted, oversized (413) or failing upload leaves no spool file behind
            with open(path, "wb") as out:
                while chunk := request.stream.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        if digest.hexdigest() != expected:
            path.unlink(missing_ok=True)
            raise TransientError("upload damaged in transit (digest mismatch): nothing accepted")
        with open(path, "rb") as data:  # the body arrived whole: is it a document at all?
            head = data.read(len(PDF_MAGIC))
        if head != PDF_MAGIC:
            path.unlink(missing_ok=True)
            raise PermanentError("the body is not a PDF (empty, or no %PDF- header): "
                                 "no job created")
        return path

    def _lookup(self, request):
        key = request.args.get("key")
        if not key:
            raise _BadRequest("need ?key=IDEMPOTENCY_KEY")
        job = self.provider.lookup(key)
        return _json({"job": job.to_dict() if job else None})

    def _poll(self, request, job_id):
        return _json({"job": self.provider.poll(job_id).to_dict()})

    def _cancel(self, request, job_id):
        return _json({"job": self.provider.cancel(job_id).to_dict()})

    def _fetch(self, request, job_id):
        from werkzeug.wrappers import Response

        path = self.spool / f"out-{uuid.uuid4().hex}.pdf"
        try:
            job = self.provider.fetch(job_id, path)
            size = path.stat().st_size
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        cut = self._next("fetch") <= self.faults.cut_fetches
        headers = {"Content-Length": str(size), "Content-Digest": content_digest(job.artifact_sha256),
                   JOB_HEADER: json.dumps(job.to_dict())}
        return Response(_stream(path, size // 2 if cut else size), 200, headers,
                        mimetype="application/pdf", direct_passthrough=True)

    def _faults(self, request):
        """How many times each service fault fired: a drill whose fault never fired proves nothing."""
        with self._count_lock:
            return _json({"slow_submits": min(self._counts["submit"], self.faults.slow_submits),
                          "cut_fetches": min(self._counts["fetch"], self.faults.cut_fetches),
                          "drop_submits": min(self._counts["drop"], self.faults.drop_submits),
                          "refuse_submits": min(self._counts["refuse"],
                                                self.faults.refuse_submits)})

    def _records(self, request, name):
        provider = self.provider
        if name in ("stats", "key-stats"):
            return _json(provider.stats() if name == "stats" else provider.key_stats())
        rows = [job.to_dict() for job in provider.jobs()] if name == "jobs" else \
            getattr(provider, name)()
        return _json({name: rows})


def _drop(environ) -> None:
    """Close the client's connection now, with no reply: the caller sees a reset, not an answer."""
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.shutdown(socket.SHUT_RDWR)  # werkzeug's later write fails as a dropped connection


def _own_spool(root: Path) -> Path:
    """This service process's own spool folder, ``<root>/<boot>-<pid>-<start ticks>``.

    Several services may share one ``--out`` (and database): each spools in its own
    folder, and at start sweeps only the folders whose process is gone (liveness by
    pid and start ticks, so a reused pid is not mistaken for its predecessor), plus
    loose files an older version left. A live service's upload is never swept.
    """
    import shutil

    from toolkit import liveness

    root.mkdir(parents=True, exist_ok=True)
    boot = liveness.boot_id()[:8]
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            owner_boot, _, rest = entry.name.partition("-")
            pid, _, ticks = rest.partition("-")
            same_boot = owner_boot == boot
            if same_boot and pid.isdigit() and ticks.isdigit() and liveness.alive(
                    liveness.HOSTNAME, int(pid), int(ticks)) is not False:
                continue  # a live service's spool: not ours to sweep
            shutil.rmtree(entry, ignore_errors=True)  # its process is gone (or a reboot)
        elif entry.name.endswith(".pdf"):
            entry.unlink(missing_ok=True)  # left loose by an older service killed mid-request
    mine = root / f"{boot}-{os.getpid()}-{liveness.my_start() or 0}"
    mine.mkdir(exist_ok=True)
    return mine


def _stream(path: Path, limit: int):
    """Yield the file's first ``limit`` bytes, then delete it (also when the client left)."""
    try:
        with open(path, "rb") as data:
            while limit > 0 and (chunk := data.read(min(CHUNK, limit))):
                limit -= len(chunk)
                yield chunk
    finally:
        path.unlink(missing_ok=True)


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON number")


def _json(document, status: int = 200):
    from werkzeug.wrappers import Response

    return Response(json.dumps(document), status, mimetype="application/json")


def _error(status: int, kind: str, message: str, **extra):
    return _json({"error": kind, "message": message, **extra}, status)


def serve(db_path, out_dir, contract: Contract = Contract(), port: int = 0,
          faults: ServiceFaults = ServiceFaults(), ready=print,
          until_stdin_closes: bool = False) -> None:
    """Serve on 127.0.0.1 until SIGTERM or Ctrl-C; ``ready(line)`` names the URL once bound.

    ``port=0`` takes any free port. Request lines are not logged; errors go to stderr.
    ``until_stdin_closes``: also stop when stdin reaches EOF (``_stop_at_stdin_eof``).

    Raises:
        ToolkitError: the port cannot be bound, or ``db_path`` is not a provider database.
    """
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        # Bound here, not by werkzeug, so a taken port is one line (ToolkitError), not an exit.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((HOST, port))
        except OSError as exc:
            raise ToolkitError(f"cannot listen on {HOST}:{port}: {exc.strerror}") from exc
        listener.listen(128)
        app = ProviderApp(db_path, out_dir, contract, faults)
        server = make_server(HOST, port, app, threaded=True, fd=listener.fileno())  # dups the fd
    server.daemon_threads = True  # a SIGTERM does not wait for a slow job's request

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    if until_stdin_closes:  # after the handler: the EOF's SIGTERM stops us as a kill does
        threading.Thread(target=_stop_at_stdin_eof, name="stdin-eof", daemon=True).start()
    ready(f"serving http://{HOST}:{server.port}")
    try:
        server.serve_forever()  # returns on KeyboardInterrupt, closing the socket
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        app.close()



def _stop_at_stdin_eof() -> None:
    """SIGTERM ourselves once stdin reaches EOF: its write end is held by the process that
    started us alone (``ServiceProcess``), and the kernel closes it when that process dies,
    by ``kill -9`` too. An owner dead before we got here is an EOF at once."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    os.kill(os.getpid(), signal.SIGTERM)
