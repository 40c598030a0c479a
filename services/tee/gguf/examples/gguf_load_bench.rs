//! Times what a model load costs: opening a GGUF file, dequantizing every tensor to f32, and
//! rebuilding the tokenizer from metadata.
//!
//!     cargo run -p gelo-gguf --example gguf_load_bench -- PATH.gguf

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: gguf_load_bench PATH.gguf")?;
    let t = Instant::now();
    let file = gguf::GgufFile::open(&path)?;
    println!(
        "open: {:.3} s ({} tensors, {} metadata keys)",
        t.elapsed().as_secs_f64(),
        file.tensors().len(),
        file.metadata().len()
    );

    let t = Instant::now();
    let mut elements = 0usize;
    let mut checksum = 0f64;
    let mut per_type = std::collections::BTreeMap::<String, (usize, f64)>::new();
    for info in file.tensors() {
        let start = Instant::now();
        let data = file.tensor_f32(&info.name)?;
        let entry = per_type.entry(info.dtype.to_string()).or_default();
        entry.0 += data.len();
        entry.1 += start.elapsed().as_secs_f64();
        elements += data.len();
        checksum += data.iter().step_by(4099).map(|&v| v as f64).sum::<f64>();
    }
    let secs = t.elapsed().as_secs_f64();
    for (dtype, (n, s)) in &per_type {
        println!("  {dtype:>5}: {n:>10} values in {s:.3} s ({:.0} M values/s)", *n as f64 / s / 1e6);
    }
    println!(
        "dequantize all: {secs:.3} s, {elements} values ({:.0} M values/s, {:.2} GB/s of f32 out; checksum {checksum:.4})",
        elements as f64 / secs / 1e6,
        elements as f64 * 4.0 / secs / 1e9
    );

    let t = Instant::now();
    let tok = file.tokenizer()?;
    println!("tokenizer: {:.3} s ({} tokens)", t.elapsed().as_secs_f64(), tok.tokenizer.get_vocab_size(true));
    Ok(())
}
