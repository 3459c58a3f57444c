#!/usr/bin/env python3
"""A training-fleet worker written against the fleet's /v1 API only, with
the Python standard library (as the fleet's own client.py was): claim,
heartbeat, run the job's command, upload the result, complete or fail.

usage: fleet_worker.py URL HOSTNAME [MAX_JOBS]

It prints one JSON line per job it handled and exits when nothing is left.

Credentials, for a server with tokens (none are needed without):
  FLEET_TOKEN                  a bearer token of role agent; or
  FLEET_CERT, FLEET_KEY        a TLS client certificate (and its key) whose
                               name is HOSTNAME, for an https:// URL;
  FLEET_CA                     the CA to verify the server's certificate.
"""
import hashlib
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request


def tls_context():
    if not os.environ.get("FLEET_CA") and not os.environ.get("FLEET_CERT"):
        return None
    ctx = ssl.create_default_context(cafile=os.environ.get("FLEET_CA"))
    if os.environ.get("FLEET_CERT"):
        ctx.load_cert_chain(os.environ["FLEET_CERT"], os.environ.get("FLEET_KEY"))
    return ctx


CONTEXT = tls_context()


def call(base, method, path, host, body=None, headers=None, raw=None):
    data = raw
    hdrs = {"X-Lab-Host": host}
    if os.environ.get("FLEET_TOKEN"):
        hdrs["Authorization"] = "Bearer " + os.environ["FLEET_TOKEN"]
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    req = urllib.request.Request(base + path, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=30, context=CONTEXT) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main():
    base, host = sys.argv[1].rstrip("/"), sys.argv[2]
    max_jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    capability = {"hostname": host, "cores": os.cpu_count() or 1, "ram_gib": 4.0,
                  "cuda": False, "vram_gib": None, "gpus": [], "torch": None,
                  "git_commit": "abc123", "python": sys.version.split()[0]}
    status, health = call(base, "GET", "/v1/health", host)
    assert status == 200 and health == {"status": "ok"}, (status, health)
    for _ in range(max_jobs):
        status, job = call(base, "POST", "/v1/job/claim", host, {"capability": capability})
        assert status == 200, (status, job)
        if job.get("job") is None and "job_id" not in job:
            break
        job_id, spec = job["job_id"], job["spec"]
        status, hb = call(base, "POST", "/v1/job/%s/heartbeat" % job_id, host)
        assert status == 200 and hb == {"ok": True}, (status, hb)
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, ARBITER_OUTPUT_DIR=out,
                       HYPER=json.dumps(spec["hyper"]))
            proc = subprocess.run(spec["command"], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                err = "exit %d: %s" % (proc.returncode, (proc.stdout + proc.stderr)[-2000:])
                status, r = call(base, "POST", "/v1/job/%s/fail" % job_id, host, {"error": err})
                print(json.dumps({"job": job["name"], "result": "failed", "status": status}), flush=True)
                continue
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(out, arcname="model")
            blob = buf.getvalue()
        sha = hashlib.sha256(blob).hexdigest()
        # A wrong sha is refused with the actual one.
        status, bad = call(base, "PUT", "/v1/model/%s" % job_id, host,
                           headers={"X-Content-SHA256": "0" * 64}, raw=blob)
        assert status == 400 and bad["status"] == "sha-mismatch" and bad["actual_sha256"] == sha, (status, bad)
        status, up = call(base, "PUT", "/v1/model/%s" % job_id, host,
                          headers={"X-Content-SHA256": sha}, raw=blob)
        assert status == 201 and up["status"] == "stored" and up["artifact_id"] == sha, (status, up)
        status, done = call(base, "POST", "/v1/job/%s/complete" % job_id, host, {"artifact_id": sha})
        assert status == 200, (status, done)
        # Too late now: the job is no longer this worker's.
        status, gone = call(base, "POST", "/v1/job/%s/heartbeat" % job_id, host)
        assert status == 410, (status, gone)
        print(json.dumps({"job": job["name"], "result": "completed", "artifact": sha}), flush=True)
    status, jobs = call(base, "GET", "/v1/jobs", host)
    assert status == 200
    status, workers = call(base, "GET", "/v1/workers", host)
    assert status == 200 and any(w["hostname"] == host and w["capability"]["python"] for w in workers["workers"]), workers
    print(json.dumps({"summary": sorted((j["name"], j["status"]) for j in jobs["jobs"])}), flush=True)


if __name__ == "__main__":
    main()
