//! `gelo proxy`: the gateway's OpenAI-compatible API on this machine's loopback, every
//! request forwarded over RA-TLS to a remote gateway verified against the user's policy
//! (crate `gelo-proxy`). `--check` verifies once and prints what was verified.

use std::net::SocketAddr;

use anyhow::{Result, bail};
use serde_json::json;

use super::{rag::Conn, serve::shutdown_signal};

#[derive(clap::Args, Clone, Debug)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Loopback address to serve the API and the console on (plain HTTP, this machine only).
    #[arg(long, env = "GELO_PROXY_LISTEN", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Verify the gateway once, print what was verified as JSON and exit: 0 verified, 1
    /// refused (the reason in `reason`).
    #[arg(long)]
    pub check: bool,
}

pub fn run(a: ProxyArgs) -> Result<()> {
    if a.conn.insecure {
        bail!("gelo proxy forwards only to a gateway it verified: --insecure is not accepted");
    }
    let target = a.conn.target()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        if !a.check {
            return Ok(proxy::run(a.listen, target, shutdown_signal()).await?);
        }
        match proxy::verify_gateway(&target).await {
            Ok(gateway) => {
                let mut report = gateway.report(&target);
                report["verified"] = json!(true);
                println!("{}", serde_json::to_string_pretty(&report)?);
                Ok(())
            }
            Err(refusal) => {
                let report = json!({
                    "verified": false, "gateway": target.address, "reason": refusal.reason(), "detail": refusal.to_string(),
                });
                println!("{}", serde_json::to_string_pretty(&report)?);
                std::process::exit(1);
            }
        }
    })
}
