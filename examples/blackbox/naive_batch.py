"""A batch written the way teams write one: httpx, tenacity, a JSON progress file, outputs in place.

Nothing of the toolkit is in here: it reads TOOLKIT_PROVIDER_URL, TOOLKIT_INPUTS
and TOOLKIT_OUT and talks HTTP (docs/provider-api.md). Its habits, each one
common and each one a finding of the black-box drill:

* any exception retries the whole document (tenacity), submit included, with a
  fresh request id: a lost reply or a cut download sends the document again;
* the progress file is rewritten in place (open "w", no fsync, no rename);
* an output that exists is taken as done, and downloads go straight into place.
"""

import base64
import hashlib
import json
import os
import sys
import uuid
from pathlib import Path

import httpx
from tenacity import retry, stop_after_attempt, wait_fixed

URL = os.environ["TOOLKIT_PROVIDER_URL"]
INPUTS = Path(os.environ["TOOLKIT_INPUTS"])
OUT = Path(os.environ["TOOLKIT_OUT"])
PROGRESS = Path("progress.json")


def load():
    return json.loads(PROGRESS.read_text()) if PROGRESS.exists() else {}


def save(state):
    with open(PROGRESS, "w") as f:  # rewritten in place
        json.dump(state, f)


@retry(stop=stop_after_attempt(3), wait=wait_fixed(0.05), reraise=True)  # "the API is flaky"
def translate(client, path, out):
    data = path.read_bytes()
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    reply = client.post("/jobs", params={"options": json.dumps({"target": "fr"})}, content=data,
                        headers={"Idempotency-Key": str(uuid.uuid4()),
                                 "Content-Digest": f"sha-256=:{digest}:"})
    reply.raise_for_status()
    job = reply.json()["job"]
    while job["status"] in ("queued", "running"):
        job = client.get(f"/jobs/{job['job_id']}").raise_for_status().json()["job"]
    if job["status"] != "succeeded":
        raise RuntimeError(f"job {job['job_id']} {job['status']}: {job['reason']}")
    with client.stream("GET", f"/jobs/{job['job_id']}/artifact") as response, \
            open(out, "wb") as f:  # straight into place
        response.raise_for_status()
        for chunk in response.iter_bytes():
            f.write(chunk)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    state = load()
    with httpx.Client(base_url=URL, timeout=10.0) as client:
        for path in sorted(INPUTS.glob("*.pdf")):
            out = OUT / f"{path.stem}.fr.pdf"
            if state.get(path.name) == "done" or out.exists():
                continue
            state[path.name] = "started"
            save(state)
            try:
                translate(client, path, out)
                state[path.name] = "done"
            except Exception as exc:  # noqa: BLE001 - "log it and move on"
                print(f"{path.name}: {exc}", file=sys.stderr)
                state[path.name] = "failed"
            save(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
