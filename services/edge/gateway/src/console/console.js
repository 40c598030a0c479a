// The GELO console's behaviour: add documents, stream a cited answer, show the trust report.
// It talks to this gateway only (same origin), builds every element with the DOM API (text
// from documents and answers is never parsed as HTML) and writes nothing to the browser's log.
// Every API call carries the API key the user entered, as `Authorization: Bearer`; the key
// lives in this tab's sessionStorage only (never in the address, a cookie or the page).
"use strict";

const GeloConsole = (() => {
  const $ = (id) => document.getElementById(id);

  /** An element with attributes (`text` sets its text) and children. */
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  function setStatus(node, state, message) {
    node.dataset.state = state;
    node.textContent = message;
    node.classList.toggle("error", state === "error" || state === "refused");
  }

  /** The gateway's error body (`{"error": {"message", "code"}}`) as one line. */
  function errorText(status, body) {
    const e = body && body.error;
    return e && e.message ? `${e.message} (${e.code || status})` : `the gateway answered HTTP ${status}`;
  }

  // ---------------------------------------------------------------------------------------
  // The API key

  const KEY_ITEM = "gelo.apiKey";

  function apiKey() {
    try {
      return sessionStorage.getItem(KEY_ITEM) || "";
    } catch (_) {
      return "";
    }
  }

  /** `headers` with the key's Authorization header, if there is a key. */
  function withKey(headers) {
    const key = apiKey();
    if (key !== "") headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  const NO_KEY = "No API key yet: enter the key gelo up printed (or one from gelo api-key new).";

  /** Tells the user the gateway refused the key (HTTP 401), and returns the message. */
  function keyRefused(body) {
    const message = apiKey() === ""
      ? NO_KEY
      : `The gateway refused this API key (${errorText(401, body)}): enter a valid key.`;
    setStatus($("key-status"), apiKey() === "" ? "missing" : "refused", message);
    return message;
  }

  /** An HTTP error as one line; a 401 also marks the key refused. */
  function httpFailure(status, body) {
    return status === 401 ? keyRefused(body) : errorText(status, body);
  }

  async function callJson(method, path, body) {
    const init = { method, headers: withKey({ Accept: "application/json" }) };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    let data = null;
    try {
      data = await r.json();
    } catch (_) {
      data = null;
    }
    if (!r.ok) throw new Error(httpFailure(r.status, data));
    return data;
  }

  /** Checks the key in force with a request that reads nothing from the store. */
  async function checkKey() {
    const status = $("key-status");
    if (apiKey() === "") {
      setStatus(status, "missing", NO_KEY);
      return false;
    }
    setStatus(status, "checking", "Checking the key…");
    try {
      const r = await callJson("GET", "/v1/models");
      setStatus(status, "accepted", `Key accepted: this gateway serves ${r.data.length} model(s).`);
      return true;
    } catch (e) {
      if ($("key-status").dataset.state !== "refused") setStatus(status, "error", `Could not check the key: ${e.message}`);
      return false;
    }
  }

  async function useKey(event) {
    event.preventDefault();
    const input = $("api-key");
    const key = input.value.trim();
    input.value = "";
    if (key === "") {
      setStatus($("key-status"), "missing", NO_KEY);
      return;
    }
    try {
      sessionStorage.setItem(KEY_ITEM, key);
    } catch (_) {
      setStatus($("key-status"), "error", "This browser does not allow session storage for this page: the key cannot be kept.");
      return;
    }
    if (await checkKey()) refreshTrust();
  }

  function forgetKey() {
    try {
      sessionStorage.removeItem(KEY_ITEM);
    } catch (_) {
      // Nothing was kept.
    }
    $("api-key").value = "";
    setStatus($("key-status"), "missing", NO_KEY);
  }

  // ---------------------------------------------------------------------------------------
  // Add documents

  const TEXT_FILE = /\.(txt|md|markdown)$/i;

  async function gatherDocuments() {
    const docs = [];
    const name = $("doc-name").value.trim();
    const text = $("doc-text").value;
    if (text.trim() !== "") {
      if (name === "") throw new Error("give the pasted text a name");
      docs.push({ name, text });
    }
    for (const f of $("doc-files").files) {
      if (!TEXT_FILE.test(f.name)) throw new Error(`${f.name}: only .txt and .md files`);
      docs.push({ name: f.name, text: await f.text() });
    }
    if (docs.length === 0) throw new Error("paste some text or choose a file");
    return docs;
  }

  async function addDocuments(event) {
    event.preventDefault();
    const status = $("doc-status");
    const list = $("doc-result");
    const button = $("doc-submit");
    list.replaceChildren();
    button.disabled = true;
    try {
      const documents = await gatherDocuments();
      setStatus(status, "busy", `Adding ${documents.length} document(s)…`);
      const r = await callJson("POST", "/v1/documents", { documents });
      for (const d of r.documents) {
        list.append(el("li", { "data-testid": "stored-document", "data-id": d.id }, el("code", { text: d.id }), ` — ${d.chunks} passage(s)`));
      }
      for (const k of r.skipped) {
        list.append(el("li", { class: "warn", "data-testid": "skipped-document", "data-id": k.id }, "⚠ skipped ", el("code", { text: k.id }), `: ${k.reason}`));
      }
      const skipped = r.skipped.length ? `, ${r.skipped.length} skipped` : "";
      setStatus(status, "done", `Stored ${r.documents.length} document(s), ${r.chunks} passage(s)${skipped}.`);
      $("doc-form").reset();
    } catch (e) {
      setStatus(status, "error", `Not added: ${e.message}`);
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------------------------------
  // Ask: a streamed gelo-rag answer

  /** Splits `[a, b]` citations out of `text`: passage ids among `known` become links to their
   * source, ids the gateway reported in `unknown` are marked, the rest stays text. */
  function citedFragment(text, known, unknown) {
    const frag = document.createDocumentFragment();
    const re = /\[([^\[\]\n]{1,200})\]/g;
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      frag.append(text.slice(last, m.index));
      last = re.lastIndex;
      const parts = m[1].split(/([,;]\s*)/);
      if (!parts.some((p, i) => i % 2 === 0 && (known.has(p.trim()) || unknown.has(p.trim())))) {
        frag.append(m[0]);
        continue;
      }
      frag.append("[");
      parts.forEach((p, i) => {
        const id = p.trim();
        if (i % 2 === 1) frag.append(p);
        else if (known.has(id)) {
          frag.append(el("a", { href: `#source-${known.get(id)}`, class: "cite", "data-testid": "citation", "data-passage-id": id, text: id }));
        } else if (unknown.has(id)) {
          const title = "not among the passages this answer was given";
          frag.append(el("mark", { class: "cite unknown", "data-testid": "unknown-citation", "data-passage-id": id, title, text: `${id} (unknown)` }));
        } else frag.append(p);
      });
      frag.append("]");
    }
    frag.append(text.slice(last));
    return frag;
  }

  function renderSources(passages, cited) {
    const list = $("sources");
    list.replaceChildren();
    passages.forEach((p, i) => {
      const isCited = cited.has(p.id);
      const scores = [`score ${Number(p.score).toFixed(3)}`];
      if (p.rerank_score !== null && p.rerank_score !== undefined) scores.push(`rerank ${Number(p.rerank_score).toFixed(3)}`);
      list.append(
        el(
          "li",
          { id: `source-${i + 1}`, "data-testid": "source", "data-passage-id": p.id, "data-cited": String(isCited) },
          el("code", { class: "pid", text: p.id }),
          " ",
          el("strong", { text: p.title || p.document_id }),
          ` (${scores.join(", ")})`,
          isCited ? el("span", { class: "badge cited", text: "cited" }) : null,
          el("details", {}, el("summary", { text: "Passage text" }), el("p", { class: "passage", text: p.text })),
        ),
      );
    });
  }

  /** Reads server-sent events from a fetch response, calling `onData` with each `data:`. */
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (data !== "" && onData(data) === false) return;
      }
    }
  }

  async function ask(event) {
    event.preventDefault();
    const question = $("question").value.trim();
    const status = $("answer-status");
    const answer = $("answer");
    if (question === "") {
      setStatus(status, "error", "Type a question first.");
      return;
    }
    const button = $("ask-submit");
    button.disabled = true;
    answer.replaceChildren();
    answer.dataset.state = "streaming";
    answer.setAttribute("aria-busy", "true");
    $("sources").replaceChildren();
    $("unknown-citations").hidden = true;
    setStatus(status, "busy", "Retrieving passages and generating…");
    let text = "";
    let passages = [];
    let cited = [];
    let unknown = [];
    let failure = null;
    let finished = false;
    try {
      const max = parseInt($("max-tokens").value, 10);
      const r = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: withKey({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body: JSON.stringify({
          model: "gelo-rag",
          stream: true,
          temperature: 0,
          max_tokens: Number.isFinite(max) && max > 0 ? max : undefined,
          messages: [{ role: "user", content: question }],
        }),
      });
      if (!r.ok) {
        let body = null;
        try {
          body = await r.json();
        } catch (_) {
          body = null;
        }
        throw new Error(httpFailure(r.status, body));
      }
      await readEvents(r, (data) => {
        if (data === "[DONE]") {
          finished = true;
          return false;
        }
        const chunk = JSON.parse(data);
        if (chunk.error) {
          failure = errorText(502, chunk);
          return false;
        }
        if (Array.isArray(chunk.passages)) {
          passages = chunk.passages;
          renderSources(passages, new Set());
        }
        if (chunk.citations) {
          cited = chunk.citations.citations || [];
          unknown = chunk.citations.unknown_citations || [];
        }
        for (const c of chunk.choices || []) {
          if (c.delta && c.delta.content) {
            text += c.delta.content;
            answer.textContent = text;
          }
        }
        return true;
      });
      if (failure === null && !finished) failure = "the answer stream ended early";
    } catch (e) {
      failure = e.message;
    }
    const known = new Map(passages.map((p, i) => [p.id, i + 1]));
    const unknownIds = new Set(unknown.map((u) => u.replace(/^\[(.*)\]$/, "$1")));
    answer.replaceChildren(citedFragment(text, known, unknownIds));
    renderSources(passages, new Set(cited));
    if (unknown.length) {
      const note = $("unknown-citations");
      note.replaceChildren("⚠ The answer cites what was not among its passages: ", ...unknown.map((u, i) => el("code", { text: (i ? " " : "") + u })));
      note.hidden = false;
    }
    answer.setAttribute("aria-busy", "false");
    answer.dataset.state = failure === null ? "done" : "error";
    if (failure === null) setStatus(status, "done", `Answered from ${passages.length} passage(s), citing ${cited.length}.`);
    else setStatus(status, "error", `The answer failed: ${failure}`);
    button.disabled = false;
  }

  // ---------------------------------------------------------------------------------------
  // Trust

  const MARK = { verified: "✓", refused: "✗", unavailable: "⚠" };

  /** A long hex value, shortened for the table; the whole value in its title and data. */
  function hex(value) {
    if (!value) return el("span", { class: "none", text: "—" });
    const short = value.length > 16 ? `${value.slice(0, 12)}…${value.slice(-4)}` : value;
    return el("code", { class: "hex", title: value, "data-full": value, text: short });
  }

  function schemeCell(scheme) {
    if (scheme === null || scheme === undefined) return el("span", { class: "none", text: "—" });
    const protocol = scheme.protocol || {};
    const label = protocol.executor || scheme.protection || scheme.role || "scheme";
    return el("details", {}, el("summary", { text: label }), el("pre", { text: JSON.stringify(scheme, null, 2) }));
  }

  function trustRow(b) {
    const status = el("td", { class: `state ${b.status}` }, el("span", { class: "badge", text: `${MARK[b.status] || ""} ${b.status}` }));
    if (b.status !== "verified") {
      status.append(" ", el("code", { "data-testid": "reason-code", text: b.reason_code || "" }), el("div", { class: "reason", text: b.reason || "" }));
    }
    const tcb = b.tcb ? `boot ${b.tcb.bootloader} · tee ${b.tcb.tee} · snp ${b.tcb.snp} · µcode ${b.tcb.microcode}` : "—";
    // Out of rotation, a backend proves nothing: show the identity it must prove, marked so.
    const model = b.model_identity ? hex(b.model_identity) : el("span", {}, hex(b.expected_model_identity), b.expected_model_identity ? el("span", { class: "none", text: " (expected)" }) : null);
    const age = b.evidence_age_seconds === null || b.evidence_age_seconds === undefined ? "—" : `${b.evidence_age_seconds.toFixed(1)} s`;
    const issuer = b.issuer === "mock" ? el("span", { class: "mock", text: " (mock)" }) : null;
    return el(
      "tr",
      { "data-testid": "trust-row", "data-role": b.role, "data-status": b.status, class: `row-${b.status}` },
      el("th", { scope: "row", text: b.role }),
      status,
      el("td", {}, el("code", { text: b.endpoint })),
      el("td", { "data-field": "measurement" }, hex(b.measurement), issuer),
      el("td", { "data-field": "tcb", title: "TCB: bootloader, TEE, SNP firmware and microcode security versions", text: tcb }),
      el("td", { "data-field": "chip" }, hex(b.chip_id)),
      el("td", { "data-field": "model" }, model),
      el("td", { "data-field": "scheme" }, schemeCell(b.scheme)),
      el("td", { "data-field": "age", text: age }),
      el("td", { "data-field": "policy" }, hex(b.policy_sha256)),
    );
  }

  let trustBusy = false;

  async function refreshTrust() {
    if (trustBusy) return;
    const status = $("trust-status");
    if (apiKey() === "") {
      setStatus(status, "missing", "Enter the API key above to see the trust report.");
      return;
    }
    trustBusy = true;
    try {
      const r = await callJson("GET", "/v1/trust");
      $("policy-digest").replaceChildren(hex(r.backend_policy_sha256));
      $("trust-body").replaceChildren(...r.backends.map(trustRow));
      const out = r.backends.filter((b) => b.status !== "verified").length;
      const summary = out ? `${out} of ${r.backends.length} not verified` : `all ${r.backends.length} verified`;
      setStatus(status, "done", `${summary}; updated ${new Date().toLocaleTimeString()}`);
    } catch (e) {
      setStatus(status, "error", `Could not read the trust report: ${e.message}`);
    } finally {
      trustBusy = false;
    }
  }

  function start() {
    $("key-form").addEventListener("submit", useKey);
    $("key-forget").addEventListener("click", forgetKey);
    $("doc-form").addEventListener("submit", addDocuments);
    $("ask-form").addEventListener("submit", ask);
    $("trust-refresh").addEventListener("click", refreshTrust);
    setInterval(() => {
      if ($("trust-auto").checked && document.visibilityState === "visible") refreshTrust();
    }, 5000);
    checkKey();
    refreshTrust();
  }

  document.addEventListener("DOMContentLoaded", start);
  return { citedFragment };
})();
