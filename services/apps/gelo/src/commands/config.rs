//! A role's configuration (`gelo embedder|reranker|generator|gateway`) from defaults, a
//! file, the environment and flags, each over the one before.
//!
//! `--config FILE` (or `GELO_CONFIG`) names a YAML or JSON (`.json`) map whose keys are the
//! role's flag names (`model: /models/minilm`, `max-queue: 512`); a key the role does not
//! have is an error. Every flag also reads `GELO_<FLAG>`. The role's flags are all optional
//! to clap: the ones given are serialized under their names and laid over the file and the
//! environment by `server::config::load` (figment), into the role's typed configuration
//! (`server::ServiceConfig`, `gateway::GatewayOptions`), which holds the defaults. Nothing
//! is written to the environment.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Arg, Command};
use serde::Serialize;
use serde_json::Value;
use server::config::{Layered, Sources};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConfigFile {
    /// YAML or JSON file of this command's flags by name (`max-queue: 512`); GELO_*
    /// variables and flags override it, and an unknown key is an error.
    #[arg(long, env = "GELO_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The layers of a role's configuration: `--config`, this process's environment, and the
/// flags given (`flags` serialized by flag name; absent flags serialize as null and are
/// left out).
pub fn sources<'a>(file: &'a ConfigFile, flags: &impl Serialize) -> Result<Sources<'a, Value>> {
    let mut flags = serde_json::to_value(flags)?;
    if let Some(map) = flags.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    Ok(Sources { file: file.config.as_deref(), env, flags })
}

/// `skip_serializing_if` of a switch: an absent `--insecure` leaves the layers below it be.
pub fn is_false(b: &bool) -> bool {
    !*b
}

/// A flag's value checked by the parser of its typed configuration, kept as given.
pub fn checked<T: std::str::FromStr<Err = String>>(s: &str) -> Result<String, String> {
    s.parse::<T>().map(|_| s.to_string())
}

/// Adds `[env: VAR]` and `[default: VALUE]` to the help of `cmd`'s flags that are keys of
/// `T` (a role's configuration, or the `ProtocolConfig` of a tool that runs a model), from
/// `T`'s defaults (clap sees every such flag as optional without a default).
pub fn document_layers<T: Layered + Serialize + Default>(cmd: Command) -> Command {
    let mut defaults = serde_json::to_value(T::default()).unwrap_or_default();
    if let Some(map) = defaults.as_object_mut() {
        for (section, _) in T::SECTIONS {
            if let Some(Value::Object(inner)) = map.remove(*section) {
                map.extend(inner);
            }
        }
    }
    let keys = T::keys();
    cmd.mut_args(|a: Arg| {
        let Some(key) = a.get_long().filter(|k| keys.contains(k)).map(str::to_string) else { return a };
        let mut extra = format!("[env: {}]", T::env_name(&key));
        match defaults.get(&key) {
            Some(Value::String(s)) if !s.is_empty() => extra.push_str(&format!(" [default: {s}]")),
            Some(v @ Value::Number(_)) | Some(v @ Value::Bool(true)) => extra.push_str(&format!(" [default: {v}]")),
            _ => {}
        }
        let long = a.get_long_help().map(|h| format!("{h}\n\n{extra}"));
        let short = a.get_help().map_or(extra.clone(), |h| format!("{h} {extra}"));
        let a = a.help(short);
        match long {
            Some(l) => a.long_help(l),
            None => a,
        }
    })
}
