#!/usr/bin/env python3
"""The web console in headless Chromium against `gelo up`, driven by Selenium.

    python3 scripts/console_check.py --gelo PATH/TO/gelo [--screenshot FILE]

Starts `gelo up` on loopback ports (as scripts/openai_client_check.py does), opens the
console the gateway serves at `/`, and checks, through the page only:
  1. two documents are added: pasted text and a .md file read by the browser;
  2. a question streams an answer citing at least one of the listed sources;
  3. a citation the gateway flags as unknown is marked as such;
  4. the Trust view lists embedder, reranker and generator as verified, with measurement,
     TCB, chip, model identity, scheme, evidence age and the policy digest;
  5. with the reranker's process stopped (SIGSTOP: `gelo up` shuts everything down when a
     child exits, so the process is frozen rather than killed) the Trust view marks it
     unavailable with a reason, and verified again once it continues (SIGCONT);
  6. neither the browser's console nor any service log holds the document or question text.
Saves a screenshot of the page with the stopped reranker (default under $CARGO_TARGET_DIR,
else /tmp) and prints where. Needs Debian's chromium and chromium-driver and
`pip install -r scripts/console/requirements.txt` (scripts/setup.sh installs them). Exits non-zero with a
message on the first failed step.
"""

import argparse
import base64
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import time

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
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1800", "--no-first-run"]:
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
    check(seen_partial, "the answer's text appeared while it was still streaming")
    status = d.find_element(By.ID, "answer-status").text
    check(attr(d, "#answer", "data-state") == "done", f"the answer completed: {status}")
    sources = [e.get_attribute("data-passage-id") for e in d.find_elements(By.CSS_SELECTOR, "#sources [data-testid=source]")]
    check(len(sources) > 0, f"sources listed with passage ids: {sources}")
    cited = [e.get_attribute("data-passage-id") for e in d.find_elements(By.CSS_SELECTOR, "#answer [data-testid=citation]")]
    check(len(cited) > 0 and set(cited) <= set(sources), f"the answer cites {cited}, all among the sources")
    marked = [e.get_attribute("data-passage-id") for e in d.find_elements(By.CSS_SELECTOR, "#sources [data-cited=true]")]
    check(set(marked) == set(cited), f"the cited sources are marked: {marked}")
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


def no_content_in_logs(d, state):
    entries = d.get_log("browser")
    severe = [e["message"] for e in entries if e.get("level") == "SEVERE"]
    check(not severe, f"no errors in the browser console: {severe}")
    check(not any(s in e["message"] for e in entries for s in SECRETS), f"the browser console holds no document or question text ({len(entries)} entries)")
    logs = glob.glob(os.path.join(state, "up", "logs", "*.log")) + [os.path.join(state, "up.log")]
    leaks = [(os.path.basename(p), s) for p in logs for s in SECRETS if s in open(p, errors="replace").read()]
    check(not leaks, f"no document or question text in the {len(logs)} service logs: {leaks}")


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
            for name, step in [
                ("documents", lambda: add_documents(d, state)),
                ("ask", lambda: ask(d)),
                ("trust", lambda: trust_verified(d)),
                ("stopped backend", lambda: stopped_backend(d, pids["reranker"], a.screenshot)),
                ("logs", lambda: no_content_in_logs(d, state)),
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
