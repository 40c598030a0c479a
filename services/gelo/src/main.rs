//! `gelo`: one binary for every role and tool. Each subcommand lives in `commands/`.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gelo", version, about = "Confidential RAG on untrusted GPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attestation: mock PKI, issue and verify SEV-SNP evidence, benchmark.
    Attest(commands::attest::Args),
    /// Measure the protocol: masked/plain ratio of transformer-block linears.
    Bench(commands::bench::Args),
    /// Embed texts (one JSON array per text).
    Embed(commands::models::EmbedArgs),
    /// Generate text with a decoder LLM.
    Generate(commands::models::GenerateArgs),
    /// Evaluate a model.
    #[command(subcommand)]
    Eval(commands::models::EvalArgs),
    /// Model files: identity, hub download.
    #[command(subcommand)]
    Model(commands::models::ModelArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Attest(args) => commands::attest::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Embed(args) => commands::models::embed(args),
        Command::Generate(args) => commands::models::generate(args),
        Command::Eval(args) => commands::models::eval(args),
        Command::Model(args) => commands::models::model(args),
    }
}
