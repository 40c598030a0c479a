//! `gelo bench`: the measurements behind docs/BENCHMARKS.md, kept out of the binary's own
//! code. Transformer-block linears and raw engine products are in [`linears`], whole
//! models in [`model`], a model service under load in [`serve`], the Vulkan engine on one
//! GPU in [`gpu`].

pub mod gpu;
pub mod kernels;
pub mod linears;
pub mod model;
pub mod profile;
pub mod sealed;
pub mod serve;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Block linears (QKV, O, gate+up, down) plain vs masked.
    Protocol(linears::ProtocolArgs),
    /// Raw engine products `x·W` for a range of row counts.
    Engine(linears::EngineArgs),
    /// Whole-model forward (embedding) or decode at real shapes, plain vs masked.
    Model(crate::model::ModelArgs),
    /// The sealed path's int8 products alone, against the machine's copy bandwidth.
    Kernels(crate::kernels::KernelArgs),
    /// The sealed (default) protection on a real model, on the CPU peers' workloads.
    Sealed(crate::sealed::SealedArgs),
    /// A model service as a process over RA-TLS, driven by concurrent clients.
    Serve(crate::serve::ServeArgs),
    /// The Vulkan engine on one GPU: GEMM throughput, decode round trip, masked blocks.
    Gpu(crate::gpu::Args),
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::Protocol(a) => linears::protocol(a),
        What::Engine(a) => linears::engine(a),
        What::Model(a) => crate::model::run(a),
        What::Kernels(a) => crate::kernels::run(a),
        What::Sealed(a) => crate::sealed::run(a),
        What::Serve(a) => crate::serve::run(a),
        What::Gpu(a) => crate::gpu::run(a),
    }
}
