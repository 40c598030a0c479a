//! How a role's configuration is layered, with [`figment`]: defaults < file < environment <
//! flags.
//!
//! Every layer uses the same keys, the flag names (`max-queue`): the file's keys, the flags
//! the command line gave (serialized, absent ones left out), and `GELO_<KEY>` variables
//! (`GELO_MAX_QUEUE`). Values from the environment stay strings until the typed
//! configuration reads them (lossily: `"512"` is a number where one is wanted, `"true"`,
//! `"yes"` or `"1"` a boolean), exactly as a flag's text would be; the defaults are the
//! configuration's `#[serde(default)]`. A configuration may hold another as a section
//! (`ServiceConfig::protocol`, the `ProtocolConfig` the tools also read) whose keys sit at
//! the top level among its own ([`Layered::SECTIONS`]).
//!
//! The file must only hold keys the role knows (a misspelt key is an error naming it); the
//! environment is only read for those keys, since `GELO_*` also names other things
//! (`GELO_ATTEST_ISSUER`, `GELO_CACHE`, ...).

use std::path::Path;

use figment::{
    Figment, Metadata, Profile, Provider,
    providers::{Format, Json, Serialized, Yaml},
    value::{Dict, Map, Value},
};
use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, DeserializeOwned, Visitor},
};

/// A configuration read from the layers. Keys are its fields (kebab-case), a section's
/// keys in place of its field; a key reads `GELO_<KEY>` unless [`Layered::ENV_NAMES`] names
/// another variable.
pub trait Layered: DeserializeOwned {
    /// `(key, variable)` for keys that do not read `GELO_<KEY>` (a section's keys included).
    const ENV_NAMES: &'static [(&'static str, &'static str)] = &[];

    /// `(field, its keys)` for fields that are a configuration of their own (a section, as
    /// `ServiceConfig::protocol` is a `ProtocolConfig`) whose keys sit at the top level with
    /// this one's: `shield-rows:` in a file, `GELO_SHIELD_ROWS`, `--shield-rows`, never
    /// `protocol:`. [`load`] moves them under the field before the typed configuration reads
    /// them. One level: a section's own sections are not looked at.
    ///
    /// Not `#[serde(flatten)]`: serde reads a flattened struct from values it has buffered
    /// first, which loses what figment adds to them (numbers and switches read from strings,
    /// as `GELO_SHIELD_ROWS=8` needs; the key and layer an error names), and does not list
    /// the struct's fields ([`field_names`]); serde also documents it as unsupported with
    /// `deny_unknown_fields`.
    const SECTIONS: &'static [(&'static str, Keys)] = &[];

    /// The variable `key` reads.
    fn env_name(key: &str) -> String {
        env_name(Self::ENV_NAMES, key)
    }

    /// Every key, in field order: a field, or a section's keys in its place.
    fn keys() -> Vec<&'static str> {
        let section = |f: &str| Self::SECTIONS.iter().find(|(s, _)| *s == f).map(|(_, keys)| keys());
        field_names::<Self>()
            .iter()
            .flat_map(|f| section(f).unwrap_or(std::slice::from_ref(f)).iter().copied())
            .collect()
    }
}

/// A section's keys: [`field_names`] of its type.
pub type Keys = fn() -> &'static [&'static str];

fn env_name(names: &[(&str, &str)], key: &str) -> String {
    match names.iter().find(|(k, _)| *k == key) {
        Some((_, var)) => (*var).to_string(),
        None => format!("GELO_{}", key.to_ascii_uppercase().replace('-', "_")),
    }
}

/// A configuration that could not be read: what, and the key and layer it came from.
pub type Error = Box<figment::Error>;

type FileLayer = Layer<fn(&str) -> String>;

/// Where a configuration comes from, besides its defaults.
#[derive(Clone, Debug, Default)]
pub struct Sources<'a, F> {
    /// YAML or JSON (`.json`) map of flag names to values (`--config`, `GELO_CONFIG`).
    pub file: Option<&'a Path>,
    /// The environment (`std::env::vars()` in a process; any map in a test).
    pub env: Vec<(String, String)>,
    /// The flags given on the command line: serialized with their flag names as keys,
    /// flags not given left out.
    pub flags: F,
}

/// Reads `T` from its defaults, the file, the environment and the flags, each over the one
/// before. Errors name the key and the layer it came from.
pub fn load<T: Layered, F: Serialize>(sources: &Sources<'_, F>) -> Result<T, Error> {
    let keys = T::keys();
    let mut figment = Figment::new();
    if let Some(path) = sources.file {
        figment = figment.merge(file_layer::<T>(path, &keys)?);
    }
    let mut env = Dict::new();
    for key in &keys {
        let var = T::env_name(key);
        // As clap did: an empty variable counts as unset.
        if let Some((_, v)) = sources.env.iter().rev().find(|(k, v)| *k == var && !v.trim().is_empty()) {
            env.insert((*key).to_string(), Value::from(v.clone()));
        }
    }
    let names = T::ENV_NAMES;
    figment = figment.merge(Layer::new::<T>("the environment".into(), env, move |key: &str| env_name(names, key)));
    let flags = Serialized::defaults(&sources.flags).data()?.remove(&Profile::Default).unwrap_or_default();
    figment = figment.merge(Layer::new::<T>("the command line".into(), flags, |key: &str| format!("--{key}")));
    Ok(figment.extract_lossy()?)
}

/// The file's layer, once every key in it is known to `T` (`keys`).
fn file_layer<T: Layered>(path: &Path, keys: &[&str]) -> Result<FileLayer, Error> {
    let shown = path.display().to_string();
    if !path.is_file() {
        return Err(Box::new(figment::Error::from(format!("config file {shown}: not found (or not a file)"))));
    }
    let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let data = if is_json { Json::file_exact(path).data() } else { Yaml::file_exact(path).data() };
    let data = data.map_err(|e| figment::Error::from(format!("config file {shown}: {e}")))?;
    let mut dict = Dict::new();
    for (_, d) in data {
        dict.extend(d);
    }
    if let Some(unknown) = dict.keys().find(|k| !keys.contains(&k.as_str())) {
        let hint = keys
            .iter()
            .find(|k| k.replace('-', "_") == unknown.replace('-', "_").to_ascii_lowercase())
            .map(|k| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default();
        return Err(Box::new(figment::Error::from(format!(
            "config file {shown}: unknown key `{unknown}`{hint}: keys are this command's flag names \
             without `--` ({})",
            keys.join(", ")
        ))));
    }
    Ok(Layer::new::<T>(format!("config file {shown}"), dict, str::to_string))
}

/// One layer: a map of flag names to values (a section's keys under its field), named for
/// error messages.
struct Layer<I> {
    name: String,
    dict: Dict,
    /// `T`'s sections: an error's key path (`protocol.shield-rows`) drops its section.
    sections: Vec<&'static str>,
    /// How a key is written in this layer (`GELO_MAX_QUEUE`, `--max-queue`).
    interpolate: I,
}

impl<I> Layer<I> {
    /// The layer of `flat` (flag names to values) for `T`: a section's keys moved under it.
    fn new<T: Layered>(name: String, mut flat: Dict, interpolate: I) -> Self {
        for (section, keys) in T::SECTIONS {
            let inner: Dict = keys().iter().filter_map(|k| Some(((*k).to_string(), flat.remove(*k)?))).collect();
            if !inner.is_empty() {
                flat.insert((*section).to_string(), Value::from(inner));
            }
        }
        Layer { name, dict: flat, sections: T::SECTIONS.iter().map(|(s, _)| *s).collect(), interpolate }
    }
}

impl<I: Fn(&str) -> String + Clone + Send + Sync + 'static> Provider for Layer<I> {
    fn metadata(&self) -> Metadata {
        let (interpolate, sections) = (self.interpolate.clone(), self.sections.clone());
        Metadata::named(self.name.clone()).interpolater(move |_: &Profile, path: &[&str]| match path {
            [section, key @ ..] if !key.is_empty() && sections.contains(section) => interpolate(&key.join(".")),
            _ => interpolate(&path.join(".")),
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

/// The field names a derived `Deserialize` of a struct declares, without deserializing one.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Fields(Option<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields = Fields(None);
    let _ = T::deserialize(&mut fields);
    fields.0.unwrap_or(&[])
}

/// A list given as one comma-separated string (`a:1,b:2`, as the flag takes it) or as a
/// list (YAML/JSON); blank items are dropped.
pub fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let items = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s.split(',').map(str::to_string).collect(),
        OneOrMany::Many(v) => v,
    };
    Ok(items.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

/// A value read with its `FromStr` (the parser its flag uses), from a string.
pub fn from_str<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr<Err = String>,
{
    String::deserialize(d)?.parse().map_err(de::Error::custom)
}
