"""Starting and stopping `gelo up` for the scripts that check a running stack (imported by
scripts/openai_client_check.py and scripts/openapi_fuzz.py)."""

import os
import signal
import subprocess
import time


def start_up(gelo, state, env=None, timeout=900, args=()):
    """Starts `gelo up` on free loopback ports with its state under `state` (and `args`,
    more flags of `gelo up`); returns the process and the fields of its ready line (`grpc`,
    `http`, ...) with `pids`, each service's process id by role."""
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
            return proc, {**fields, "pids": pids}
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


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
