//! `gelo up` as a user meets it: one command starts the pipeline, `gelo ingest` / `search` /
//! `query` talk to it, a Query streams passages then a cited answer, the OpenAI-compatible
//! HTTP API answers with the key `gelo up` printed (and only with it), and SIGTERM stops
//! every process.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use api::v1::{QueryRequest, SearchRequest, query_response::Event, rag_client::RagClient};
use attest::{ExpectedPeer, Policy};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::stack::*;

/// A running `gelo up`; dropping it sends SIGTERM (as Ctrl-C would) and waits.
struct Up {
    child: Child,
    state: PathBuf,
    ready: HashMap<String, String>,
    services: Vec<HashMap<String, String>>,
    log: PathBuf,
    /// The HTTP API's key, as `gelo up` printed it on stderr.
    key: String,
}

fn fields(line: &str) -> HashMap<String, String> {
    line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

impl Up {
    fn start(state: &Path) -> Up {
        let log = state.with_extension("log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_gelo"))
            .args([
                "up",
                "--small",
                "--state-dir",
                state.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            // Every process logs at debug (the services inherit it), so the plaintext scan
            // at the end of the test reads the most talkative logs there are.
            .env("RUST_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("gelo up");
        let mut services = Vec::new();
        let mut ready = None;
        for line in BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok) {
            if line.starts_with("GELO_SERVICE") {
                services.push(fields(&line));
            } else if line.starts_with("GELO_READY role=up") {
                ready = Some(fields(&line));
                break;
            }
        }
        let ready = ready.unwrap_or_else(|| {
            panic!("gelo up did not become ready:\n{}", std::fs::read_to_string(&log).unwrap_or_default())
        });
        let printed = std::fs::read_to_string(&log).unwrap();
        let keys: Vec<&str> = printed
            .match_indices("export OPENAI_API_KEY=")
            .filter_map(|(at, m)| printed[at + m.len()..].split_whitespace().next())
            .collect();
        assert!(keys.len() == 1 && keys[0].starts_with("gelo-"), "gelo up prints one API key: {keys:?}");
        let key = keys[0].to_string();
        Up { child, state: state.to_path_buf(), ready, services, log, key }
    }

    fn http(&self) -> SocketAddr {
        self.ready["http"].parse().unwrap()
    }

    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_gelo")).args(args).env("GELO_UP_DIR", &self.state).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

fn pid_alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

/// Minimal HTTP/1.1 POST of JSON with `key`, if any; returns status and body.
async fn post(addr: SocketAddr, key: Option<&str>, path: &str, body: &Value) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    // Undo chunked transfer encoding (streamed responses).
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut r = rest;
        while let Some((size, tail)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            r = &tail[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    (status, body)
}

/// The share of `text`'s words of four letters or more (citations aside) that `passage` has.
fn word_support(text: &str, passage: &str) -> f32 {
    let words = |t: &str| -> Vec<String> {
        t.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() >= 4).map(str::to_lowercase).collect()
    };
    let mut plain = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let have = words(passage);
    let mine = words(&plain);
    if mine.is_empty() {
        return 0.0;
    }
    mine.iter().filter(|w| have.contains(w)).count() as f32 / mine.len() as f32
}

/// Every passage the answer cites says what the answer says: it has some of the answer's
/// words, and at least half as many as the passage that has most (the answers here are a
/// sentence or two about one document; scripts/citations.py checks sentence by sentence).
fn assert_citations_hold(answer: &str, cited: &[String], passages: &[(String, String)]) {
    let support: Vec<(&str, f32)> =
        passages.iter().map(|(id, text)| (id.as_str(), word_support(answer, text))).collect();
    let best = support.iter().map(|s| s.1).fold(0.0, f32::max);
    for id in cited {
        let s = support.iter().find(|p| p.0 == id).map_or(0.0, |p| p.1);
        assert!(s > 0.0 && s >= best / 2.0, "{id} does not say what the answer says ({s} against {best}): {answer:?}");
    }
}

const DOCS: [(&str, &str, &str); 4] = [
    (
        "volcano.md",
        "# Volcanoes\n\nA volcano erupts when magma from the mantle rises through the crust. Lava flows, ash clouds and pyroclastic flows are the main hazards; Mount Etna in Sicily is one of the most active volcanoes on Earth.",
        "md",
    ),
    (
        "bees.txt",
        "Honey bees communicate the direction and distance of flowers to their hive mates with the waggle dance. A colony has one queen, thousands of female workers and, in summer, a few hundred male drones.",
        "txt",
    ),
    (
        "tea.txt",
        "Green tea and black tea come from the same plant, Camellia sinensis. Black tea is oxidised before drying, green tea is not, which is why green tea keeps more catechins.",
        "txt",
    ),
    (
        "rail.txt",
        "The first public steam railway, the Stockton and Darlington Railway, opened in England in 1825. George Stephenson built its locomotive, Locomotion No. 1.",
        "txt",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gelo_up_runs_the_pipeline_for_the_cli_grpc_and_openai_clients() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("up");
    let mut up = Up::start(&state);
    let roles: Vec<&str> = up.services.iter().map(|s| s["role"].as_str()).collect();
    assert_eq!(roles, ["embedder", "reranker", "generator"]);
    assert_eq!(up.ready["identity"], hex_identity(&minilm()), "the gateway's identity is its tokenizer model's");

    // 1. The CLI: ingest files of every kind, then search.
    let files = dir.path().join("docs");
    std::fs::create_dir_all(&files).unwrap();
    for (name, text, _) in DOCS {
        std::fs::write(files.join(name), text).unwrap();
    }
    let jsonl = dir.path().join("more.jsonl");
    std::fs::write(&jsonl, "{\"_id\": \"q1\", \"title\": \"Quantum dots\", \"text\": \"Quantum dots are semiconductor nanocrystals whose colour depends on their size.\"}\n\n").unwrap();
    let (ok, out, err) = up.cli(&["ingest", files.to_str().unwrap(), jsonl.to_str().unwrap()]);
    assert!(ok, "gelo ingest failed: {err}");
    assert!(out.contains("ingested 5 documents"), "{out}");
    let (ok, out, err) =
        up.cli(&["search", "which insect does a waggle dance?", "--top-k", "2", "--rerank", "false", "--json"]);
    assert!(ok, "gelo search failed: {err}");
    let found: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(found["passages"].as_array().unwrap().len(), 2);
    assert!(found["passages"][0]["document_id"].as_str().unwrap().ends_with("bees.txt"), "{out}");
    let (ok, out, err) = up.cli(&["rag", "delete", "q1"]);
    assert!(ok && out.contains("deleted 1"), "{out} {err}");

    // 2. gRPC over RA-TLS with the policy `gelo up` wrote: passages first, then the answer,
    //    usage, citations, timings; the answer cites only retrieved passages.
    grpc_api(&up).await;
    let (ok, out, err) = up.cli(&["query", "Who built Locomotion No. 1?", "--max-tokens", "24", "--rerank", "false"]);
    assert!(ok, "gelo query failed: {err}");
    assert!(out.contains("Sources:") && out.contains("rail.txt#0"), "{out}");

    // 3. The OpenAI-compatible API.
    openai_api(up.http(), &up.key).await;

    // 4. SIGTERM stops every process.
    let pids: Vec<String> = up.services.iter().map(|s| s["pid"].clone()).collect();
    assert!(pids.iter().all(|p| pid_alive(p)));
    let status = up.stop();
    assert!(status.success(), "gelo up exit: {status}; log:\n{}", std::fs::read_to_string(&up.log).unwrap_or_default());
    tokio::time::sleep(Duration::from_millis(200)).await;
    for p in &pids {
        assert!(!pid_alive(p), "service pid {p} outlived gelo up");
    }
    assert!(!state.join("gateway.json").exists(), "the state file is removed on exit");

    // 5. No document, question or chat text in any log of the run (gelo up's own, the
    //    gateway's and every service's, all at debug level).
    let mut logs = vec![std::fs::read_to_string(&up.log).unwrap()];
    for e in std::fs::read_dir(state.join("logs")).unwrap() {
        logs.push(std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    assert!(logs.len() >= 5, "gelo up and four service logs: {}", logs.len());
    assert!(logs.iter().map(String::len).sum::<usize>() > 10_000, "the debug logs are suspiciously short");
    let secrets = [
        "magma",
        "waggle",
        "Camellia",
        "Stephenson",
        "Locomotion",
        "semiconductor nanocrystals",
        "black tea",
        "steam railway",
        "Say hello",
        "capital of France",
        "Bees dance",
        "green tea",
        "honey bees use",
    ];
    // Written to files, the logs are plain text: colours only on a terminal.
    for log in &logs {
        if let Some(at) = log.find('\u{1b}') {
            let line = log[..at].rfind('\n').map_or(0, |i| i + 1);
            let end = log[at..].find('\n').map_or(log.len(), |j| at + j);
            panic!("a terminal escape code in a log written to a file: {:?}", &log[line..end]);
        }
    }
    // The key is printed once, to gelo up's user (its stderr, `logs[0]`); no service logs it.
    for log in &logs[1..] {
        assert!(!log.contains(&up.key), "the API key in a service log");
    }
    for log in &logs {
        for s in secrets {
            if let Some(at) = log.find(s) {
                let line = log[..at].rfind('\n').map_or(0, |i| i + 1);
                panic!(
                    "plaintext `{s}` in a log line: {}",
                    &log[line..log[at..].find('\n').map_or(log.len(), |j| at + j)]
                );
            }
        }
    }
}

/// gRPC over RA-TLS with the policy `gelo up` wrote: Search reranks when asked (and only
/// then), a Query streams its passages, then the answer, usage, citations and timings, and
/// the answer cites only retrieved passages.
async fn grpc_api(up: &Up) {
    let policy = Arc::new(Policy::from_file(&up.ready["policy"]).unwrap());
    let expected = ExpectedPeer { model_identity: Some(crate::support::identity(&minilm())), ..Default::default() };
    let ch = attest::ratls::connect(&up.ready["grpc"], policy, expected, None).await.expect("RA-TLS to the gateway");
    ch.challenge().await.unwrap();
    let mut client = RagClient::new(ch.channel());
    let s = client
        .search(SearchRequest { query: "How is black tea made?".into(), top_k: 3, rerank: Some(true) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.passages.len(), 3);
    assert!(s.passages.iter().all(|p| p.rerank_score.is_some()), "reranked by the reranker service");
    assert!(s.timings.unwrap().rerank_seconds > 0.0);
    // Unasked, `gelo up`'s default (yes/no) reranker is not used: it ranks worse than the
    // embedder alone (docs/BENCHMARKS.md, "RAG answers").
    let s = client
        .search(SearchRequest { query: "How is black tea made?".into(), top_k: 3, rerank: None })
        .await
        .unwrap()
        .into_inner();
    assert!(s.passages.iter().all(|p| p.rerank_score.is_none()), "reranked unasked");
    let questions =
        ["How is black tea made different from green tea?", "When did the first public steam railway open?"];
    for q in questions {
        let req =
            QueryRequest { question: q.into(), top_k: 3, max_tokens: 40, rerank: Some(false), ..Default::default() };
        let mut stream = client.query(req).await.unwrap().into_inner();
        let mut events = Vec::new();
        while let Some(m) = stream.message().await.unwrap() {
            events.push(m.event.unwrap());
        }
        let Some(Event::Passages(p)) = events.first() else { panic!("passages come first: {events:?}") };
        let retrieved: Vec<String> = p.passages.iter().map(|p| p.passage_id.clone()).collect();
        assert_eq!(retrieved.len(), 3);
        let answer: String =
            events.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.as_str()) } else { None }).collect();
        let text_at: Vec<usize> =
            events.iter().enumerate().filter(|(_, e)| matches!(e, Event::Text(_))).map(|(i, _)| i).collect();
        assert!(!text_at.is_empty(), "no answer text");
        let n = events.len();
        assert!(
            matches!(events[n - 3], Event::Usage(ref u) if u.completion_tokens > 0 && u.prompt_tokens > 0),
            "{events:?}"
        );
        let Event::Citations(c) = &events[n - 2] else { panic!("citations before timings: {events:?}") };
        assert!(
            matches!(events[n - 1], Event::Timings(ref t) if t.generate_seconds > 0.0 && t.first_token_seconds > 0.0)
        );
        assert!(*text_at.last().unwrap() < n - 3, "text comes before usage");
        // The citations, parsed from the streamed text itself, name retrieved passages only.
        let cited = gateway::prompt::parse_citations(&answer);
        assert!(!cited.is_empty(), "the answer cites nothing: {answer:?}");
        for id in &cited {
            assert!(retrieved.contains(id), "{id} was not retrieved ({retrieved:?}); answer {answer:?}");
        }
        assert_eq!(c.passage_ids, cited);
        assert!(c.unknown.is_empty(), "unknown citations {:?} in {answer:?}", c.unknown);
        let texts: Vec<(String, String)> = p.passages.iter().map(|p| (p.passage_id.clone(), p.text.clone())).collect();
        assert_citations_hold(&answer, &cited, &texts);
    }
}

/// The OpenAI-compatible API: embeddings (float and base64), chat (whole and streamed),
/// `gelo-rag`, rerank, and a JSON error for each bad request.
async fn openai_api(http: SocketAddr, key: &str) {
    // Without the key: 401, before anything reaches a model.
    let (code, body) =
        post(http, None, "/v1/chat/completions", &json!({"model": "gelo-generator", "messages": []})).await;
    assert_eq!(code, 401, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["error"]["code"], "invalid_api_key");
    let key = Some(key);
    let (code, body) =
        post(http, key, "/v1/embeddings", &json!({"model": "gelo-embedder", "input": ["green tea", "railway"]})).await;
    assert_eq!(code, 200, "{body}");
    let floats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(floats["data"].as_array().unwrap().len(), 2);
    let v0: Vec<f32> =
        floats["data"][0]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    assert_eq!(v0.len(), 384);
    assert!(floats["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let (code, body) = post(
        http,
        key,
        "/v1/embeddings",
        &json!({"model": "gelo-embedder", "input": "green tea", "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let b64: Value = serde_json::from_str(&body).unwrap();
    let bytes =
        base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap();
    let v1: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(models::ops::cosine(&v0, &v1) > 0.9999, "base64 and float encodings of the same text differ");

    let chat = json!({"model": "gelo-generator", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6, "temperature": 0});
    let (code, body) = post(http, key, "/v1/chat/completions", &chat).await;
    assert_eq!(code, 200, "{body}");
    let c: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(c["object"], "chat.completion");
    assert!(!c["choices"][0]["message"]["content"].as_str().unwrap().is_empty());
    assert_eq!(c["usage"]["completion_tokens"].as_u64().unwrap(), 6);
    assert_eq!(c["choices"][0]["finish_reason"], "length");

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (code, body) = post(http, key, "/v1/chat/completions", &streamed).await;
    assert_eq!(code, 200, "{body}");
    let events: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, c["choices"][0]["message"]["content"].as_str().unwrap(), "greedy: streamed = whole");
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "length"));
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 6);

    let rag = json!({"model": "gelo-rag", "messages": [{"role": "user", "content": "What do honey bees use the waggle dance for?"}],
                     "max_tokens": 32, "temperature": 0, "rerank": false, "top_k": 2});
    let (code, body) = post(http, key, "/v1/chat/completions", &rag).await;
    assert_eq!(code, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    let passage_ids: Vec<&str> = r["passages"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(passage_ids.len(), 2);
    let cited: Vec<String> =
        r["citations"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
    for c in &cited {
        assert!(passage_ids.contains(&c.as_str()), "{body}");
    }
    let texts: Vec<(String, String)> = r["passages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["text"].as_str().unwrap().to_string()))
        .collect();
    assert_citations_hold(r["choices"][0]["message"]["content"].as_str().unwrap(), &cited, &texts);

    let rerank = json!({"model": "gelo-reranker", "query": "capital of France", "documents": ["Paris is the capital of France.", {"text": "Bees dance."}], "top_n": 1});
    let (code, body) = post(http, key, "/v1/rerank", &rerank).await;
    assert_eq!(code, 200, "{body}");
    let rr: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rr["results"].as_array().unwrap().len(), 1);
    assert!(rr["results"][0]["index"].as_u64().unwrap() < 2 && rr["results"][0]["relevance_score"].is_number());

    let (code, body) = post(http, key, "/v1/models", &json!({})).await;
    assert_eq!(code, 405, "{body}");
    for (path, body, want) in [
        ("/v1/embeddings", json!({"model": "text-embedding-3-small", "input": "x"}), 404),
        ("/v1/embeddings", json!({"model": "gelo-embedder", "input": []}), 400),
        ("/v1/embeddings", json!({"model": "gelo-embedder", "input": [1, 2, 3]}), 400),
        ("/v1/embeddings", json!({"model": "gelo-embedder", "input": "many words ".repeat(400)}), 400),
        ("/v1/chat/completions", json!({"model": "gelo-generator", "messages": []}), 400),
        (
            "/v1/chat/completions",
            json!({"model": "gelo-generator", "messages": [{"role": "tool", "content": "x"}]}),
            400,
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gelo-generator", "messages": [{"role": "user", "content": "x"}], "temperature": 7}),
            400,
        ),
        ("/v1/rerank", json!({"query": "q", "documents": []}), 400),
        ("/v1/nothing", json!({}), 404),
    ] {
        let (code, text) = post(http, key, path, &body).await;
        let short = |s: String| s.chars().take(300).collect::<String>();
        assert_eq!(code, want, "{path} {}: {}", short(body.to_string()), short(text.clone()));
        let e: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        assert!(e["error"]["message"].is_string() && e["error"]["type"].is_string(), "{text}");
    }
}
