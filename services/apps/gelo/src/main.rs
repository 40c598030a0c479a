//! `gelo`: one binary for every role and tool. Each subcommand lives in `commands/`.

mod commands;

/// Activations and engine results are tens of megabytes per call; glibc serves such blocks
/// with fresh mmaps (page faults and zeroing every time), mimalloc reuses them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use server::Role;

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
    /// API keys of the gateway's HTTP port: new, list, revoke.
    #[command(subcommand)]
    ApiKey(commands::api_key::ApiKeyCommand),
    /// Ingest files into the running gateway's store (`gelo rag ingest`).
    Ingest(commands::rag::IngestArgs),
    /// Ask the running gateway a question; streams the answer with citations (`gelo rag query`).
    Query(commands::rag::QueryArgs),
    /// Retrieve passages from the running gateway (`gelo rag search`).
    Search(commands::rag::SearchArgs),
    /// Clients of a gateway: ingest, query, search, delete, stats, eval, bench.
    #[command(subcommand)]
    Rag(commands::rag::RagCommand),
    /// Serve a remote gateway's OpenAI API on this machine's loopback, over RA-TLS to a
    /// gateway verified against your policy (`--check`: verify and print what was verified).
    Proxy(commands::proxy::ProxyArgs),
}

/// The command line; the help of the roles' flags, and of the engine and protocol flags of
/// the tools that run a model, names each one's variable and default, which their typed
/// configurations (not clap) hold.
fn command() -> clap::Command {
    use commands::config::document_layers;
    use server::{ServiceConfig, config::ProtocolConfig};
    let mut cmd = Cli::command();
    for role in attest::Role::ALL.map(attest::Role::as_str) {
        cmd = cmd.mut_subcommand(role, document_layers::<ServiceConfig>);
    }
    cmd = cmd.mut_subcommand("gateway", document_layers::<gateway::GatewayOptions>);
    for tool in ["embed", "generate"] {
        cmd = cmd.mut_subcommand(tool, document_layers::<ProtocolConfig>);
    }
    cmd.mut_subcommand("eval", |eval| {
        let names: Vec<String> = eval.get_subcommands().map(|c| c.get_name().to_string()).collect();
        names.iter().fold(eval, |eval, name| eval.mut_subcommand(name, document_layers::<ProtocolConfig>))
    })
}

fn parse() -> Cli {
    Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit())
}

fn main() -> anyhow::Result<()> {
    // A model's load frees its conversion buffers in one burst; mimalloc returns freed
    // pages only after a delay and while other frees happen, so a loaded model's process
    // would keep them resident (measured: SmolLM2 1.57× its file instead of 1.1×).
    // SAFETY: mi_collect only purges the allocator's own free pages.
    tensor::memory::set_release(|| unsafe { libmimalloc_sys::mi_collect(true) });
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
        Command::ApiKey(cmd) => commands::api_key::run(cmd),
        Command::Ingest(args) => commands::rag::run(commands::rag::RagCommand::Ingest(args)),
        Command::Query(args) => commands::rag::run(commands::rag::RagCommand::Query(args)),
        Command::Search(args) => commands::rag::run(commands::rag::RagCommand::Search(args)),
        Command::Rag(cmd) => commands::rag::run(cmd),
        Command::Proxy(args) => commands::proxy::run(args),
    }
}

#[cfg(test)]
mod tests {
    /// The long help of `gelo <path>`.
    fn help(path: &[&str]) -> String {
        let mut cmd = super::command();
        let mut sub = &mut cmd;
        for name in path {
            sub = sub.find_subcommand_mut(name).unwrap_or_else(|| panic!("no subcommand {name}"));
        }
        sub.render_long_help().to_string()
    }

    /// The services and the tools list the same engine and protocol flags, each with its
    /// variable and default from `ProtocolConfig`; the tools' other flags read no variable.
    #[test]
    fn services_and_tools_document_the_protocol_flags_alike() {
        let flags = [
            ("--protection", "[env: GELO_PROTECTION] [default: sealed]"),
            ("--engine", "[env: GELO_ENGINE] [default: cpu]"),
            ("--mask", "[env: GELO_MASK] [default: auto]"),
            ("--shield-rows", "[env: GELO_SHIELD_ROWS] [default: 8]"),
            ("--shield-energy", "[env: GELO_SHIELD_ENERGY] [default: 4.0]"),
            ("--decode-masks", "[env: GELO_DECODE_MASKS] [default: per-sequence]"),
            ("--verify-probes", "[env: GELO_VERIFY_PROBES] [default: 2]"),
            ("--engine-recycle-mib", "[env: GELO_ENGINE_RECYCLE_MIB] [default: 1024]"),
        ];
        for path in
            [&["embedder"][..], &["generator"], &["embed"], &["generate"], &["eval", "beir"], &["eval", "rerank"]]
        {
            let help = help(path);
            for (flag, extra) in flags {
                assert!(help.contains(&format!("{flag} <")), "gelo {path:?} --help lacks {flag}:\n{help}");
                assert!(help.contains(extra), "gelo {path:?} --help lacks `{extra}`:\n{help}");
            }
            assert!(help.contains("U-Verify probes per weight under `masked`"), "{help}");
        }
        let embed = help(&["embed"]);
        assert!(!embed.contains("GELO_MODEL") && !embed.contains("GELO_MASKED"), "{embed}");
        assert!(help(&["embedder"]).contains("[env: GELO_MODEL]"));
        assert!(!help(&["bench", "model"]).contains("GELO_MASK"), "bench's own --mask reads no variable");
    }
}
