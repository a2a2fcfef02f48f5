"""The naive batch's careful twin: the same provider, the same libraries, the five habits that matter.

* identity is the content plus the options, so a rerun sends the same key;
* the intent (the key) is written durably before the submit (temp file, fsync, rename);
* a submit whose reply was lost is looked up, never repeated blind; a key the
  provider does not know is resubmitted only when the contract dedupes it;
* a 503 means nothing was accepted (retry the same key); a 409 names the job;
* a download goes to a temporary file, is checked against the job's SHA-256,
  then renamed; an unverified file is never an output.

Exit 0 when every document is done, failed or parked for review; 1: run again.
"""

import base64
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import httpx

URL = os.environ["TOOLKIT_PROVIDER_URL"]
INPUTS = Path(os.environ["TOOLKIT_INPUTS"])
OUT = Path(os.environ["TOOLKIT_OUT"])
STATE = Path("state.json")
OPTIONS = {"target": "fr"}
RESTING = ("done", "failed", "needs_review")


def load():
    return json.loads(STATE.read_text()) if STATE.exists() else {}


def save(state):
    tmp = STATE.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, STATE)  # all or nothing
    fd = os.open(".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lookup(client, key, tries=5):
    """The job for ``key``, None if the provider says not found; raises if it cannot say."""
    for n in range(tries):
        reply = client.get("/lookup", params={"key": key})
        if reply.status_code == 200:
            job = reply.json()["job"]
            if job is not None or n == tries - 1:
                return job
        elif n == tries - 1:
            raise RuntimeError(f"lookup unavailable (HTTP {reply.status_code})")
        time.sleep(0.05 * 2 ** n)  # a lagging lookup may show it later
    return None


def submit(client, path, key, data):
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    for n in range(6):
        try:
            reply = client.post("/jobs", params={"options": json.dumps(OPTIONS)}, content=data,
                                headers={"Idempotency-Key": key,
                                         "Content-Digest": f"sha-256=:{digest}:"})
        except httpx.TransportError:
            return lookup(client, key)  # the reply was lost: ask, never resend blind
        if reply.status_code == 503 and reply.json().get("error") == "transient":
            time.sleep(0.02 * 2 ** n)  # nothing was accepted: the same key again is safe
            continue
        if reply.status_code in (200, 409):
            return reply.json()["job"]
        if reply.status_code == 422:
            return {"status": "failed", "reason": reply.json().get("message")}
        reply.raise_for_status()
    return None


def fetch(client, job, out):
    part = out.with_suffix(".part")
    try:
        with client.stream("GET", f"/jobs/{job['job_id']}/artifact") as response, \
                open(part, "wb") as f:
            response.raise_for_status()
            for chunk in response.iter_bytes():
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except httpx.HTTPError:
        part.unlink(missing_ok=True)
        return False
    if hashlib.sha256(part.read_bytes()).hexdigest() != job["artifact_sha256"]:
        part.unlink()
        return False
    os.replace(part, out)
    return True


def advance(client, contract, state, path):
    data = path.read_bytes()
    entry = state.setdefault(path.name, {})
    key = entry.get("key") or f"{hashlib.sha256(data + json.dumps(OPTIONS).encode()).hexdigest()}:1"
    job = None
    if entry.get("state") == "unknown":  # an intent from an earlier run: ask first
        job = lookup(client, key)
        if job is None and not (contract["idempotent_keys"] and contract["key_retention"] is None):
            entry["state"] = "needs_review"  # it may have run; only a person may resend it
            return
    if job is None:
        entry.update(key=key, state="unknown")
        save(state)  # the intent, durable before the side effect
        job = submit(client, path, key, data)
        if job is None:
            return  # still unknown: the next run looks it up
    while job["status"] in ("queued", "running"):
        time.sleep(0.01)
        job = client.get(f"/jobs/{job['job_id']}").raise_for_status().json()["job"]
    if job["status"] != "succeeded":
        entry["state"] = "failed"
        return
    out = OUT / f"{path.stem}.fr.pdf"
    if fetch(client, job, out) or fetch(client, job, out):
        entry["state"] = "done"


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    state = load()
    with httpx.Client(base_url=URL, timeout=10.0) as client:
        contract = client.get("/contract").raise_for_status().json()["contract"]
        for path in sorted(INPUTS.glob("*.pdf")):
            if state.get(path.name, {}).get("state") in RESTING:
                continue
            try:
                advance(client, contract, state, path)
            except (httpx.HTTPError, RuntimeError) as exc:
                print(f"{path.name}: {exc} (left for the next run)", file=sys.stderr)
            save(state)
    return 0 if all(state.get(p.name, {}).get("state") in RESTING
                    for p in INPUTS.glob("*.pdf")) else 1


if __name__ == "__main__":
    sys.exit(main())
