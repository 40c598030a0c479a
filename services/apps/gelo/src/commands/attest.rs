//! `gelo attest`: the attestation tools. `mock-pki` makes a mock AMD-shaped PKI, `issue`
//! writes evidence (mock or hardware), `verify` judges evidence against a policy (exit
//! status 0 when accepted, 1 when rejected, 2 when it could not judge), `bench` times
//! issuing and verifying.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attest::issuer::{self, default_mock_pki_dir, parse_hex};
use attest::{
    ExpectedBinding, HardwareIssuer, MockIssuer, MockSettings, Policy, ReportIssuer, ServiceClaims, TrustedRoot,
    Verifier,
};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Create (or load) a mock ARK/ASK/VCEK PKI in a folder.
    MockPki(MockPkiArgs),
    /// Issue evidence for given identities and nonce, written as a file.
    Issue(IssueArgs),
    /// Verify evidence against a policy and an expected binding.
    Verify(VerifyArgs),
    /// Time issuing and verifying evidence with the mock chain.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct MockPkiArgs {
    /// Folder for ark.pem, ask.pem, vcek.pem, the ASK/VCEK keys and measurement.hex.
    #[arg(long)]
    out: PathBuf,
    /// Launch digest (48 bytes hex) the mock reports; kept in measurement.hex.
    #[arg(long)]
    measurement: Option<String>,
}

#[derive(clap::Args)]
struct IssueArgs {
    /// auto (hardware when /dev/sev-guest exists), mock or hardware.
    #[arg(long, default_value = "auto")]
    issuer: String,
    /// Mock PKI folder (created if missing). Default: $GELO_MOCK_PKI_DIR or ~/.cache/gelo/mock-pki.
    #[arg(long)]
    mock_pki: Option<PathBuf>,
    /// SHA-256 of the model manifest (64 hex digits).
    #[arg(long)]
    model_identity: String,
    /// Protocol settings as JSON (their canonical SHA-256 is the scheme identity).
    #[arg(long, conflicts_with = "scheme_file")]
    scheme_json: Option<String>,
    /// File with the protocol settings JSON.
    #[arg(long)]
    scheme_file: Option<PathBuf>,
    /// Role; defaults to the "role" in the scheme JSON.
    #[arg(long)]
    role: Option<String>,
    /// SHA-256 of the service's TLS SubjectPublicKeyInfo (64 hex digits).
    #[arg(long, default_value = "0000000000000000000000000000000000000000000000000000000000000000")]
    tls_spki_sha256: String,
    /// Nonce (hex, up to 64 bytes).
    #[arg(long)]
    nonce: String,
    /// Mock only: launch digest to report (48 bytes hex).
    #[arg(long)]
    measurement: Option<String>,
    /// Mock only: set the guest policy's DEBUG bit.
    #[arg(long)]
    debug: bool,
    /// Hardware only: folder with a cached vcek.der/pem (and optional ark/ask).
    #[arg(long)]
    vcek_cache: Option<PathBuf>,
    /// Where to write the evidence (protobuf gelo.v1.Evidence).
    #[arg(long)]
    out: PathBuf,
    /// Also write report.bin, ark.pem, ask.pem and vcek.pem here (for snpguest and friends).
    #[arg(long)]
    export: Option<PathBuf>,
}

#[derive(clap::Args)]
struct VerifyArgs {
    /// Evidence file written by `gelo attest issue` (protobuf gelo.v1.Evidence).
    #[arg(long)]
    evidence: PathBuf,
    /// Policy file (JSON or YAML).
    #[arg(long)]
    policy: PathBuf,
    /// Expected model identity (hex); omitted: any (the policy's allowlist still applies).
    #[arg(long)]
    model_identity: Option<String>,
    /// Expected scheme identity (hex).
    #[arg(long, conflicts_with = "scheme_json")]
    scheme_identity: Option<String>,
    /// Expected protocol settings as JSON (hashed to the scheme identity).
    #[arg(long)]
    scheme_json: Option<String>,
    /// Expected SHA-256 of the peer's TLS SPKI (hex); omitted: any key (offline checks only).
    #[arg(long)]
    tls_spki_sha256: Option<String>,
    /// The nonce the evidence must be bound to (hex).
    #[arg(long)]
    nonce: String,
    /// Print the verdict as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Timed repetitions of each operation.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Mock PKI folder (created if missing).
    #[arg(long)]
    mock_pki: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::MockPki(a) => mock_pki(a),
        What::Issue(a) => issue(a),
        What::Verify(a) => verify(a),
        What::Bench(a) => bench(a),
    }
}

fn mock_pki(args: MockPkiArgs) -> Result<()> {
    let issuer = MockIssuer::load_or_create(&args.out)?;
    let mut measurement = issuer.settings().measurement;
    if let Some(hex) = &args.measurement {
        measurement = parse_hex::<48>("--measurement", hex)?;
        let path = args.out.join(issuer::MOCK_MEASUREMENT_FILE);
        std::fs::write(&path, format!("{}\n", hex::encode(measurement))).with_context(|| path.display().to_string())?;
    }
    let pki = issuer.pki();
    println!("mock PKI      {}", args.out.display());
    println!("root sha256   {}", pki.root_fingerprint());
    println!("chip id       {}", hex::encode(pki.chip_id()));
    println!("measurement   {}", hex::encode(measurement));
    println!("\n# a policy that trusts this mock root (never trusted by default):");
    let policy = Policy::default()
        .with_roots(vec![TrustedRoot::MockFile(args.out.join("ark.pem"))])
        .allow_measurement(measurement);
    print!("{}", policy.to_yaml());
    Ok(())
}

fn report_issuer(args: &IssueArgs) -> Result<Arc<dyn ReportIssuer>> {
    let mock = || -> Result<Arc<dyn ReportIssuer>> {
        let dir = args.mock_pki.clone().unwrap_or_else(default_mock_pki_dir);
        let mut issuer = MockIssuer::load_or_create(&dir)?;
        let mut settings: MockSettings = issuer.settings().clone();
        if let Some(m) = &args.measurement {
            settings.measurement = parse_hex::<48>("--measurement", m)?;
        }
        settings.debug = args.debug;
        issuer = issuer.with_settings(settings);
        tracing::warn!(pki = %dir.display(), "issuing MOCK evidence: it proves nothing about this host");
        Ok(Arc::new(issuer))
    };
    let hardware = || -> Result<Arc<dyn ReportIssuer>> {
        if args.measurement.is_some() || args.debug {
            bail!("--measurement and --debug apply to the mock issuer only");
        }
        let mut issuer = HardwareIssuer::open()?;
        if let Some(dir) = &args.vcek_cache {
            issuer = issuer.with_vcek_cache(dir);
        }
        Ok(Arc::new(issuer))
    };
    match args.issuer.as_str() {
        "mock" => mock(),
        "hardware" => hardware(),
        "auto" if Path::new(issuer::SEV_GUEST_DEVICE).exists() => hardware(),
        "auto" => mock(),
        other => bail!("--issuer {other}: expected auto, mock or hardware"),
    }
}

fn issue(args: IssueArgs) -> Result<()> {
    let scheme_json = match (&args.scheme_json, &args.scheme_file) {
        (Some(json), _) => json.clone(),
        (None, Some(path)) => std::fs::read_to_string(path).with_context(|| path.display().to_string())?,
        (None, None) => bail!("give --scheme-json or --scheme-file"),
    };
    let role = match &args.role {
        Some(role) => role.clone(),
        None => serde_json::from_str::<serde_json::Value>(&scheme_json)
            .ok()
            .and_then(|v| v.get("role").and_then(|r| r.as_str()).map(str::to_owned))
            .unwrap_or_default(),
    };
    let claims =
        ServiceClaims { model_identity: parse_hex::<32>("--model-identity", &args.model_identity)?, scheme_json, role };
    let nonce = hex::decode(&args.nonce).context("--nonce is not hex")?;
    let tls = parse_hex::<32>("--tls-spki-sha256", &args.tls_spki_sha256)?;
    let issuer = report_issuer(&args)?;
    let evidence = attest::issue_evidence(issuer.as_ref(), &claims, tls, &nonce)?;
    std::fs::write(&args.out, evidence.to_bytes()).with_context(|| args.out.display().to_string())?;
    if let Some(dir) = &args.export {
        export(dir, &evidence)?;
    }
    println!(
        "wrote {} ({} evidence, {} bytes; scheme identity {})",
        args.out.display(),
        evidence.issuer,
        evidence.to_bytes().len(),
        hex::encode(evidence.scheme_identity)
    );
    Ok(())
}

/// The report and chain in the file names `snpguest` looks for.
fn export(dir: &Path, evidence: &attest::Evidence) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    std::fs::write(dir.join("report.bin"), &evidence.report)?;
    for (name, der) in [("ark", &evidence.ark_der), ("ask", &evidence.ask_der), ("vcek", &evidence.vcek_der)] {
        std::fs::write(dir.join(format!("{name}.pem")), attest::evidence::certificate_pem(der)?)?;
    }
    Ok(())
}

/// Exit status of `verify` when it could not judge the evidence (unreadable file, bad
/// policy, bad flag): 2, like a usage error, so that 1 always means "rejected".
const EXIT_NOT_JUDGED: i32 = 2;

fn verify(args: VerifyArgs) -> Result<()> {
    let (bytes, policy, expected) = match verify_inputs(&args) {
        Ok(inputs) => inputs,
        Err(e) => {
            if args.json {
                println!("{}", serde_json::json!({ "accepted": false, "error": format!("{e:#}") }));
            }
            eprintln!("error: {e:#}");
            std::process::exit(EXIT_NOT_JUDGED)
        }
    };
    match Verifier::new().verify_bytes(&bytes, &expected, &policy) {
        Ok(verified) => {
            if args.json {
                println!("{}", serde_json::json!({ "accepted": true, "verified": verified.summary() }));
            } else {
                let s = verified.summary();
                println!("accepted: {} evidence from root {}", s.issuer, s.root);
                println!("  measurement     {}", s.measurement);
                println!("  model identity  {}", s.model_identity);
                println!("  scheme identity {}", s.scheme_identity);
                println!("  role            {}", s.role);
                println!("  chip id         {}", s.chip_id);
                println!("  reported TCB    {}", s.reported_tcb);
            }
            Ok(())
        }
        Err(e) => {
            if args.json {
                println!("{}", serde_json::json!({ "accepted": false, "reason": e.reason(), "detail": e.to_string() }));
            } else {
                println!("rejected: {}: {e}", e.reason());
            }
            std::process::exit(1)
        }
    }
}

/// The evidence bytes, the policy and the expected binding `verify` judges by.
fn verify_inputs(args: &VerifyArgs) -> Result<(Vec<u8>, Policy, ExpectedBinding)> {
    let bytes = std::fs::read(&args.evidence).with_context(|| args.evidence.display().to_string())?;
    let policy = Policy::from_file(&args.policy)?;
    let scheme_identity = match (&args.scheme_identity, &args.scheme_json) {
        (Some(hex), _) => Some(parse_hex::<32>("--scheme-identity", hex)?),
        (None, Some(json)) => Some(attest::scheme_identity(json)?),
        (None, None) => None,
    };
    let expected = ExpectedBinding {
        model_identity: args.model_identity.as_deref().map(|h| parse_hex::<32>("--model-identity", h)).transpose()?,
        scheme_identity,
        tls_spki_sha256: args
            .tls_spki_sha256
            .as_deref()
            .map(|h| parse_hex::<32>("--tls-spki-sha256", h))
            .transpose()?,
        nonce: hex::decode(&args.nonce).context("--nonce is not hex")?,
    };
    Ok((bytes, policy, expected))
}

fn bench(args: BenchArgs) -> Result<()> {
    let dir = args.mock_pki.unwrap_or_else(default_mock_pki_dir);
    let started = Instant::now();
    let issuer = MockIssuer::load_or_create(&dir)?;
    println!("mock PKI ready in {:.2} s ({})", started.elapsed().as_secs_f64(), dir.display());
    let claims = ServiceClaims {
        model_identity: [7; 32],
        scheme_json: r#"{"role":"embedder","mask":"haar","shield":{"k":8,"energy":4.0}}"#.into(),
        role: "embedder".into(),
    };
    let nonce = attest::random_nonce();
    let tls = [9; 32];
    let policy = Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(issuer.pki().ark_pem())])
        .allow_measurement(issuer.settings().measurement);
    let expected = ExpectedBinding {
        model_identity: Some(claims.model_identity),
        scheme_identity: Some(claims.scheme_identity()?),
        tls_spki_sha256: Some(tls),
        nonce: nonce.to_vec(),
    };
    // Warm-up: root parsing, caches.
    let evidence = attest::issue_evidence(&issuer, &claims, tls, &nonce)?;
    Verifier::new().verify(&evidence, &expected, &policy)?;

    let n = args.iterations.max(1);
    let mut issue_times = Vec::with_capacity(n);
    let mut verify_times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let e = attest::issue_evidence(&issuer, &claims, tls, &nonce)?;
        issue_times.push(t.elapsed());
        let bytes = e.to_bytes();
        let t = Instant::now();
        Verifier::new().verify_bytes(&bytes, &expected, &policy)?;
        verify_times.push(t.elapsed());
    }
    println!("{:<28} {:>10} {:>10} {:>10}", "operation (mock chain)", "median ms", "mean ms", "p95 ms");
    for (name, times) in [("issue evidence", &mut issue_times), ("verify evidence (bytes)", &mut verify_times)] {
        let (median, mean, p95) = stats(times);
        println!("{name:<28} {median:>10.3} {mean:>10.3} {p95:>10.3}");
    }
    println!("{n} iterations each");
    Ok(())
}

fn stats(times: &mut [Duration]) -> (f64, f64, f64) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = times.iter().map(|d| ms(*d)).sum::<f64>() / times.len() as f64;
    (ms(times[times.len() / 2]), mean, ms(times[(times.len() * 95 / 100).min(times.len() - 1)]))
}
