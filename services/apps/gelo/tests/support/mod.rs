//! Starting `gelo` processes for tests: mock attestation, ready-line parsing, RA-TLS
//! clients, captured logs.

#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, OnceLock, mpsc},
    time::Duration,
};

use attest::{ExpectedPeer, MockPki, Policy, TrustedRoot, issuer::default_mock_measurement};

/// A model from the offline cache; fails loudly when it has not been fetched.
pub fn model(name: &str) -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/gelo"));
    let path = root.join("models").join(name);
    assert!(path.exists(), "{} is missing: run scripts/fetch-models.sh", path.display());
    path
}

/// The mock PKI shared by every process of the test run (RSA-4096 generation is slow).
pub fn pki_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-e2e-mock-pki");
        MockPki::load_or_create(&dir).expect("mock PKI");
        dir
    })
    .clone()
}

/// A policy trusting the test mock root and its default launch digest.
pub fn policy() -> Arc<Policy> {
    let pki = MockPki::load_or_create(&pki_dir()).expect("mock PKI");
    Arc::new(
        Policy::default()
            .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
            .allow_measurement(default_mock_measurement()),
    )
}

/// A running `gelo` process.
pub struct Proc {
    child: Child,
    pub grpc: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `gelo ARGS...` with mock attestation and waits for its ready line.
    pub fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.log", std::process::id()));
        let err = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gelo"));
        cmd.args(args)
            .env("GELO_ATTEST_ISSUER", "mock")
            .env("GELO_MOCK_PKI_DIR", pki_dir())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning gelo");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("GELO_READY") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(600)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("{name} did not become ready; log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
            }
        };
        let field =
            |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).map(|v| v.parse::<SocketAddr>().unwrap());
        Proc { child, grpc: field("grpc=").expect("grpc address"), metrics: field("metrics="), log }
    }

    pub fn target(&self) -> String {
        self.grpc.to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (a name `kill -s` knows: STOP, CONT, TERM, ...) to the process.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill").args(["-s", signal, &self.child.id().to_string()]).status();
        assert!(ok.is_ok_and(|s| s.success()), "kill -s {signal} {}", self.child.id());
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Scrapes one metric (sum over label sets whose label text contains `filter`).
    pub async fn metric(&self, name: &str, filter: &str) -> f64 {
        let addr = self.metrics.expect("started with --metrics-listen");
        let body = http_get(addr, "/metrics").await;
        body.lines()
            .filter(|l| !l.starts_with('#') && l.starts_with(name) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Minimal HTTP/1.1 GET over TCP (metrics are plain HTTP).
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// An RA-TLS channel to a process, verified against the test policy.
pub async fn connect(p: &Proc, model_identity: Option<[u8; 32]>) -> attest::ratls::AttestedChannel {
    attest::ratls::connect(&p.target(), policy(), ExpectedPeer { model_identity, ..Default::default() }, None)
        .await
        .expect("RA-TLS connect")
}

/// Identity of the model files at `path`.
pub fn identity(path: &Path) -> [u8; 32] {
    models::Manifest::of_path(path).unwrap().1.identity().0
}
