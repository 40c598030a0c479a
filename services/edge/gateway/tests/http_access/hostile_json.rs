//! A corpus of hostile JSON bodies against every route that reads one: broken syntax, nesting
//! past any sane depth, numbers past every range, each field of a valid request replaced by
//! every other JSON type, strings and arrays far past their limits, a body over the size
//! limit. Each must get an OpenAI-shaped answer — a 4xx refusal, or the route's own 503 (this
//! pipeline has no backends) — quickly, never a 500 or a dropped connection, and the port
//! must answer normally afterwards.
//!
//! Beyond the structured corpus, [`mutants`] grows it blindly and deterministically, as a
//! fuzzer's mutator would: each valid body with a few random byte flips, replaced bytes,
//! cut, repeated or spliced runs (ASCII only, so every mutant is still a string to send).

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

/// Mutants per route: enough that every field and bracket of each body is hit many times.
const MUTANTS: usize = 128;

/// xorshift64*: the same mutants on every run, from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// [`MUTANTS`] deterministic mutants of `seed` (ASCII), each from one to four mutations;
/// `other` is spliced from.
fn mutants(seed: &str, other: &str, rng: &mut Rng) -> Vec<String> {
    const BYTES: &[u8] = b"{}[]\":,\\-+.0123456789eEtrufalsn \t\nx\x7f";
    let (seed, other) = (seed.as_bytes(), other.as_bytes());
    (0..MUTANTS)
        .map(|_| {
            let mut b = seed.to_vec();
            for _ in 0..=rng.below(4) {
                let i = rng.below(b.len());
                let run = 1 + rng.below(16);
                match rng.below(6) {
                    0 if !b.is_empty() => b[i] ^= 1 << rng.below(7),
                    1 if !b.is_empty() => b[i] = BYTES[rng.below(BYTES.len())],
                    2 => drop(b.drain(i..(i + run).min(b.len()))),
                    3 => {
                        let part = b[i..(i + run).min(b.len())].to_vec();
                        b.splice(i..i, part.repeat(1 + rng.below(64)));
                    }
                    4 => {
                        let j = rng.below(other.len());
                        b.splice(i..i, other[j..(j + run * 4).min(other.len())].iter().copied());
                    }
                    _ => b.insert(i.min(b.len()), BYTES[rng.below(BYTES.len())]),
                }
            }
            String::from_utf8(b).expect("ASCII in, ASCII out")
        })
        .collect()
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
    let mut rng = Rng(0x6765_6c6f_6a73_6f6e);
    let all = templates();
    for (i, (path, template)) in all.iter().enumerate() {
        let other = all[(i + 1) % all.len()].1.to_string();
        for mutant in mutants(&template.to_string(), &other, &mut rng) {
            corpus.push((path, mutant));
        }
    }
    let mutated = corpus.len();
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
    eprintln!(
        "hostile JSON: {} bodies ({mutated} of them mutants), statuses {by_status:?}, slowest {slowest:?}, 0 panics",
        corpus.len()
    );
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
