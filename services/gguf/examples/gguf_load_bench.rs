//! Times what a model load costs: opening a GGUF file, dequantizing every tensor to f32, and
//! rebuilding the tokenizer from metadata.
//!
//!     cargo run -p gelo-gguf --example gguf_load_bench -- PATH.gguf

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: gguf_load_bench PATH.gguf")?;
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
    for info in file.tensors() {
        let data = file.tensor_f32(&info.name)?;
        elements += data.len();
        checksum += data.iter().step_by(4099).map(|&v| v as f64).sum::<f64>();
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "dequantize all: {secs:.3} s, {elements} values ({:.0} M values/s, {:.2} GB/s of f32 out; checksum {checksum:.4})",
        elements as f64 / secs / 1e6,
        elements as f64 * 4.0 / secs / 1e9
    );

    let t = Instant::now();
    let tok = file.tokenizer()?;
    println!(
        "tokenizer: {:.3} s ({} tokens)",
        t.elapsed().as_secs_f64(),
        tok.tokenizer.get_vocab_size(true)
    );
    Ok(())
}
