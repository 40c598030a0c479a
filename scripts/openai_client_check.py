#!/usr/bin/env python3
"""The official `openai` Python client against GELO's OpenAI-compatible API, unchanged.

    python3 scripts/openai_client_check.py --gelo PATH/TO/gelo     # starts `gelo up`, checks, stops it
    OPENAI_API_KEY=gelo-... python3 scripts/openai_client_check.py --base-url http://127.0.0.1:8080/v1   # a running gateway
    OPENAI_API_KEY=gelo-... python3 scripts/openai_client_check.py --base-url http://127.0.0.1:8090/v1 --add-document   # through `gelo proxy`
    OPENAI_API_KEY=gelo-... python3 scripts/openai_client_check.py --base-url http://127.0.0.1:8090/v1 --expect-refusal measurement_not_allowed

With --gelo the API key is the one `gelo up` prints. Checks: access first (no key, a wrong
key: 401 `invalid_api_key` with `WWW-Authenticate: Bearer`, the client's
AuthenticationError; a foreign `Host` 421, a foreign `Origin` 403, even with the key); model
listing; embeddings (the client's default base64 encoding and floats, which
must agree); chat completions whole and streamed (server-sent events; with greedy decoding
the streamed text equals the whole one, and the usage chunk arrives); the RAG model
`gelo-rag` (answer citing only passages it was given); an unknown model raising the
client's NotFoundError. With --add-document the document `gelo-rag` must cite is added
through the API's `/v1/documents` (for a gateway this script did not start, as through
`gelo proxy`). With --expect-refusal REASON every call instead must be refused by `gelo
proxy` (502, type `attestation_error` or `server_error`, `code` REASON, named in the
message): models, embeddings, chat whole and streamed, `gelo-rag`, documents and the console
page. Installs nothing: needs `pip install openai` (scripts/setup.sh installs it).
Exits non-zero with a message on the first failed check.
"""

import argparse
import math
import os
import sys
import tempfile
import urllib.parse

from gelo_up import http_call, ingest, start_up, stop

try:
    import openai
except ImportError:
    sys.exit("the `openai` package is missing: python3 -m pip install openai")


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def access_checks(base_url, api_key):
    """Without the key nothing is answered; with it, only under the gateway's own names."""
    root = base_url.rstrip("/").removesuffix("/v1")
    status, head, body = http_call(f"{root}/v1/models")
    check(status == 401 and body["error"]["code"] == "invalid_api_key", f"no key: {status} {body}")
    check((head.get("WWW-Authenticate") or "").startswith("Bearer"), f"no key: WWW-Authenticate {head.get('WWW-Authenticate')!r}")
    status, _, body = http_call(f"{root}/v1/chat/completions", body={"model": "gelo-rag", "messages": [{"role": "user", "content": "x"}]})
    check(status == 401 and body["error"]["type"] == "invalid_request_error", f"no key, gelo-rag: {status}")
    wrong = openai.OpenAI(base_url=base_url, api_key="gelo-" + "A" * 43, max_retries=0, timeout=60)
    try:
        wrong.models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and e.code == "invalid_api_key", "a wrong key raises AuthenticationError (401, invalid_api_key)")
    port = urllib.parse.urlsplit(root).port
    status, _, body = http_call(f"{root}/v1/models", api_key, headers={"Host": f"evil.example:{port}"})
    check(status == 421 and body["error"]["code"] == "host_not_allowed", f"a foreign Host, with the key: {status}")
    status, _, body = http_call(f"{root}/v1/models", api_key, headers={"Origin": "http://evil.example"})
    check(status == 403 and body["error"]["code"] == "origin_not_allowed", f"a foreign Origin, with the key: {status}")
    status, _, body = http_call(f"{root}/openapi.json")
    check(status == 200 and "bearer" in body["components"]["securitySchemes"], "/openapi.json is public and names the bearer scheme")


BEES = "Honey bees tell their hive mates where flowers are with the waggle dance."


def add_document(base_url, api_key):
    """The document `gelo-rag` must cite, added through the API itself."""
    root = base_url.rstrip("/").removesuffix("/v1")
    status, _, body = http_call(f"{root}/v1/documents", api_key, body={"documents": [{"name": "bees", "text": BEES}]})
    check(status == 200 and body["documents"][0]["id"] == "bees", f"/v1/documents adds a document: {status}")


def refusal_checks(base_url, api_key, reason):
    """Every call refused by the proxy with `reason`, through the client's own exceptions."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "How do honey bees tell each other where flowers are?"}]
    calls = {
        "models.list": lambda: client.models.list(),
        "embeddings": lambda: client.embeddings.create(model="gelo-embedder", input=["x"]),
        "chat": lambda: client.chat.completions.create(model="gelo-generator", messages=messages, max_tokens=8),
        "chat stream": lambda: list(client.chat.completions.create(model="gelo-generator", messages=messages, max_tokens=8, stream=True)),
        "gelo-rag stream": lambda: list(client.chat.completions.create(model="gelo-rag", messages=messages, max_tokens=8, stream=True)),
    }
    for name, call in calls.items():
        try:
            call()
            check(False, f"{name}: refused")
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            ok = e.status_code == 502 and e.code == reason and reason in str(e) and "sent nothing" in str(e)
            check(ok and body.get("type") in ("attestation_error", "server_error"), f"{name}: refused, 502 {e.code}")
    root = base_url.rstrip("/").removesuffix("/v1")
    for url, body in [(f"{root}/v1/documents", {"documents": [{"name": "bees", "text": BEES}]}), (f"{root}/", None)]:
        status, _, answer = http_call(url, api_key, body=body)
        code = (answer or {}).get("error", {}).get("code")
        check(status == 502 and code == reason, f"{url.removeprefix(root) or '/'}: refused, {status} {code}")


def run_checks(base_url, api_key, gelo=None, state=None):
    access_checks(base_url, api_key)
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)

    ids = [m.id for m in client.models.list()]
    check({"gelo-embedder", "gelo-generator", "gelo-rag"} <= set(ids), f"models.list: {ids}")

    texts = ["Green tea keeps more catechins than black tea.", "The first public steam railway opened in 1825."]
    default = client.embeddings.create(model="gelo-embedder", input=texts)  # the client asks for base64
    floats = client.embeddings.create(model="gelo-embedder", input=texts, encoding_format="float")
    check(len(default.data) == 2 and len(default.data[0].embedding) == 384, "embeddings: two 384-dimensional vectors")
    check(all(cosine(a.embedding, b.embedding) > 0.9999 for a, b in zip(default.data, floats.data)), "embeddings: base64 and float agree")
    check(cosine(default.data[0].embedding, default.data[1].embedding) < 0.9, "embeddings: different texts, different vectors")
    check(default.usage.prompt_tokens > 0, "embeddings: usage")

    messages = [{"role": "user", "content": "Name a colour of the sky."}]
    whole = client.chat.completions.create(model="gelo-generator", messages=messages, max_tokens=12, temperature=0)
    check(whole.choices[0].message.content != "", "chat: a non-empty completion")
    check(whole.usage.completion_tokens > 0, "chat: usage")
    parts, finish, usage = [], None, None
    stream = client.chat.completions.create(
        model="gelo-generator", messages=messages, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check(len(parts) > 1, f"chat stream: {len(parts)} content chunks")
    check("".join(parts) == whole.choices[0].message.content, "chat stream: greedy streamed text equals the whole completion")
    check(finish in ("stop", "length"), f"chat stream: finish_reason {finish}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, "chat stream: usage chunk")

    if gelo and state:
        ingest(gelo, state, "bees", BEES)
    rag = client.chat.completions.create(
        model="gelo-rag",
        messages=[{"role": "user", "content": "How do honey bees tell each other where flowers are?"}],
        max_tokens=32,
        temperature=0,
        stream=True,
        extra_body={"rerank": False, "top_k": 2},
    )
    passages, citations, text = [], None, []
    for chunk in rag:
        extra = chunk.model_extra or {}
        passages += [p["id"] for p in extra.get("passages", [])]
        if "citations" in extra:
            citations = extra["citations"]["citations"]
        for c in chunk.choices:
            if c.delta.content:
                text.append(c.delta.content)
    check(len(passages) > 0 and "".join(text) != "", "gelo-rag stream: passages, then an answer")
    check(citations is not None and set(citations) <= set(passages), f"gelo-rag: citations {citations} are among the passages {passages}")

    try:
        client.embeddings.create(model="text-embedding-3-small", input="x")
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "an unknown model raises NotFoundError (404)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gelo", help="the gelo binary: start `gelo up` for the check")
    ap.add_argument("--base-url", help="an already running gateway's OpenAI base URL (…/v1)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="with --base-url: its API key (default: $OPENAI_API_KEY)")
    ap.add_argument("--add-document", action="store_true", help="with --base-url: add the cited document through /v1/documents first")
    ap.add_argument("--expect-refusal", metavar="REASON", help="with --base-url (a `gelo proxy`): every call must be refused with this reason")
    a = ap.parse_args()
    if bool(a.gelo) == bool(a.base_url):
        ap.error("give exactly one of --gelo and --base-url")
    if a.base_url:
        if not a.api_key:
            ap.error("--base-url needs --api-key or OPENAI_API_KEY")
        if a.expect_refusal:
            refusal_checks(a.base_url, a.api_key, a.expect_refusal)
            print(f"openai {openai.__version__}: every call refused with {a.expect_refusal}")
            return
        if a.add_document:
            add_document(a.base_url, a.api_key)
        run_checks(a.base_url, a.api_key)
        print(f"openai {openai.__version__}: every check passed")
        return
    with tempfile.TemporaryDirectory() as state:
        proc, ready = start_up(a.gelo, state, args=["--small"])
        try:
            run_checks(f"http://{ready['http']}/v1", ready["api_key"], a.gelo, state)
        finally:
            stop(proc)
    print(f"openai {openai.__version__}: every check passed")


if __name__ == "__main__":
    main()
