"""Starting and stopping `gelo up` for the scripts that check a running stack (imported by
scripts/openai_client_check.py, scripts/openapi_fuzz.py, scripts/console_check.py and
scripts/rag_eval.py)."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

# `gelo up` prints the HTTP API's key once, on stderr, in the line that exports it.
KEY_LINE = re.compile(r"export OPENAI_API_KEY=(gelo-[A-Za-z0-9_-]{40,})")


def start_up(gelo, state, env=None, timeout=900, args=()):
    """Starts `gelo up` on free loopback ports with its state under `state` (and `args`,
    more flags of `gelo up`); returns the process and the fields of its ready line (`grpc`,
    `http`, ...) with `pids`, each service's process id by role, and `api_key`, the HTTP
    API's key as `gelo up` printed it (read from its stderr, kept in `state/up.log`)."""
    log = open(os.path.join(state, "up.log"), "w")
    proc = subprocess.Popen(
        [gelo, "up", "--state-dir", os.path.join(state, "up"), "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    deadline = time.time() + timeout
    pids = {}
    for line in proc.stdout:
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if line.startswith("GELO_SERVICE"):
            pids[fields["role"]] = int(fields["pid"])
        if line.startswith("GELO_READY role=up"):
            keys = KEY_LINE.findall(open(log.name).read())
            if len(keys) != 1:
                proc.kill()
                raise SystemExit(f"FAIL: gelo up printed {len(keys)} API keys, not one; see " + log.name)
            return proc, {**fields, "pids": pids, "api_key": keys[0]}
        if time.time() > deadline:
            break
    proc.kill()
    raise SystemExit("FAIL: gelo up did not become ready; see " + log.name)


def ingest(gelo, state, doc_id, text):
    """Adds one document to the running stack's store through the gelo CLI."""
    ingest_paths(gelo, state, ["--id", doc_id, "--text", text])


def ingest_paths(gelo, state, args, cwd=None):
    """`gelo ingest ARGS` against the running stack (files, folders, or --text), run in `cwd`
    (document ids are the paths as given)."""
    env = dict(os.environ, GELO_UP_DIR=os.path.join(state, "up"))
    subprocess.run([os.path.abspath(gelo), "ingest", *args], env=env, check=True, stdout=subprocess.DEVNULL, cwd=cwd)


def http_call(url, key=None, body=None, headers=None, timeout=120):
    """One HTTP call to the gateway; returns (status, response headers, parsed JSON body or
    None). HTTP errors are returned, not raised."""
    h = dict(headers or {})
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data, h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, head, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, head, raw = e.code, e.headers, e.read()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    return status, head, parsed


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
