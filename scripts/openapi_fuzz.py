#!/usr/bin/env python3
"""Fuzzes the gateway's HTTP API against its own OpenAPI document with schemathesis.

    python3 scripts/openapi_fuzz.py --gelo PATH/TO/gelo [--examples 30] [--seed 1]

Starts `gelo up` (output tokens capped at 32 through GELO_MAX_OUTPUT_TOKENS, so a generated
request costs little and larger ones exercise the refusal), adds one document, then runs
`schemathesis run <gateway>/openapi.json` with valid and invalid requests for every
operation, sending the API key `gelo up` printed as `Authorization: Bearer`. Checks: no
5xx; status codes, content types and bodies as documented, which makes every refusal a JSON
error with a code and a message; every operation the document marks as needing the key
refuses a request without it or with a wrong one (schemathesis' `ignored_auth`); no request
over the timeout (a hang). Afterwards the stack must still be up and answer. Needs `pip install
schemathesis` (scripts/setup.sh installs it). Exits non-zero on any failure.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

from gelo_up import http_call, ingest, start_up, stop

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,ignored_auth"


def healthy(base, key):
    status, _, body = http_call(f"{base}/v1/models", key, timeout=30)
    models = [m["id"] for m in body["data"]] if status == 200 else []
    status, _, body = http_call(f"{base}/v1/chat/completions", key,
                                {"model": "gelo-generator", "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4})
    return status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length") and "gelo-rag" in models


def keyed(base, key):
    """The fuzzer's premise: without the key every API route answers 401, with it 200."""
    status, _, _ = http_call(f"{base}/v1/models")
    if status != 401:
        sys.exit(f"FAIL: /v1/models without a key answered {status}, not 401")
    status, _, _ = http_call(f"{base}/v1/models", key)
    if status != 200:
        sys.exit(f"FAIL: /v1/models with the key answered {status}")
    print("ok: the API needs the key `gelo up` printed, and takes it")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gelo", required=True, help="the gelo binary")
    ap.add_argument("--examples", type=int, default=30, help="examples per operation and phase")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="seconds one request may take")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, GELO_MAX_OUTPUT_TOKENS="32")
        # The per-key rate limit (50/s by default) would answer most of the fuzzer's quick
        # requests 429 and leave the routes behind it untested: lifted for this run.
        quick = ["--small", "--", "--http-rate-limit", "100000", "--http-rate-burst", "100000"]
        proc, ready = start_up(a.gelo, state, env=env, args=quick)
        try:
            base, key = f"http://{ready['http']}", ready["api_key"]
            keyed(base, key)
            ingest(a.gelo, state, "bees", "Honey bees tell their hive mates where flowers are with the waggle dance.")
            t0 = time.time()
            run = subprocess.run(
                ["schemathesis", "run", f"{base}/openapi.json", "--checks", CHECKS, "--max-examples", str(a.examples),
                 "--header", f"Authorization: Bearer {key}",
                 "--seed", str(a.seed), "--request-timeout", str(a.timeout), "--workers", "1", "--no-color",
                 "--suppress-health-check", "too_slow"],
                env=dict(os.environ, SCHEMATHESIS_HOOKS=""),
                cwd=state,  # its cache and reports stay out of the checkout
            )
            print(f"schemathesis: exit {run.returncode} in {time.time() - t0:.0f} s")
            if proc.poll() is not None:
                sys.exit(f"FAIL: gelo up exited ({proc.returncode}) during the fuzzing; see {state}/up.log")
            if not healthy(base, key):
                sys.exit("FAIL: the gateway does not answer after the fuzzing")
            print("ok: the stack is up and answers after the fuzzing")
            if run.returncode != 0:
                sys.exit("FAIL: schemathesis found failures (above)")
        finally:
            stop(proc)
    print("openapi fuzz: every check passed")


if __name__ == "__main__":
    main()
