//! A corpus of hostile JSON bodies against every route that reads one: broken syntax, nesting
//! past any sane depth, numbers past every range, each field of a valid request replaced by
//! every other JSON type, strings and arrays far past their limits, a body over the size
//! limit. Each must get an OpenAI-shaped answer — a 4xx refusal, or the route's own 503 (this
//! pipeline has no backends) — quickly, never a 500 or a dropped connection, and the port
//! must answer normally afterwards.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{AccessConfig, ApiKey, gateway, req};

/// Each route with a valid request body, whose fields the corpus replaces one by one.
fn templates() -> Vec<(&'static str, Value)> {
    vec![
        ("/v1/embeddings", json!({ "model": "gelo-embedder", "input": ["a", "b"], "encoding_format": "float" })),
        (
            "/v1/chat/completions",
            json!({
                "model": "gelo-rag",
                "messages": [{ "role": "user", "content": "q" }],
                "stream": true,
                "max_tokens": 8,
                "temperature": 0.5,
                "top_k": 2,
                "stream_options": { "include_usage": true }
            }),
        ),
        (
            "/v1/rerank",
            json!({ "model": "gelo-reranker", "query": "q", "documents": ["a", { "text": "b" }], "top_n": 1 }),
        ),
        ("/v1/documents", json!({ "documents": [{ "name": "a.txt", "text": "Some text.", "title": "A" }] })),
    ]
}

/// Values of every JSON type, and the edges of each.
fn replacements() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1.5e300),
        json!(""),
        json!("\u{0}"),
        json!("x".repeat(1 << 20)),
        json!([]),
        json!([[]]),
        json!({}),
        json!([null, 1, "x", {}]),
        json!((0..20_000).map(|i| i.to_string()).collect::<Vec<_>>()),
        json!({ "text": 1, "content": [], "role": {} }),
    ]
}

/// Raw texts that are not (quite) JSON, or JSON at the edge of what parsers accept.
fn raw_bodies() -> Vec<String> {
    let mut out: Vec<String> = [
        "",
        " ",
        "{",
        "}",
        "[",
        "]",
        "null",
        "true",
        "1",
        "\"s\"",
        "{\"a\":}",
        "{'a': 1}",
        "{\"a\": 1,}",
        "[1,]",
        "{\"a\" 1}",
        "NaN",
        "{\"n\": NaN}",
        "{\"n\": Infinity}",
        "{\"n\": -Infinity}",
        "{\"n\": 1e400}",
        "{\"n\": -1e400}",
        "{\"n\": 123456789012345678901234567890123456789}",
        "{\"s\": \"\\ud800\"}",
        "{\"s\": \"\\u00\"}",
        "{\"s\": \"\\x41\"}",
        "\u{feff}{}",
        "{}{}",
        "{} x",
        "/* c */ {}",
        "{\"a\": 01}",
        "{\"a\": .5}",
        "{\"a\": +1}",
        "{\"a\": tru}",
        "{\"model\": \"gelo-rag\", \"model\": 1}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for depth in [64, 127, 128, 129, 1_000, 100_000] {
        out.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        out.push(format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth)));
        out.push(format!("{{\"input\": {}\"x\"{}}}", "[".repeat(depth), "]".repeat(depth)));
        out.push("[".repeat(depth)); // never closed
    }
    out
}

/// One request; returns the status after checking the reply's shape and time.
async fn send(addr: std::net::SocketAddr, key: &ApiKey, path: &str, body: String) -> (u16, Duration) {
    let t = Instant::now();
    let mut r = req(addr, "POST", path).key(key).h("Content-Type", "application/json");
    r.body = body;
    let reply = r.send().await;
    let took = t.elapsed();
    assert!(reply.status != 500 && reply.status < 600, "{path}: {} {}", reply.head, reply.body);
    if reply.status >= 400 {
        let e: Value = serde_json::from_str(&reply.body).unwrap_or_else(|_| panic!("{path}: not JSON: {}", reply.body));
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{path}: {}", reply.body);
    }
    (reply.status, took)
}

/// A 17 MiB body, written while the reply is read: the gateway may answer and close before
/// it has all of it, so an error writing the rest is expected, not a failure.
async fn oversized(addr: std::net::SocketAddr, key: &ApiKey, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body_len = 17 << 20;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: {body_len}\r\nConnection: close\r\n\r\n",
        key.expose()
    );
    let (mut rd, mut wr) = tokio::net::TcpStream::connect(addr).await.unwrap().into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        wr.write_all(&vec![b' '; body_len]).await
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let t = Instant::now();
    while !String::from_utf8_lossy(&out).contains("\r\n\r\n") {
        assert!(t.elapsed() < Duration::from_secs(30), "no reply to an oversized body");
        match tokio::time::timeout(Duration::from_secs(30), rd.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            other => panic!("{path}: the connection ended without a reply: {other:?}"),
        }
    }
    writer.abort();
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_json_bodies_are_refused_by_type_and_never_break_the_port() {
    let key = ApiKey::generate();
    // No rate limit in the way: this is about the parsers.
    let cfg = AccessConfig { rate_per_second: 1e9, burst: u32::MAX, ..AccessConfig::default() };
    let gw = gateway(cfg, &[&key]).await;
    let a = gw.addr;
    let mut corpus: Vec<(&str, String)> = Vec::new();
    for (path, template) in templates() {
        for raw in raw_bodies() {
            corpus.push((path, raw));
        }
        let fields: Vec<String> = template.as_object().unwrap().keys().cloned().collect();
        for field in &fields {
            for value in replacements() {
                let mut body = template.clone();
                body[field.as_str()] = value;
                corpus.push((path, body.to_string()));
            }
            let mut without = template.clone();
            without.as_object_mut().unwrap().remove(field);
            corpus.push((path, without.to_string()));
        }
    }
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    let mut slowest = Duration::ZERO;
    for (path, body) in corpus.iter().cloned() {
        let (status, took) = send(a, &key, path, body).await;
        *by_status.entry(status).or_default() += 1;
        slowest = slowest.max(took);
    }
    eprintln!("hostile JSON: {} bodies, statuses {by_status:?}, slowest {slowest:?}, 0 panics", corpus.len());
    assert!(slowest < Duration::from_secs(5), "a hostile body took {slowest:?}");
    assert!(by_status.keys().all(|s| [200, 400, 404, 413, 415, 422, 503].contains(s)), "{by_status:?}");
    // Every body that is not JSON, or not an object, is a 400 on every route.
    let raw = raw_bodies().len() * templates().len();
    assert!(by_status.get(&400).is_some_and(|&n| n >= raw), "{by_status:?}");
    // Over the body limit (16 MiB): refused by size.
    for (path, _) in templates() {
        assert_eq!(oversized(a, &key, path).await, 413, "{path}");
    }
    // The port still answers as before.
    let models = req(a, "GET", "/v1/models").key(&key).send().await;
    assert_eq!(models.status, 200, "{}", models.body);
}
