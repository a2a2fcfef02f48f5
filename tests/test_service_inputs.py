"""The provider service's bad requests, the CLI's numbers, pipes and unwritable --out.

A real ``serve-provider`` process is spoken to over a real socket: an upload cut
short is a real closed connection, an oversized chunked upload really streams.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from urllib.parse import quote, urlsplit

import pytest

from toolkit.cli import main
from toolkit.ledger import State, open_ledger
from toolkit.provider.client import ServiceProcess

S = State


def _spool(process):
    """Files in the spool (each service process spools in its own subfolder)."""
    folder = process.out_dir / ".spool"
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def _raw(url, request: bytes, then=None, read=True) -> bytes:
    """Send raw bytes to the service; ``then(sock)`` may keep sending; returns the reply."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(request)
        if then is not None:
            then(sock)
        if not read:
            return b""
        reply = b""
        while b"\r\n\r\n" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
        return head + b"\r\n\r\n" + body


def _until(predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


@pytest.mark.slow
def test_service_spool_is_empty_after_aborted_oversized_and_nan_uploads_and_swept_at_start(
        tmp_path):
    """Fault: an upload whose client disconnects halfway, a chunked upload past the size
    limit, options holding NaN, and a spool file left by a killed service. Property: no
    ``.spool`` file stays behind; NaN is a 400 (a definite rejection), never a 500; a
    restart sweeps what a SIGKILLed service left."""
    process = ServiceProcess(tmp_path / "p.db", tmp_path / "jobs")
    process.start()
    try:
        url, digest = process.url, "sha-256=:" + "A" * 43 + "=:"
        head = (f"POST /jobs?options={{}} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k:1\r\n"
                f"Content-Digest: {digest}\r\nConnection: close\r\n")
        _raw(url, (head + "Content-Length: 1000000\r\n\r\n").encode() + b"%PDF-" * 1000,
             read=False)  # closed with most of the body unsent
        chunk = b"x" * (1 << 20)

        def oversized(sock):
            try:
                for _ in range(70):  # 70 MiB, past the 64 MiB limit
                    sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sock.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the service stopped reading: it refused the upload

        reply = _raw(url, (head + "Transfer-Encoding: chunked\r\n\r\n").encode(), oversized)
        assert reply.split(b"\r\n", 1)[0].split()[1] in (b"413", b"400")
        nan = quote(json.dumps({"a": float("nan")}))
        reply = _raw(url, (f"POST /jobs?options={nan} HTTP/1.1\r\nHost: x\r\n"
                           f"Idempotency-Key: k:1\r\nContent-Digest: {digest}\r\n"
                           "Content-Length: 5\r\nConnection: close\r\n\r\n%PDF-").encode())
        status, _, rest = reply.partition(b"\r\n")
        assert status.split()[1] == b"400" and b"NaN" in rest and b"Traceback" not in rest
        assert _until(lambda: _spool(process) == []), _spool(process)
        process.kill()
        (tmp_path / "jobs" / ".spool" / "in-left-by-a-dead-service.pdf").write_bytes(b"%PDF-")
        process.start()
        assert _spool(process) == []
    finally:
        process.stop()


@pytest.mark.parametrize("argv", [
    ["serve-provider", "--db", "p.db", "--out", "o", "--port", "0", "--slow-seconds", "nan"],
    ["serve-provider", "--db", "p.db", "--out", "o", "--port", "0", "--contract",
     "idempotent,retention=nan"],
    ["run", "--inputs", "in", "--ledger", "l.sqlite", "--provider-url", "http://127.0.0.1:9",
     "--out", "out", "--read-timeout", "inf"],
    ["run", "--inputs", "in", "--ledger", "l.sqlite", "--provider-db", "p.db", "--out", "out",
     "--contract", "idempotent,retention=inf"],
])
@pytest.mark.slow
def test_non_finite_numbers_in_cli_options_are_refused_in_one_line(tmp_path, argv):
    """Fault: NaN or infinity given to a numeric option. Property: exit 2 with one line
    naming the option; nothing is created (no database, no folder). A real process with
    a timeout: a service that accepted NaN would serve on and never return."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(b"%PDF-1.4\n")
    try:
        done = subprocess.run([sys.executable, "-m", "toolkit", *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv)} was accepted: it ran on instead of refusing")
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "nan" in err or "inf" in err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.slow
def test_reader_closing_the_pipe_is_no_error_and_no_traceback(tmp_path):
    """Fault: the reader of stdout exits early (``| head -1``). Property: no ``error:``
    line and no traceback on stderr; the status is SIGPIPE's (141), not bad input (2)."""
    code = ("import os, sys\nr, w = os.pipe()\nos.close(r)\nos.dup2(w, 1)\n"
            "from toolkit.cli import main\n"
            f"sys.exit(main(['fixtures', {str(tmp_path / 'c')!r}, '--docs', '1', "
            "'--poison', '0']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 141, result.stderr
    assert "error" not in result.stderr and "Traceback" not in result.stderr


def test_out_unwritable_midway_leaves_items_submitted_and_exits_run_again(
        tmp_path, small_corpus, monkeypatch, capsys):
    """Fault: ``--out`` turns into a regular file midway through a batch (the next
    mkdir and write fail for real). Property: exit 1 ("run again"), never 2; the items
    not stored stay ``submitted``; a rerun once ``--out`` is back finishes them with no
    second execution."""
    import toolkit.runner.registry as registry  # the one strategy loader the CLI calls
    from toolkit.provider.records import provider_stats

    shutil.copytree(small_corpus[0].parent, tmp_path / "in")
    out = tmp_path / "out"
    opened = registry.open_strategy

    def with_hook(*args, **options):
        runner = opened(*args, **options)

        def hook(point, key, **context):
            if point == "after_submit" and runner.ledger.counts()["done"] == 2 and out.is_dir():
                os.rename(out, tmp_path / "out.aside")
                out.write_bytes(b"not a folder")
        runner.hook = hook
        return runner

    monkeypatch.setattr(registry, "open_strategy", with_hook)
    args = ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "l.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", out, "--no-progress"]
    assert main(list(map(str, args))) == 1
    assert "cannot write" in capsys.readouterr().err
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        states = sorted(item.state.value for item in ledger.items())
    assert states == ["done", "done", "failed", "submitted", "submitted"]
    out.unlink()
    os.rename(tmp_path / "out.aside", out)
    monkeypatch.setattr(registry, "open_strategy", opened)
    assert main(list(map(str, args))) == 0
    assert provider_stats(tmp_path / "p.db")["executions"] == 4


def test_drill_list_with_json_prints_one_json_document(capsys):
    """Fault: ``drill list --json`` printed text. Property: stdout is one JSON list of
    every drill with its summary."""
    from toolkit.drills import DRILLS

    assert main(["drill", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["drill"] for row in listed] == list(DRILLS) and all(r["summary"] for r in listed)


@pytest.mark.slow
def test_service_refuses_deep_options_negative_length_and_non_pdf_bodies_without_a_job(
        tmp_path):
    """Fault: options nested 3000 deep (``[[[...``), ``Content-Length: -5``, an empty body
    and a ``hello`` body (each with its correct digest). Property: deep options and the
    negative length are 400 ``bad_request`` (never a 500 with a traceback, never a 503
    "digest mismatch"); a body that is not a PDF is 422 ``permanent``; no job is
    created and the spool is left empty."""
    import base64
    import hashlib

    def digest(body):
        return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"

    def post(options, body, length=None):
        reply = _raw(process.url, (
            f"POST /jobs?options={quote(options)} HTTP/1.1\r\nHost: x\r\n"
            f"Idempotency-Key: k:1\r\nContent-Digest: {digest(body)}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n"
            "Connection: close\r\n\r\n").encode() + body)
        status, _, rest = reply.partition(b"\r\n")
        assert b"Traceback" not in rest
        return int(status.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}")

    process = ServiceProcess(tmp_path / "p.db", tmp_path / "jobs")
    process.start()
    try:
        assert post("[" * 3000 + "]" * 3000, b"%PDF-")[0] == 400
        status, body = post("{}", b"%PDF-", length=-5)
        assert status == 400 and body["error"] == "bad_request"
        for document in (b"", b"hello"):
            status, body = post("{}", document)
            assert status == 422 and body["error"] == "permanent", (document, body)
        jobs = json.loads(_raw(process.url, b"GET /jobs HTTP/1.1\r\nHost: x\r\n"
                                            b"Connection: close\r\n\r\n")
                          .partition(b"\r\n\r\n")[2])
        assert jobs == {"jobs": []}
        assert _until(lambda: _spool(process) == []), _spool(process)
    finally:
        process.stop()


@pytest.mark.slow
def test_second_service_on_the_same_out_never_sweeps_the_first_ones_upload_in_flight(
        tmp_path, small_corpus):
    """Fault: while service A receives an upload (half the body sent), service B starts
    on the same ``--out`` and database (it sweeps the spool of dead services). Property:
    A's upload is not swept: once the rest of the body arrives A creates the job (200),
    never a 422 ``permanent`` for a healthy document."""
    import base64
    import hashlib
    import threading

    document = small_corpus[0].read_bytes()
    digest = "sha-256=:" + base64.b64encode(hashlib.sha256(document).digest()).decode() + ":"
    first = ServiceProcess(tmp_path / "p.db", tmp_path / "jobs")
    second = ServiceProcess(tmp_path / "p.db", tmp_path / "jobs")
    first.start()
    try:
        half, go, replies = len(document) // 2, threading.Event(), []

        def rest(sock):
            assert _until(lambda: any(name.endswith(".pdf") for name in _spool(first)))
            go.wait(60)
            sock.sendall(document[half:])

        sender = threading.Thread(target=lambda: replies.append(_raw(first.url, (
            f"POST /jobs?options=%7B%7D HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k:1\r\n"
            f"Content-Digest: {digest}\r\nContent-Length: {len(document)}\r\n"
            "Connection: close\r\n\r\n").encode() + document[:half], rest)))
        sender.start()
        assert _until(lambda: any(name.endswith(".pdf") for name in _spool(first)))
        second.start()  # sweeps at start, while A's upload is half received
        go.set()
        sender.join(60)
        status = replies[0].split(b"\r\n", 1)[0].split()[1]
        assert status == b"200", replies[0][-300:]
    finally:
        second.stop()
        first.stop()
