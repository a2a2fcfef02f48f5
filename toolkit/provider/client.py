"""The caller's side of the service: ``HttpProvider`` (httpx) and ``ServiceProcess``.

``HttpProvider`` speaks to ``service``; ``ServiceProcess`` starts,
SIGKILLs and restarts ``serve-provider`` as a child process (tests, drills).

``HttpProvider`` has the methods and answers of ``FakeProvider``, so the runner, the drills and
the checker work with either. One request per call, never a retry here (the
runner owns retries and their budgets); every request has explicit connect,
write and read timeouts, and a download has an overall deadline.

How a failure reaches the runner -- what it proves decides the type::

    what happened                                   raised            why
    connect refused / connect timeout / pool full   TransientError    nothing was sent: nothing
                                                                      can have been accepted
    read timeout, reset or EOF after sending,       TimeoutError      the request may have been
    write error, reply cut or unreadable,                             acted upon: outcome unknown,
    500 or any other 5xx                                              reconcile by lookup
    503 {"error": "transient"}                      TransientError    the service said "not now"
    409 {"error": "conflict", "job": ...}           ProviderConflict  the key's job is active
    422 key_reuse / 422 permanent / 400, 413        KeyReuseError / PermanentError
    download: size or SHA-256 differ from           TransientError    the file is deleted, never
    Content-Length / Content-Digest / the job                         handed over half
    404 no route, another service, the contract     ToolkitError      misconfiguration: stop
    changed since this client read it

Only ``http://127.0.0.1:PORT`` is accepted, and proxies from the environment
are ignored: this client talks to the local fake service and nothing else.
"""

import hashlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..errors import KeyReuseError, PermanentError, ToolkitError, TransientError
from ..identity import canonical_json
from .contract import Contract, Job, JobStatus, ProviderConflict
from .wire import (
    CHUNK,
    CONTRACT_HEADER,
    HOST,
    JOB_HEADER,
    ServiceFaults,
    content_digest,
    parse_digest,
)


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it is ``http://127.0.0.1:PORT``.

    Raises:
        ToolkitError: any other scheme, host or path.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ToolkitError(f"bad provider URL {url!r}: {exc}") from exc
    if parts.scheme != "http" or parts.hostname != HOST or not port or parts.path not in ("", "/") \
            or parts.query or parts.username:
        raise ToolkitError(f"provider URL must be http://{HOST}:PORT (loopback only), got {url!r}")
    return f"http://{HOST}:{port}"


def _job(data: dict) -> Job:
    return Job(**{**data, "status": JobStatus(data["status"])})


class HttpProvider:
    """A provider service on loopback, behind the ``FakeProvider`` interface.

    The contract is read from ``GET /contract`` when the client is made; every
    reply names the service's contract and a change is refused (``ToolkitError``).

    Raises:
        ToolkitError: bad URL, or no provider service answers there.
    """

    def __init__(self, url: str, *, connect_timeout: float = 2.0, read_timeout: float = 30.0,
                 write_timeout: float = 30.0, fetch_deadline: float = 120.0):
        import httpx

        self.url = check_url(url)
        self._timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout,
                                      write=write_timeout, pool=connect_timeout)
        self.fetch_deadline = fetch_deadline
        self._local, self._clients, self._lock = threading.local(), [], threading.Lock()
        self.contract: Contract | None = None
        try:
            body = self._call("GET", "/contract")
            self.contract = Contract(**body["contract"])
        except (TransientError, TimeoutError, KeyError, TypeError, ValueError) as exc:
            self.close()
            raise ToolkitError(f"no provider service at {self.url}: {exc}") from exc

    # -- transport ---------------------------------------------------------------
    def _client(self):
        # One httpx.Client per thread: the service closes every connection anyway,
        # and a per-thread client needs no promise about sharing one across threads.
        client = getattr(self._local, "client", None)
        if client is None:
            import httpx

            client = httpx.Client(base_url=self.url, timeout=self._timeout, trust_env=False,
                                  follow_redirects=False)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def close(self):
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextmanager
    def _transport(self, what: str):
        """Map httpx's transport errors by what they prove (see the module table)."""
        import httpx

        try:
            yield
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise TransientError(f"{what}: provider unreachable, nothing sent ({exc!r})") from exc
        except httpx.LocalProtocolError as exc:
            raise ToolkitError(f"{what}: request not sendable: {exc}") from exc
        except httpx.TransportError as exc:  # read/write timeout, reset, EOF, cut reply
            raise TimeoutError(f"{what}: no complete reply, outcome unknown ({exc!r})") from exc

    def _check_contract(self, response) -> None:
        spec = response.headers.get(CONTRACT_HEADER)
        if spec is None:
            raise ToolkitError(f"{self.url} is not a toolkit provider service "
                               f"(HTTP {response.status_code}, no {CONTRACT_HEADER} header)")
        if self.contract is not None and spec != self.contract.describe():
            raise ToolkitError(f"the provider's contract changed from {self.contract.describe()!r} "
                               f"to {spec!r}: decisions made under the old one no longer hold")

    def _call(self, method: str, path: str, **request) -> dict:
        """One request; the JSON body of a 2xx reply, or the mapped error."""
        what = f"{method} {path}"
        with self._transport(what):
            response = self._client().request(method, path, **request)
        self._check_contract(response)
        return self._answer(response, what)

    @staticmethod
    def _answer(response, what: str) -> dict:
        status = response.status_code
        try:
            body = response.json()
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if status < 300 or status >= 500:
                raise TimeoutError(f"{what}: unreadable reply (HTTP {status}), outcome unknown") from exc
            raise ToolkitError(f"{what}: unexpected HTTP {status}") from exc
        if 200 <= status < 300:
            return body
        kind, message = body.get("error"), body.get("message", f"HTTP {status}")
        if status == 503 and kind == "transient":
            raise TransientError(message)
        if status == 409 and kind == "conflict":
            raise ProviderConflict(_job(body["job"]))
        if status == 422 and kind == "key_reuse":
            raise KeyReuseError(body.get("key"))
        if kind in ("permanent", "bad_request") and 400 <= status < 500:  # 400, 413, 422
            raise PermanentError(message)
        if status >= 500:
            raise TimeoutError(f"{what}: HTTP {status} ({message}), outcome unknown")
        raise ToolkitError(f"{what}: HTTP {status} {kind}: {message}")

    # -- the provider interface ----------------------------------------------------
    def submit(self, idem_key: str, document_path, options: dict, task_key: str | None = None) -> Job:
        """Upload the document and submit it under ``idem_key`` (see ``FakeProvider.submit``).

        Raises:
            TimeoutError: no complete reply: the job may exist; look the key up.
            TransientError, KeyReuseError, ProviderConflict, PermanentError: as the service said.
        """
        options_json = canonical_json(options)  # TypeError before anything is sent
        try:
            data = Path(document_path).read_bytes()
        except OSError as exc:
            raise PermanentError(f"cannot read document {document_path}: {exc}") from exc
        params = {"options": options_json, **({"task_key": task_key} if task_key else {})}
        headers = {"Idempotency-Key": idem_key, "Content-Type": "application/pdf",
                   "Content-Digest": content_digest(hashlib.sha256(data).hexdigest())}
        return _job(self._call("POST", "/jobs", params=params, headers=headers, content=data)["job"])

    def lookup(self, idem_key: str) -> Job | None:
        """The latest job for the key as the service's contract lets it be seen, or None."""
        found = self._call("GET", "/lookup", params={"key": idem_key})["job"]
        return None if found is None else _job(found)

    def poll(self, job_id: str) -> Job:
        return _job(self._call("GET", f"/jobs/{quote(job_id, safe='')}")["job"])

    def cancel(self, job_id: str) -> Job:
        """Cancel exactly this job if it is still queued or running."""
        return _job(self._call("POST", f"/jobs/{quote(job_id, safe='')}/cancel")["job"])

    def fetch(self, job_id: str, dest_path) -> Job:
        """Download the artifact to ``dest_path``, checked against length, digest and job.

        Raises:
            TransientError: the bytes are not the artifact (the file is removed).
            TimeoutError: the download broke off or ran out of time (the file is removed).
            PermanentError: no such job, not succeeded, or its artifact is gone.
        """
        dest, what = Path(dest_path), f"GET artifact of {job_id}"
        with self._transport(what), self._client().stream(
                "GET", f"/jobs/{quote(job_id, safe='')}/artifact") as response:
            self._check_contract(response)
            if response.status_code != 200:
                response.read()
                self._answer(response, what)
                raise ToolkitError(f"{what}: unexpected HTTP {response.status_code}")
            try:
                job = _job(json.loads(response.headers[JOB_HEADER]))
                length = int(response.headers["Content-Length"])
            except (KeyError, ValueError, TypeError) as exc:
                raise TimeoutError(f"{what}: reply without a readable job or length") from exc
            try:
                return self._receive(response, dest, what, job, length)
            except BaseException:
                dest.unlink(missing_ok=True)  # a half download is never handed over
                raise

    def _receive(self, response, dest: Path, what: str, job: Job, length: int) -> Job:
        expected = parse_digest(response.headers.get("Content-Digest"))
        deadline, size, digest = time.monotonic() + self.fetch_deadline, 0, hashlib.sha256()
        with open(dest, "wb") as out:
            for chunk in response.iter_bytes(CHUNK):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: download took over {self.fetch_deadline}s")
                size += len(chunk)
                digest.update(chunk)
                out.write(chunk)
        found = digest.hexdigest()
        if not (size == length == job.artifact_size and found == expected == job.artifact_sha256):
            raise TransientError(f"{what}: got {size} bytes sha256 {found[:12]}, expected "
                                 f"{job.artifact_size} bytes sha256 {(job.artifact_sha256 or '')[:12]}")
        return job

    # -- the provider's records (for drills, notebooks and the checker) --------------
    def health(self) -> dict:
        """``{"ready": True, ...}`` or ``{"ready": False, "reason": ...}``.

        Raises:
            TransientError, TimeoutError: the service did not answer.
        """
        with self._transport("GET /health"):
            response = self._client().get("/health")
        self._check_contract(response)
        if response.status_code == 503:
            return response.json()
        return self._answer(response, "GET /health")

    def jobs(self) -> list[Job]:
        return [_job(row) for row in self._call("GET", "/jobs")["jobs"]]

    def stats(self) -> dict:
        return self._call("GET", "/stats")

    def key_stats(self) -> dict:
        return self._call("GET", "/key-stats")

    def calls(self) -> list[dict]:
        return self._call("GET", "/calls")["calls"]

    def executions(self) -> list[dict]:
        return self._call("GET", "/executions")["executions"]

    def faults_fired(self) -> dict:
        """``{fault: times fired}`` of the service's own faults (slow submits, cut fetches)."""
        return self._call("GET", "/faults")


class ServiceProcess:
    """``serve-provider`` as a child process on 127.0.0.1: start, SIGKILL, restart, stop.

    For tests, drills and notebooks. ``port=0`` takes a free port at the first
    start; a restart binds the same one, so clients keep their URL. Every wait
    is bounded; as a context manager the process never outlives the block.
    The service's stderr goes to ``log_path`` (default: beside the database).
    """

    def __init__(self, db_path, out_dir, contract: Contract | str = "idempotent", *,
                 faults: ServiceFaults = ServiceFaults(), port: int = 0, start_timeout: float = 30.0,
                 log_path=None):
        self.db_path, self.out_dir = Path(db_path), Path(out_dir)
        self.spec = contract if isinstance(contract, str) else contract.describe()
        self.faults, self.port, self.start_timeout = faults, port, start_timeout
        self.log_path = Path(log_path or self.db_path.with_name(self.db_path.name + ".service.log"))
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, faults: ServiceFaults | None = None) -> str:
        """Start the service (with ``faults``, else the ones given at creation); return its URL.

        Raises:
            ToolkitError: it exited or did not report its URL within ``start_timeout``.
        """
        if self.alive:
            raise ToolkitError(f"service already running at {self.url}")
        faults = self.faults if faults is None else faults
        command = [sys.executable, "-m", "toolkit", "serve-provider", "--db", str(self.db_path),
                   "--out", str(self.out_dir), "--port", str(self.port), "--contract", self.spec,
                   "--slow-submits", str(faults.slow_submits), "--slow-seconds", str(faults.slow_seconds),
                   "--cut-fetches", str(faults.cut_fetches),
                   "--drop-submits", str(faults.drop_submits),
                   "--refuse-submits", str(faults.refuse_submits), "--until-stdin-closes"]
        # Its stdin is a pipe whose write end only we hold (close-on-exec, so no other child
        # inherits it): when we die, even by kill -9, the kernel closes it and the service
        # stops at that EOF instead of serving on as an orphan.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log)
        try:
            line = self._ready_line()
        except BaseException:  # interrupted while it starts: __exit__ will not run, kill it now
            self.kill()
            raise
        finally:
            self.proc.stdout.close()  # the service prints one line there, nothing after it
        self.url = line.split()[-1]
        self.port = int(self.url.rpartition(":")[2])
        return self.url

    def _ready_line(self) -> str:
        deadline, buffer = time.monotonic() + self.start_timeout, b""
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                chunk = os.read(self.proc.stdout.fileno(), 4096) if remaining > 0 and \
                    selector.select(remaining) else None
                if not chunk:  # EOF: it exited; None: it took too long
                    self.kill()
                    tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
                    raise ToolkitError(f"provider service did not start: {' | '.join(tail)}")
                buffer += chunk
        return buffer.decode().strip()

    def kill(self) -> None:
        """SIGKILL: no handler runs, in-flight jobs stop where they are."""
        if self.alive:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)
            if not self.proc.stdin.closed:
                self.proc.stdin.close()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self, faults: ServiceFaults = ServiceFaults()) -> str:
        """SIGKILL if running, then start again on the same port (without faults by default)."""
        self.kill()
        return self.start(faults)

    def __enter__(self):
        if not self.alive:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
