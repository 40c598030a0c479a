//! What the gateway's HTTP tests share: the offline MiniLM folder, one raw HTTP/1.1
//! exchange read back whole (`Connection: close`), and an embedder needing no model.

#![allow(dead_code)] // each test binary uses its own part

use std::{net::SocketAddr, path::PathBuf};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub fn minilm() -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/gelo"));
    let p = root.join("models/all-minilm-l6-v2");
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Sends `request` (a whole HTTP/1.1 request, `Connection: close`) and reads the reply to
/// the end (no chunked replies: the routes tested this way do not stream).
pub async fn exchange(addr: SocketAddr, request: &str) -> Reply {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no reply head: {text:?}"));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    Reply { status, head: head.to_string(), body: body.to_string() }
}

/// An embedder that maps each text to a small vector of its byte statistics: no model, yet
/// texts of different bytes get different vectors.
pub struct ByteStatsEmbedder;

#[tonic::async_trait]
impl api::v1::embedder_server::Embedder for ByteStatsEmbedder {
    async fn embed(
        &self,
        r: tonic::Request<api::v1::EmbedRequest>,
    ) -> Result<tonic::Response<api::v1::EmbedResponse>, tonic::Status> {
        let embeddings = r
            .into_inner()
            .texts
            .iter()
            .map(|t| {
                let mut v = vec![1.0f32; 4];
                for (i, b) in t.bytes().enumerate() {
                    v[i % 4] += f32::from(b) / 255.0;
                }
                api::v1::Embedding { values: v }
            })
            .collect();
        Ok(tonic::Response::new(api::v1::EmbedResponse { embeddings, ..Default::default() }))
    }
}
