//! `gelo`: one binary for every role and tool. Each subcommand lives in `commands/`.

mod commands;

/// Activations and engine results are tens of megabytes per call; glibc serves such blocks
/// with fresh mmaps (page faults and zeroing every time), mimalloc reuses them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use server::{Role, config::Layered};

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
    Bench(bench::Args),
    /// Serve an embedding model over gRPC (RA-TLS, masked).
    Embedder(commands::serve::ServiceArgs),
    /// Serve a reranking model over gRPC (RA-TLS, masked).
    Reranker(commands::serve::ServiceArgs),
    /// Serve a generation model over gRPC (RA-TLS, masked, streaming).
    Generator(commands::serve::ServiceArgs),
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
    /// Serve the RAG gateway: attested routing, sealed document store, gRPC and OpenAI HTTP.
    Gateway(Box<commands::gateway::GatewayArgs>),
    /// Run the whole pipeline on this machine (mock attestation) until Ctrl-C.
    Up(commands::up::UpArgs),
    /// Ingest files into the running gateway's store (`gelo rag ingest`).
    Ingest(commands::rag::IngestArgs),
    /// Ask the running gateway a question; streams the answer with citations (`gelo rag query`).
    Query(commands::rag::QueryArgs),
    /// Retrieve passages from the running gateway (`gelo rag search`).
    Search(commands::rag::SearchArgs),
    /// Clients of a gateway: ingest, query, search, delete, stats, eval, bench.
    #[command(subcommand)]
    Rag(commands::rag::RagCommand),
}

/// The command line; the roles' help names each flag's variable and default, which their
/// typed configurations (not clap) hold.
fn parse() -> Cli {
    use commands::config::document_layers;
    let service = server::ServiceConfig::default();
    let gateway = gateway::GatewayOptions::default();
    let mut cmd = Cli::command();
    for role in attest::Role::ALL.map(attest::Role::as_str) {
        cmd = cmd.mut_subcommand(role, |c| document_layers(c, &service, server::ServiceConfig::env_name));
    }
    cmd = cmd.mut_subcommand("gateway", |c| document_layers(c, &gateway, gateway::GatewayOptions::env_name));
    Cli::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
}

fn main() -> anyhow::Result<()> {
    // A model service may export traces (its configuration says where); everything else
    // only logs.
    let (role, args) = match parse().command {
        Command::Embedder(a) => (Role::Embedder, a),
        Command::Reranker(a) => (Role::Reranker, a),
        Command::Generator(a) => (Role::Generator, a),
        command => return run_tool(command),
    };
    let config = args.config()?;
    let _telemetry = commands::telemetry::init(commands::serve::otlp(role, &config))?;
    commands::serve::run(role, config)
}

/// Every command but the model services.
fn run_tool(command: Command) -> anyhow::Result<()> {
    let _telemetry = commands::telemetry::init(None)?;
    match command {
        Command::Attest(args) => commands::attest::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Embedder(_) | Command::Reranker(_) | Command::Generator(_) => unreachable!("a model service"),
        Command::Embed(args) => commands::models::embed(args),
        Command::Generate(args) => commands::models::generate(args),
        Command::Eval(args) => commands::models::eval(args),
        Command::Model(args) => commands::models::model(args),
        Command::Gateway(args) => commands::gateway::run(*args),
        Command::Up(args) => commands::up::run(args),
        Command::Ingest(args) => commands::rag::run(commands::rag::RagCommand::Ingest(args)),
        Command::Query(args) => commands::rag::run(commands::rag::RagCommand::Query(args)),
        Command::Search(args) => commands::rag::run(commands::rag::RagCommand::Search(args)),
        Command::Rag(cmd) => commands::rag::run(cmd),
    }
}
