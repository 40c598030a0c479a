//! `gelo up`: the whole private RAG pipeline on this machine — embedder, reranker, generator
//! and gateway as separate processes on loopback, talking RA-TLS with mock attestation.
//!
//! It creates (once) a mock PKI and a policy trusting it under its state folder, starts the
//! three model services (each loads and checks its model before it opens its port), then the
//! gateway pointed at them with their expected model identities, and prints one ready line.
//! Ctrl-C (or SIGTERM) stops everything; the children also get SIGTERM if `gelo up` itself
//! dies (Linux `PR_SET_PDEATHSIG`). `gelo ingest|query|search` find the gateway through the
//! state file it writes.
//!
//! The HTTP API always needs a key: unless `--api-keys-file` names the user's own file,
//! `gelo up` keeps the digests in `STATE/api-keys` (owner-only), makes a fresh key for each
//! run (revoking the previous run's; keys added with `gelo api-key new` stay) and prints it
//! once, with how to use it.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use attest::{MockIssuer, Policy, TrustedRoot};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::gateway::cache_dir;

/// What `gelo up` leaves for the client commands.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct UpState {
    pub grpc: String,
    pub http: String,
    pub policy: PathBuf,
    /// The gateway's model identity (its tokenizer model, the embedder's).
    pub identity: String,
    pub pid: u32,
    /// The HTTP API's keys file (digests only).
    #[serde(default)]
    pub api_keys_file: PathBuf,
}

impl UpState {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }
}

pub fn default_state_dir() -> PathBuf {
    cache_dir().join("up")
}

pub fn state_file(state_dir: Option<&Path>) -> PathBuf {
    state_dir.map(Path::to_path_buf).unwrap_or_else(default_state_dir).join("gateway.json")
}

#[derive(clap::Args, Clone, Debug)]
pub struct UpArgs {
    /// Folder for the mock PKI, the policy, the sealed store and the logs
    /// (default `${GELO_CACHE:-~/.cache/gelo}/up`). The store persists across runs.
    #[arg(long, env = "GELO_UP_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Engine of the model services: cpu, vulkan, vulkan:N or vulkan:NAME.
    #[arg(long, default_value = "cpu")]
    pub engine: String,
    /// Protection of the model services: `sealed` (default; products on the CPU of each
    /// service's TEE) or `masked` (products on the engine under GELO masks; weaker, see
    /// docs/SECURITY.md).
    #[arg(long, default_value = "sealed")]
    pub protection: protocol::Protection,
    /// Embedder model (default: all-MiniLM-L6-v2 from the offline packages).
    #[arg(long)]
    pub embedder_model: Option<PathBuf>,
    /// Reranker model (default: the generator's model, scoring yes/no, which searches and
    /// queries then use only when a request asks: it ranks worse than the embedder alone).
    #[arg(long)]
    pub reranker_model: Option<PathBuf>,
    /// Generator model (default: Qwen2.5-Coder-0.5B-Instruct, or SmolLM2-135M with --small).
    #[arg(long)]
    pub generator_model: Option<PathBuf>,
    /// SmolLM2-135M-Instruct as reranker and generator instead of Qwen2.5-Coder-0.5B-Instruct:
    /// starts and answers faster, and answers far worse (docs/BENCHMARKS.md, "RAG answers").
    #[arg(long, conflicts_with = "qwen")]
    pub small: bool,
    /// Qwen2.5-Coder-0.5B-Instruct (Q4_K_M) as reranker and generator: the default.
    #[arg(long, hide = true)]
    pub qwen: bool,
    /// No reranker: answers from retrieval order.
    #[arg(long)]
    pub no_reranker: bool,
    /// The gateway's gRPC address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// The gateway's OpenAI-compatible HTTP address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,
    /// The HTTP API's keys file (SHA-256 digests; `gelo api-key new --keys-file FILE` adds
    /// one), used as it is. Default: STATE/api-keys, where each run makes a fresh key, prints
    /// it once and revokes the previous run's (keys added there with `gelo api-key new` stay).
    #[arg(long, value_name = "FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Extra `gelo gateway` flags, after `--` (e.g. `-- --retry-interval 1`).
    #[arg(last = true)]
    pub gateway_args: Vec<String>,
}

/// A child service and what it printed when ready.
struct Service {
    role: &'static str,
    child: Child,
    ready: std::sync::mpsc::Receiver<String>,
    log: PathBuf,
    line: Option<String>,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key))
}

impl Service {
    fn start(role: &'static str, args: &[String], pki: &Path, logs: &Path) -> Result<Service> {
        let log = logs.join(format!("{role}.log"));
        let err = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let exe = std::env::current_exe().context("locating the gelo binary")?;
        let mut cmd = Command::new(exe);
        cmd.arg(role)
            .args(args)
            .env("GELO_ATTEST_ISSUER", "mock")
            .env("GELO_MOCK_PKI_DIR", pki)
            .env_remove("GELO_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err));
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().with_context(|| format!("starting the {role}"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("GELO_READY") {
                    let _ = tx.send(line);
                }
            }
        });
        Ok(Service { role, child, ready: rx, log, line: None })
    }

    fn grpc(&self) -> Result<String> {
        self.line
            .as_deref()
            .and_then(|l| field(l, "grpc="))
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{}: no grpc address", self.role))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after `grace`.
    fn stop(&mut self, grace: Duration) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let t = Instant::now();
        while t.elapsed() < grace {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for every service's ready line, failing as soon as one exits.
fn wait_ready(services: &mut [&mut Service], bars: &[ProgressBar], hidden: bool, timeout: Duration) -> Result<()> {
    let t = Instant::now();
    loop {
        let mut pending = 0;
        for (s, bar) in services.iter_mut().zip(bars) {
            if s.line.is_some() {
                continue;
            }
            if let Ok(line) = s.ready.try_recv() {
                let took = t.elapsed().as_secs_f64();
                let msg = format!("ready on {} ({took:.1} s)", field(&line, "grpc=").unwrap_or("?"));
                if hidden {
                    eprintln!("{:>9}: {msg}", s.role);
                }
                bar.finish_with_message(msg);
                s.line = Some(line);
                continue;
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                bar.abandon_with_message("failed");
                bail!(
                    "the {} exited ({status}) before it was ready; its log ({}):\n{}",
                    s.role,
                    s.log.display(),
                    s.log_tail()
                );
            }
            pending += 1;
        }
        if pending == 0 {
            return Ok(());
        }
        if t.elapsed() > timeout {
            bail!("services not ready after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn need(path: PathBuf) -> Result<PathBuf> {
    if !path.exists() {
        bail!("{} is missing: run scripts/fetch-models.sh first (or pass the model's path)", path.display());
    }
    Ok(path)
}

fn spinner(mp: &MultiProgress, role: &str, msg: String) -> ProgressBar {
    let bar = mp.add(ProgressBar::new_spinner());
    bar.set_style(ProgressStyle::with_template("{spinner:.green} {prefix:>9} {msg} {elapsed:.dim}").expect("template"));
    bar.set_prefix(role.to_string());
    bar.set_message(msg);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// `state/policy.yaml`: trusts only the mock PKI and accepts exactly the protection the
/// services run (the gateway and the client commands read it).
fn write_policy(state: &Path, issuer: &MockIssuer, a: &UpArgs) -> Result<PathBuf> {
    let policy = Policy::default()
        .with_roots(vec![TrustedRoot::MockFile(PathBuf::from("mock-pki/ark.pem"))])
        .allow_measurement(issuer.settings().measurement)
        .allow_protection(a.protection.as_str());
    let policy_path = state.join("policy.yaml");
    std::fs::write(
        &policy_path,
        format!(
            "# Written by `gelo up`: trusts only the mock PKI in mock-pki/ (local development).\n{}",
            policy.to_yaml()
        ),
    )?;
    Ok(policy_path)
}

/// The gateway's command line: its tokenizer model, ports, policy, store, each verified
/// service with the identity it must prove, and `gelo up`'s reranking default.
fn gateway_args(
    a: &UpArgs,
    (embedder, id_embedder): (&Path, &str),
    (policy_path, data, keys_file): (&Path, &Path, &Path),
    services: &[Service],
    roles: &[(&'static str, PathBuf, String)],
) -> Result<Vec<String>> {
    let mut args = vec![
        "--model".into(),
        embedder.display().to_string(),
        "--expect-identity".into(),
        id_embedder.to_string(),
        "--listen".into(),
        a.listen.to_string(),
        "--http-listen".into(),
        a.http_listen.to_string(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        "--policy".into(),
        policy_path.display().to_string(),
        "--data-dir".into(),
        data.display().to_string(),
        "--api-keys-file".into(),
        keys_file.display().to_string(),
    ];
    for (s, (role, _, id)) in services.iter().zip(roles) {
        args.extend([format!("--{role}"), s.grpc()?, format!("--{role}-identity"), id.clone()]);
    }
    let rerank_given = a.gateway_args.iter().any(|g| g == "--rerank" || g.starts_with("--rerank="));
    if a.reranker_model.is_none() && !rerank_given {
        // The default reranker is the small generator scoring yes/no: measured on
        // eval/rag/questions.jsonl it ranks worse than the embedder alone, so queries do
        // not use it unless asked (per request `rerank`, or `-- --rerank true`).
        args.extend(["--rerank".into(), "false".into()]);
    }
    args.extend(a.gateway_args.iter().cloned());
    Ok(args)
}

/// The name of the key `gelo up` makes in its own keys file.
const UP_KEY_NAME: &str = "up";

/// The HTTP API's keys file, and the key made for it now (if one was).
struct ApiKeys {
    file: PathBuf,
    new: Option<gateway::http::keys::ApiKey>,
}

impl ApiKeys {
    /// `--api-keys-file` as it is, or `STATE/api-keys` with a fresh key named `up` in place of
    /// the previous run's (keys added with `gelo api-key new` stay). A key made here is
    /// shown by this run only, so each run makes its own rather than keep one nobody saw.
    fn provide(given: Option<&Path>, state: &Path) -> Result<ApiKeys> {
        use gateway::http::keys::{self, KeysError};
        if let Some(file) = given {
            if keys::read(file)?.is_empty() {
                bail!("{} holds no key: add one with `gelo api-key new --keys-file {0}`", file.display());
            }
            return Ok(ApiKeys { file: file.to_path_buf(), new: None });
        }
        let file = state.join("api-keys");
        match keys::remove(&file, UP_KEY_NAME) {
            Ok(_) | Err(KeysError::NoSuchKey { .. }) => {}
            Err(KeysError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let new = super::api_key::new_key(&file, Some(UP_KEY_NAME))?;
        Ok(ApiKeys { file, new: Some(new) })
    }

    /// What the user reads on stderr: the new key, once, and how to use it; else where the
    /// keys are.
    fn summary(&self, http: &str) -> String {
        let file = self.file.display();
        match &self.new {
            Some(key) => {
                let k = key.expose();
                format!(
                    "  API key        {k}\n                 (new, shown once: only its SHA-256 is kept, in {file})\n\n\
                     Use it:  export OPENAI_API_KEY={k}   # the openai clients read it\n        \
                     curl -H \"Authorization: Bearer $OPENAI_API_KEY\" http://{http}/v1/models\n        \
                     the web console asks for it once per browser tab\n"
                )
            }
            None => format!(
                "  API keys       {file} (digests; a key is shown only when it is made:\n                 \
                 `gelo api-key new --keys-file {file}` adds one, `gelo api-key revoke` removes one)\n"
            ),
        }
    }
}

/// Writes the state file the client commands read, then tells the tests (`GELO_SERVICE`,
/// `GELO_READY` lines on stdout) and the user (stderr) where everything is.
fn announce(
    state: &Path,
    gw: &Service,
    services: &[Service],
    (policy_path, keys): (&Path, &ApiKeys),
    id_embedder: &str,
) -> Result<()> {
    let line = gw.line.clone().unwrap_or_default();
    let grpc = field(&line, "grpc=").unwrap_or_default().to_string();
    let http = field(&line, "http=").unwrap_or_default().to_string();
    let up_state = UpState {
        grpc: grpc.clone(),
        http: http.clone(),
        policy: std::fs::canonicalize(policy_path).unwrap_or(policy_path.to_path_buf()),
        identity: id_embedder.to_string(),
        pid: std::process::id(),
        api_keys_file: std::fs::canonicalize(&keys.file).unwrap_or(keys.file.clone()),
    };
    std::fs::write(state_file(Some(state)), serde_json::to_string_pretty(&up_state)?)?;
    for s in services {
        let l = s.line.as_deref().unwrap_or_default();
        println!(
            "GELO_SERVICE role={} grpc={} metrics={} pid={}",
            s.role,
            field(l, "grpc=").unwrap_or("?"),
            field(l, "metrics=").unwrap_or("?"),
            s.child.id()
        );
    }
    eprintln!(
        "\nGELO is up (mock attestation: for local use only)\n  gRPC (RA-TLS)  {grpc}\n  OpenAI API     http://{http}/v1  (models: gelo-embedder, gelo-reranker, gelo-generator, gelo-rag)\n  web console    http://{http}/\n  state, logs    {}\n{}\n\
         Try:  gelo ingest README.md docs/\n      gelo query \"What does GELO keep from the GPU?\"\nCtrl-C stops everything.\n",
        state.display(),
        keys.summary(&http)
    );
    println!(
        "GELO_READY role=up grpc={grpc} http={http} gateway_metrics={} policy={} identity={id_embedder} state={} api_keys_file={}",
        field(&line, "metrics=").unwrap_or("?"),
        up_state.policy.display(),
        state.display(),
        up_state.api_keys_file.display()
    );
    Ok(())
}

pub fn run(a: UpArgs) -> Result<()> {
    // Everything runs on this (the main) thread: PR_SET_PDEATHSIG fires when the thread that
    // spawned a child exits, so children must not be spawned from a pool thread.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let state = a.state_dir.clone().unwrap_or_else(default_state_dir);
    let (logs, data, pki_dir) = (state.join("logs"), state.join("data"), state.join("mock-pki"));
    for d in [&state, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let models = cache_dir().join("models");
    let embedder = need(a.embedder_model.clone().unwrap_or_else(|| models.join("all-minilm-l6-v2")))?;
    let llm = if a.small { "smollm2-135m-instruct.gguf" } else { "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" };
    let generator = need(a.generator_model.clone().unwrap_or_else(|| models.join(llm)))?;
    let reranker = need(a.reranker_model.clone().unwrap_or_else(|| generator.clone()))?;

    let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let hidden = mp.is_hidden();
    if hidden {
        eprintln!("gelo up: state in {}", state.display());
    }

    // 1. Identities every service must prove, and the mock PKI with a policy trusting it.
    let prep = spinner(&mp, "setup", "hashing model files, mock PKI".into());
    let identity = |p: &Path| -> Result<String> { Ok(models::Manifest::of_path(p)?.1.identity().to_string()) };
    let (id_embedder, id_reranker, id_generator) = (identity(&embedder)?, identity(&reranker)?, identity(&generator)?);
    let issuer = MockIssuer::load_or_create(&pki_dir).with_context(|| format!("mock PKI in {}", pki_dir.display()))?;
    let policy_path = write_policy(&state, &issuer, &a)?;
    let keys = ApiKeys::provide(a.api_keys_file.as_deref(), &state)?;
    prep.finish_with_message("model identities checked, mock PKI and policy ready");

    // 2. The model services, loading in parallel.
    let service_args = |model: &Path, id: &str| -> Vec<String> {
        vec![
            "--model".into(),
            model.display().to_string(),
            "--expect-identity".into(),
            id.into(),
            "--engine".into(),
            a.engine.clone(),
            "--protection".into(),
            a.protection.as_str().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
        ]
    };
    let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
    let mut roles: Vec<(&'static str, PathBuf, String)> = vec![("embedder", embedder.clone(), id_embedder.clone())];
    if !a.no_reranker {
        roles.push(("reranker", reranker.clone(), id_reranker.clone()));
    }
    roles.push(("generator", generator.clone(), id_generator.clone()));
    let mut services = Vec::new();
    let mut bars = Vec::new();
    for (role, model, id) in &roles {
        services.push(Service::start(role, &service_args(model, id), &pki_dir, &logs)?);
        bars.push(spinner(&mp, role, format!("loading {} on {} ({})", name(model), a.engine, a.protection.as_str())));
    }
    let result = (|| -> Result<Service> {
        {
            let mut refs: Vec<&mut Service> = services.iter_mut().collect();
            wait_ready(&mut refs, &bars, hidden, Duration::from_secs(900))?;
        }
        // 3. The gateway, pointed at them.
        let files = (policy_path.as_path(), data.as_path(), keys.file.as_path());
        let args = gateway_args(&a, (&embedder, &id_embedder), files, &services, &roles)?;
        let mut gw = Service::start("gateway", &args, &pki_dir, &logs)?;
        let bar = spinner(&mp, "gateway", "verifying backends, opening the store".into());
        wait_ready(&mut [&mut gw], std::slice::from_ref(&bar), hidden, Duration::from_secs(120))?;
        Ok(gw)
    })();
    let mut gw = match result {
        Ok(gw) => gw,
        Err(e) => {
            for s in services.iter_mut().rev() {
                s.stop(Duration::from_secs(5));
            }
            return Err(e);
        }
    };

    // 4. Tell the clients where it is, and the user.
    drop(mp);
    announce(&state, &gw, &services, (&policy_path, &keys), &id_embedder)?;

    // 5. Until Ctrl-C, SIGTERM, or a child dies.
    let exited = rt.block_on(async {
        let watch = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                for s in services.iter_mut().chain(std::iter::once(&mut gw)) {
                    if let Ok(Some(status)) = s.child.try_wait() {
                        return Some((s.role, status, s.log.clone()));
                    }
                }
            }
        };
        tokio::select! {
            _ = super::serve::shutdown_signal() => None,
            e = watch => e,
        }
    });
    eprintln!("stopping...");
    gw.stop(Duration::from_secs(10));
    for s in services.iter_mut().rev() {
        s.stop(Duration::from_secs(10));
    }
    let _ = std::fs::remove_file(state_file(Some(&state)));
    match exited {
        Some((role, status, log)) => bail!("the {role} exited ({status}); see {}", log.display()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use gateway::http::keys;

    use super::*;

    #[test]
    fn each_run_makes_its_own_key_owner_only_and_keeps_the_user_s() {
        let state = tempfile::tempdir().unwrap();
        let first = ApiKeys::provide(None, state.path()).unwrap();
        let file = state.path().join("api-keys");
        assert_eq!(first.file, file);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let k1 = first.new.expect("a key made");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(k1.expose()), "only the digest is stored: {text}");
        let summary = ApiKeys { file: file.clone(), new: Some(k1) }.summary("127.0.0.1:8080");
        assert!(
            summary.contains("export OPENAI_API_KEY=gelo-") && summary.contains("Authorization: Bearer"),
            "{summary}"
        );

        let mine = super::super::api_key::new_key(&file, Some("mine")).unwrap();
        let second = ApiKeys::provide(None, state.path()).unwrap();
        let entries = keys::read(&file).unwrap();
        let digests: Vec<_> = entries.iter().map(|e| e.digest).collect();
        let k2 = second.new.unwrap();
        assert_eq!(digests, [mine.digest(), k2.digest()], "the previous run's key is revoked, the user's kept");

        // A file of the user's is used as it is, and must hold a key.
        let theirs = state.path().join("theirs");
        keys::append(&theirs, &mine.digest(), None).unwrap();
        let given = ApiKeys::provide(Some(&theirs), state.path()).unwrap();
        assert!(given.new.is_none() && given.file == theirs);
        assert_eq!(keys::read(&theirs).unwrap().len(), 1);
        std::fs::write(&theirs, "# none\n").unwrap();
        assert!(ApiKeys::provide(Some(&theirs), state.path()).is_err());
    }
}
