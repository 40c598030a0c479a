//! Configuration from a file, under flags and environment variables.
//!
//! `--config FILE` (or `GELO_CONFIG`) names a YAML or JSON map whose keys are flag names
//! (`model: /models/minilm`, `max-queue: 512`). Each key becomes the `GELO_*` environment
//! variable the flag reads, unless that variable is already set; so a flag on the command
//! line wins over the environment, which wins over the file.

use anyhow::{Context, Result, bail};

pub fn load_config_file() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let from_args = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--config=").map(str::to_string)));
    let Some(path) = from_args.or_else(|| std::env::var("GELO_CONFIG").ok()) else {
        return Ok(());
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading config {path}"))?;
    let map: serde_yaml::Mapping = serde_yaml::from_str(&text).with_context(|| format!("parsing config {path}"))?;
    for (k, v) in map {
        let Some(key) = k.as_str() else { bail!("config {path}: keys must be strings") };
        let value = match v {
            serde_yaml::Value::String(s) => s,
            serde_yaml::Value::Number(n) => n.to_string(),
            serde_yaml::Value::Bool(b) => b.to_string(),
            other => bail!("config {path}: `{key}` must be a string, number or boolean, not {other:?}"),
        };
        let var = format!("GELO_{}", key.to_ascii_uppercase().replace('-', "_"));
        if std::env::var_os(&var).is_none() {
            // SAFETY: called at start-up, before any other thread exists.
            unsafe { std::env::set_var(&var, value) };
        }
    }
    Ok(())
}
