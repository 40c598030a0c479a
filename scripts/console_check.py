#!/usr/bin/env python3
"""The web console in headless Chromium against `gelo up`, driven by Selenium.

    python3 scripts/console_check.py --gelo PATH/TO/gelo [--screenshot FILE]

Starts `gelo up` on loopback ports (as scripts/openai_client_check.py does), opens the
console the gateway serves at `/`, and checks, through the page only:
  0. without a key the page says so; a wrong key is refused (401) with a clear message; the
     key `gelo up` printed is accepted, kept in the tab's sessionStorage only (not in the
     address, localStorage or a cookie);
  1. two documents are added: pasted text and a .md file read by the browser;
  2. a question streams an answer citing at least one of the listed sources, and each
     citation holds: the cited passage says what the sentence citing it says
     (scripts/citations.py);
  3. a citation the gateway flags as unknown is marked as such;
  4. the Trust view lists embedder, reranker and generator as verified, with measurement,
     TCB, chip, model identity, scheme, evidence age and the policy digest;
  5. with the reranker's process stopped (SIGSTOP: `gelo up` shuts everything down when a
     child exits, so the process is frozen rather than killed) the Trust view marks it
     unavailable with a reason, and verified again once it continues (SIGCONT);
  6. neither the browser's console nor any service log holds the document or question text,
     nor the API key;
  7. a page of another origin (a second local HTTP server) cannot read or write: its
     fetches of /v1/chat/completions, /v1/documents and /v1/trust, with and without
     credentials and even with the key, all fail in the browser, the gateway logs each
     refusal, and the store holds no new document;
  8. under a DNS name that resolves to the gateway (Chromium's host resolver rules stand in
     for DNS rebinding) neither the console nor the API is served (421).
Saves a screenshot of the page with the stopped reranker (default under $CARGO_TARGET_DIR,
else /tmp) and prints where. Needs Debian's chromium and chromium-driver and
`pip install -r scripts/console/requirements.txt` (scripts/setup.sh installs them). Exits non-zero with a
message on the first failed step.
"""

import argparse
import base64
import functools
import glob
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import citations
from gelo_up import start_up, stop

try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    sys.exit("the `selenium` package is missing: python3 -m pip install -r scripts/console/requirements.txt")

BEES = "Honey bees tell their hive mates where flowers are with the waggle dance, a figure-of-eight run on the comb."
TEA = "# Tea\n\nGreen tea and black tea come from the same plant, Camellia sinensis; black tea is oxidised before drying.\n"
QUESTION = "How do honey bees tell their hive mates where flowers are?"
# Texts that must never show up in a log line (the browser's or a service's).
SECRETS = ["waggle dance", "Camellia sinensis", "hive mates where flowers"]
ROLES = ["embedder", "reranker", "generator"]
# A name the browser resolves to the gateway, as a rebinding attacker's would.
REBOUND = "rebound.example"


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print(f"ok: {what}", flush=True)


def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        raise SystemExit("FAIL: chromium and chromedriver are needed: apt-get install chromium chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1800", "--no-first-run",
              f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)


def wait(driver, seconds, cond, what):
    try:
        return WebDriverWait(driver, seconds, poll_frequency=0.25).until(lambda d: cond(d))
    except TimeoutException:
        raise Failed(f"{what} (waited {seconds} s)")


def attr(driver, css, name):
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return els[0].get_attribute(name) if els else None


def api_key(d, key):
    wait(d, 30, lambda d: attr(d, "#key-status", "data-state") == "missing", "without a key the page asks for one")
    wait(d, 30, lambda d: attr(d, "#trust-status", "data-state") == "missing", "without a key the Trust view waits for one")
    d.find_element(By.ID, "api-key").send_keys("gelo-" + "A" * 43)
    d.find_element(By.ID, "key-submit").click()
    wait(d, 30, lambda d: attr(d, "#key-status", "data-state") == "refused", "a wrong key is refused")
    message = d.find_element(By.ID, "key-status").text
    check("refused" in message and "invalid_api_key" in message, f"the 401 is shown: {message!r}")
    d.find_element(By.ID, "api-key").send_keys(key)
    d.find_element(By.ID, "key-submit").click()
    wait(d, 30, lambda d: attr(d, "#key-status", "data-state") == "accepted", "the key gelo up printed is accepted")
    check(d.find_element(By.ID, "api-key").get_attribute("value") == "", "the key field is cleared once the key is kept")
    kept = d.execute_script("return [sessionStorage.getItem('gelo.apiKey'), localStorage.length, document.cookie, location.href];")
    check(kept[0] == key and kept[1] == 0 and kept[2] == "" and key not in kept[3], "the key is in sessionStorage only: not localStorage, a cookie or the address")
    # The browser logs the refused key's 401s as errors: expected here, nothing else.
    severe = [e["message"] for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    check(all(" 401 " in m for m in severe) and not any(key in m for m in severe), f"the browser logged only the wrong key's 401s: {severe}")


def add_documents(d, state):
    d.find_element(By.ID, "doc-name").send_keys("bees.txt")
    d.find_element(By.ID, "doc-text").send_keys(BEES)
    tea = os.path.join(state, "tea.md")
    with open(tea, "w") as f:
        f.write(TEA)
    d.find_element(By.ID, "doc-files").send_keys(tea)
    d.find_element(By.ID, "doc-submit").click()
    wait(d, 120, lambda d: attr(d, "#doc-status", "data-state") in ("done", "error"), "the add-documents request finished")
    status = d.find_element(By.ID, "doc-status").text
    check(attr(d, "#doc-status", "data-state") == "done", f"documents added: {status}")
    stored = {e.get_attribute("data-id") for e in d.find_elements(By.CSS_SELECTOR, "[data-testid=stored-document]")}
    check(stored == {"bees.txt", "tea.md"}, f"both the pasted text and the file are stored: {sorted(stored)}")


def ask(d):
    q = d.find_element(By.ID, "question")
    q.send_keys(QUESTION)
    d.find_element(By.ID, "ask-submit").click()
    # Poll while it streams: text must show up before the stream ends.
    seen_partial, deadline = False, time.time() + 600
    while attr(d, "#answer", "data-state") not in ("done", "error"):
        if attr(d, "#answer", "data-state") == "streaming" and d.find_element(By.ID, "answer").text.strip():
            seen_partial = True
        if time.time() > deadline:
            raise Failed("the answer did not finish within 600 s")
        time.sleep(0.2)
    # The gateway releases an answer sentence by sentence once a sentence says more than the
    # question (docs/GATEWAY.md): a one-sentence answer arrives whole, so only a longer one
    # must have shown text before its stream ended.
    final = d.find_element(By.ID, "answer").text.strip()
    sentences = len(re.findall(r"[.!?](?:\s|$)", final))
    check(seen_partial or sentences <= 1, f"the answer's text appeared while it was still streaming ({sentences} sentences)")
    status = d.find_element(By.ID, "answer-status").text
    check(attr(d, "#answer", "data-state") == "done", f"the answer completed: {status}")
    sources = [e.get_attribute("data-passage-id") for e in d.find_elements(By.CSS_SELECTOR, "#sources [data-testid=source]")]
    check(len(sources) > 0, f"sources listed with passage ids: {sources}")
    cited = [e.get_attribute("data-passage-id") for e in d.find_elements(By.CSS_SELECTOR, "#answer [data-testid=citation]")]
    check(len(cited) > 0 and set(cited) <= set(sources), f"the answer cites {cited}, all among the sources")
    marked = [e.get_attribute("data-passage-id") for e in d.find_elements(By.CSS_SELECTOR, "#sources [data-cited=true]")]
    check(set(marked) == set(cited), f"the cited sources are marked: {marked}")
    # Each citation names a passage that says what its sentence says (scripts/citations.py):
    # the answer about the waggle dance cites bees.txt, not tea.md.
    texts = d.execute_script(
        "return Array.from(document.querySelectorAll('#sources [data-testid=source]'))"
        ".map((e) => [e.dataset.passageId, e.querySelector('.passage').textContent]);"
    )
    answer = d.execute_script("return document.getElementById('answer').textContent;")
    checked = citations.check(answer, dict(texts))
    wrong = [f"{c['sentence']!r} cites {c['cited']} (support {c['support']}), {c['best']} says it ({c['best_support']})" for c in checked if not c["holds"]]
    check(checked and not wrong, f"every citation holds ({len(checked)} checked): {wrong or [c['cited'] for c in checked]}")
    # Citations the gateway reports as unknown: the same renderer, fed a known and two unknown ones.
    counts = d.execute_script(
        "const box = document.createElement('div');"
        "box.append(GeloConsole.citedFragment('See [a.txt#0] and [ghost#3] and [7].', new Map([['a.txt#0', 1]]), new Set(['ghost#3', '7'])));"
        "return [box.querySelectorAll('[data-testid=citation]').length, box.querySelectorAll('[data-testid=unknown-citation]').length];"
    )
    check(counts == [1, 2], f"an unknown citation is marked unknown, a known one linked: {counts}")


# The Trust table as the page shows it, read in one go (the page may redraw it at any moment).
TRUST_ROWS_JS = """
const rows = {};
for (const r of document.querySelectorAll('#trust-body [data-testid=trust-row]')) {
  const cell = (f) => r.querySelector(`[data-field=${f}]`);
  const full = (f) => { const e = cell(f).querySelector('[data-full]'); return e ? e.dataset.full : null; };
  rows[r.dataset.role] = {
    status: r.dataset.status, measurement: full('measurement'), chip: full('chip'), model: full('model'),
    policy: full('policy'), tcb: cell('tcb').textContent, scheme: (cell('scheme').querySelector('summary') || {}).textContent || '',
    schemeJson: (cell('scheme').querySelector('pre') || {}).textContent || null, age: cell('age').textContent,
    reason: Array.from(r.querySelectorAll('[data-testid=reason-code]')).map((e) => e.textContent).join(''),
  };
}
return rows;
"""


def trust_rows(d):
    return d.execute_script(TRUST_ROWS_JS)


def statuses(d):
    d.find_element(By.ID, "trust-refresh").click()
    time.sleep(0.3)
    return {k: v["status"] for k, v in trust_rows(d).items()}


def trust_verified(d):
    d.find_element(By.ID, "trust").location_once_scrolled_into_view
    wait(d, 60, lambda d: statuses(d) == {r: "verified" for r in ROLES}, f"the Trust view shows {ROLES} verified")
    rows = trust_rows(d)
    digest = attr(d, "#policy-digest [data-full]", "data-full")
    check(digest is not None and len(digest) == 64, f"the backend policy digest is shown: {digest}")
    for role in ROLES:
        r = rows[role]
        check(len(r["measurement"] or "") == 96 and len(r["chip"] or "") == 128 and len(r["model"] or "") == 64, f"{role}: measurement, chip id and model identity")
        check(r["tcb"].startswith("boot ") and r["age"].endswith(" s"), f"{role}: TCB {r['tcb']!r}, evidence age {r['age']!r}")
        scheme = json.loads(r["schemeJson"] or "{}")
        check(r["scheme"] == "sealed" and scheme.get("role") == role and scheme["protocol"]["executor"] == "sealed", f"{role}: the attested scheme, {r['scheme']!r}")
        check(r["policy"] == digest, f"{role}: checked against the attested policy")


def stopped_backend(d, pid, screenshot):
    os.kill(pid, signal.SIGSTOP)
    print(f"reranker (pid {pid}) stopped with SIGSTOP", flush=True)
    want = {"embedder": "verified", "reranker": "unavailable", "generator": "verified"}
    wait(d, 60, lambda d: statuses(d) == want, "the Trust view marks the stopped reranker unavailable, the others verified")
    r = trust_rows(d)["reranker"]
    check(r["reason"] != "" and r["measurement"] is None, f"the reranker row gives its reason ({r['reason']}) and no measurement")
    save_screenshot(d, screenshot)
    print(f"screenshot: {screenshot}", flush=True)
    os.kill(pid, signal.SIGCONT)
    wait(d, 60, lambda d: statuses(d) == {r: "verified" for r in ROLES}, "the reranker is verified again once it continues")
    check(True, "the continued reranker is verified again")


def save_screenshot(d, path):
    """The whole page, not only the window."""
    shot = d.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))


def no_content_in_logs(d, state, key):
    entries = d.get_log("browser")
    severe = [e["message"] for e in entries if e.get("level") == "SEVERE"]
    check(not severe, f"no errors in the browser console: {severe}")
    check(not any(s in e["message"] for e in entries for s in SECRETS + [key]), f"the browser console holds no document or question text, nor the key ({len(entries)} entries)")
    services = glob.glob(os.path.join(state, "up", "logs", "*.log"))
    logs = services + [os.path.join(state, "up.log")]
    leaks = [(os.path.basename(p), s) for p in logs for s in SECRETS if s in open(p, errors="replace").read()]
    check(not leaks, f"no document or question text in the {len(logs)} service logs: {leaks}")
    # gelo up prints the key once to its user (up.log is its terminal here); no service logs it.
    leaks = [os.path.basename(p) for p in services if key in open(p, errors="replace").read()]
    check(not leaks, f"the API key is in no service log: {leaks}")


# The other origin's page: every way a page may try the gateway's API. `window.results`
# maps each attempt to `blocked` (the fetch failed), `opaque` (no-cors: sent, unreadable)
# or `read STATUS` (the page could read the answer: a failure of this check).
OTHER_ORIGIN_PAGE = """<!doctype html><meta charset="utf-8"><title>another origin</title><script>
const target = "http://GATEWAY";
const json = {"Content-Type": "application/json"};
const withKey = Object.assign({Authorization: "Bearer KEY"}, json);
const chat = JSON.stringify({model: "gelo-rag", messages: [{role: "user", content: "What do bees do?"}], max_tokens: 4});
const doc = JSON.stringify({documents: [{name: "planted.txt", text: "Planted by another origin."}]});
async function attempt(name, path, init) {
  try {
    const r = await fetch(target + path, init);
    if (r.type === "opaque") return [name, "opaque"];
    await r.text();
    return [name, "read " + r.status];
  } catch (e) {
    return [name, "blocked"];
  }
}
window.results = null;
Promise.all([
  attempt("chat", "/v1/chat/completions", {method: "POST", headers: json, body: chat, credentials: "omit"}),
  attempt("chat with credentials", "/v1/chat/completions", {method: "POST", headers: json, body: chat, credentials: "include"}),
  attempt("chat with the key", "/v1/chat/completions", {method: "POST", headers: withKey, body: chat, credentials: "include"}),
  attempt("documents", "/v1/documents", {method: "POST", headers: json, body: doc, credentials: "omit"}),
  attempt("documents with credentials", "/v1/documents", {method: "POST", headers: json, body: doc, credentials: "include"}),
  attempt("documents with the key", "/v1/documents", {method: "POST", headers: withKey, body: doc, credentials: "include"}),
  attempt("trust with credentials", "/v1/trust", {credentials: "include"}),
]).then((r) => { window.results = Object.fromEntries(r); });
</script>
"""


def refusals(state, reason):
    return open(os.path.join(state, "up", "logs", "gateway.log"), errors="replace").read().count(reason)


def stored_documents(gelo, state):
    env = dict(os.environ, GELO_UP_DIR=os.path.join(state, "up"))
    out = subprocess.run([os.path.abspath(gelo), "rag", "stats"], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["documents"]


def other_origin(d, gelo, state, gateway, key):
    site = os.path.join(state, "elsewhere")
    os.makedirs(site)
    with open(os.path.join(site, "index.html"), "w") as f:
        f.write(OTHER_ORIGIN_PAGE.replace("GATEWAY", gateway).replace("KEY", key))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        documents, refused = stored_documents(gelo, state), refusals(state, "origin_not_allowed")
        d.get(f"http://127.0.0.1:{server.server_address[1]}/")
        results = wait(d, 60, lambda d: d.execute_script("return window.results;"), "the other origin's attempts finished")
        d.get_log("browser")  # the page's failed fetches, expected: not the console's errors
    finally:
        server.shutdown()
    check(all(v == "blocked" for v in results.values()), f"another origin reads and writes nothing: {results}")
    logged = refusals(state, "origin_not_allowed") - refused
    check(logged >= len(results), f"the gateway refused each of them itself: {logged} origin_not_allowed refusals logged")
    after = stored_documents(gelo, state)
    check(after == documents, f"no document was added: {documents} before, {after} after")


def rebound_name(d, state, gateway):
    port = gateway.rsplit(":", 1)[1]
    before = refusals(state, "host_not_allowed")
    served = {}
    for path, marker in [("/", "doc-form"), ("/v1/trust", "backend_policy_sha256"), ("/openapi.json", "securitySchemes")]:
        d.get(f"http://{REBOUND}:{port}{path}")
        served[path] = marker in d.page_source or d.title == "GELO console"
    d.get_log("browser")
    check(not any(served.values()), f"under {REBOUND} (resolving to the gateway) nothing is served: {served}")
    logged = refusals(state, "host_not_allowed") - before
    check(logged >= len(served), f"the gateway refused the foreign Host itself: {logged} host_not_allowed refusals logged")


def default_screenshot():
    base = os.environ.get("CARGO_TARGET_DIR") or tempfile.gettempdir()
    return os.path.join(base, "console-check", "console.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gelo", required=True, help="the gelo binary: `gelo up` is started for the check")
    ap.add_argument("--screenshot", default=default_screenshot(), help="where to save the screenshot (default: %(default)s)")
    a = ap.parse_args()
    if not (os.path.isfile(a.gelo) and os.access(a.gelo, os.X_OK)):
        raise SystemExit(f"FAIL: {a.gelo} is not an executable gelo binary (cargo build -p gelo)")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as state:
        # Re-verify every 2 s with a 5 s limit, so a frozen backend leaves rotation within seconds.
        quick = ["--small", "--", "--verify-interval", "2", "--retry-interval", "1", "--verify-timeout", "5"]
        proc, ready = start_up(a.gelo, state, args=quick)
        pids = ready["pids"]
        print(f"gelo up ready in {time.time() - t0:.0f} s: http://{ready['http']}/", flush=True)
        d, failure = None, None
        try:
            check(set(ROLES) <= set(pids), f"gelo up reports every service's pid: {pids}")
            d = browser()
            d.get(f"http://{ready['http']}/")
            check(d.title == "GELO console", f"the console loads: {d.title!r}")
            key = ready["api_key"]
            for name, step in [
                ("key", lambda: api_key(d, key)),
                ("documents", lambda: add_documents(d, state)),
                ("ask", lambda: ask(d)),
                ("trust", lambda: trust_verified(d)),
                ("stopped backend", lambda: stopped_backend(d, pids["reranker"], a.screenshot)),
                ("logs", lambda: no_content_in_logs(d, state, key)),
                ("other origin", lambda: other_origin(d, a.gelo, state, ready["http"], key)),
                ("rebound name", lambda: rebound_name(d, state, ready["http"])),
            ]:
                t = time.time()
                step()
                print(f"-- {name}: {time.time() - t:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure ends the same way: a message, the logs kept
            failure = e if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
            if d is not None:
                try:
                    save_screenshot(d, a.screenshot)
                    print(f"screenshot at the failure: {a.screenshot}", file=sys.stderr)
                except WebDriverException:
                    pass
        finally:
            if d is not None:
                d.quit()
            for pid in pids.values():
                try:
                    os.kill(pid, signal.SIGCONT)  # a frozen service would not stop
                except ProcessLookupError:
                    pass
            stop(proc)
        if failure is not None:
            kept = os.path.join(os.path.dirname(a.screenshot) or ".", "logs")
            shutil.copytree(os.path.join(state, "up", "logs"), kept, dirs_exist_ok=True)
            shutil.copy(os.path.join(state, "up.log"), kept)
            raise SystemExit(f"FAIL: {failure}\ngelo up's logs: {kept}")
    print(f"console check passed in {time.time() - t0:.0f} s; screenshot: {a.screenshot}")


if __name__ == "__main__":
    main()
