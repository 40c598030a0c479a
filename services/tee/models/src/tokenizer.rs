//! Tokenization and chat templates, from `tokenizer.json` + `tokenizer_config.json` or from
//! GGUF metadata.

use std::{
    collections::{HashMap, hash_map::Entry},
    path::Path,
    sync::{Arc, Mutex},
};

use serde::{Deserialize, Serialize};
use tokenizers::{Tokenizer, TruncationParams};

use crate::error::{ModelError, Result, read_json};

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A tokenizer with the special tokens and chat template of its model.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    pub bos: Option<u32>,
    /// Tokens that end generation.
    pub eos: Vec<u32>,
    bos_text: String,
    eos_text: String,
    chat_template: Option<String>,
    /// Copies of `inner` that truncate pairs to a length, by length: a pair longer than its
    /// limit is cut by the tokenizer's own pair truncation (longest first).
    truncating: Arc<Mutex<HashMap<usize, Tokenizer>>>,
}

fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

impl TextTokenizer {
    fn new(mut inner: Tokenizer, bos: Option<u32>, eos: Vec<u32>, chat_template: Option<String>) -> Result<Self> {
        // Lengths are the model's business (max_seq_length, context): never let the
        // tokenizer file pad or truncate behind our back.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let text = |id: Option<u32>| id.and_then(|i| inner.id_to_token(i)).unwrap_or_default();
        let bos_text = text(bos);
        let eos_text = text(eos.first().copied());
        Ok(TextTokenizer { inner, bos, eos, bos_text, eos_text, chat_template, truncating: Arc::default() })
    }

    /// Truncates every encoding (special tokens included) to `max_len` tokens, as
    /// sentence-transformers does with `max_seq_length`.
    pub fn with_max_length(mut self, max_len: usize) -> Result<Self> {
        let params = tokenizers::TruncationParams { max_length: max_len, ..Default::default() };
        self.inner.with_truncation(Some(params)).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(self)
    }

    /// `tokenizer.json` (and `tokenizer_config.json`, `generation_config.json` if present).
    pub fn from_dir(root: &Path) -> Result<Self> {
        let path = root.join("tokenizer.json");
        let inner =
            Tokenizer::from_file(&path).map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg: serde_json::Value = if root.join("tokenizer_config.json").exists() {
            read_json(&root.join("tokenizer_config.json"))?
        } else {
            serde_json::Value::Null
        };
        let id = |t: Option<String>| t.and_then(|t| inner.token_to_id(&t));
        let bos = id(token_text(cfg.get("bos_token")));
        let mut eos: Vec<u32> = id(token_text(cfg.get("eos_token"))).into_iter().collect();
        if root.join("generation_config.json").exists() {
            let g: serde_json::Value = read_json(&root.join("generation_config.json"))?;
            match g.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos.extend(n.as_u64().map(|v| v as u32)),
                Some(serde_json::Value::Array(a)) => eos.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
                _ => {}
            }
        }
        eos.dedup();
        let template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        Self::new(inner, bos, eos, template)
    }

    /// The tokenizer llama.cpp would build from a GGUF file's metadata.
    pub fn from_gguf(file: &gguf::GgufFile) -> Result<Self> {
        let t = file.tokenizer()?;
        let mut eos: Vec<u32> = t.eos_token_id.into_iter().collect();
        // Chat models end turns with these even when the file names another EOS.
        for extra in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>"] {
            if let Some(id) = t.tokenizer.token_to_id(extra)
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        Self::new(t.tokenizer, t.bos_token_id, eos, t.chat_template)
    }

    /// Token ids of `text`; `add_special` adds the model's BOS/CLS/SEP framing.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        Ok(self.inner.encode(text, add_special).map_err(|e| ModelError::Tokenizer(e.to_string()))?.get_ids().to_vec())
    }

    /// Ids and segment (token type) ids of a text pair, as cross-encoders take them.
    pub fn encode_pair(&self, a: &str, b: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        let enc = self.inner.encode((a, b), true).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok((enc.get_ids().to_vec(), enc.get_type_ids().to_vec()))
    }

    /// A text pair as a cross-encoder takes it (ids and segment ids, special tokens
    /// added), cut to at most `max` tokens by the tokenizer's own pair truncation (longest
    /// first), and how many tokens the pair made before the cut.
    pub fn encode_pair_within(&self, a: &str, b: &str, max: usize) -> Result<(Vec<u32>, Vec<u32>, usize)> {
        let (ids, types) = self.encode_pair(a, b)?;
        let counted = ids.len();
        if counted <= max {
            return Ok((ids, types, counted));
        }
        let mut cache = self.truncating.lock().expect("tokenizer cache poisoned");
        let cut = match cache.entry(max) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let mut t = self.inner.clone();
                let params = TruncationParams { max_length: max, ..Default::default() };
                t.with_truncation(Some(params)).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
                e.insert(t)
            }
        };
        let enc = cut.encode((a, b), true).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok((enc.get_ids().to_vec(), enc.get_type_ids().to_vec(), counted))
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders the model's chat template (Jinja) for `messages`.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let Some(src) = &self.chat_template else {
            return Err(ModelError::Template("the model has no chat template".into()));
        };
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template("chat", src).map_err(|e| ModelError::Template(e.to_string()))?;
        let tmpl = env.get_template("chat").map_err(|e| ModelError::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_text,
            eos_token => self.eos_text,
        })
        .map_err(|e| ModelError::Template(e.to_string()))
    }
}

/// Reads a JSON file if it exists.
pub(crate) fn optional_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if path.exists() { Ok(Some(read_json(path)?)) } else { Ok(None) }
}
