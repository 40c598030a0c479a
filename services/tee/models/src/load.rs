//! Loading a model for a role: find its files, check its identity, pick the architecture,
//! provision its weights on the executor.

use std::{path::Path, sync::Arc};

use protocol::Executor;

use crate::{
    bert::{Bert, BertConfig},
    decoder::{Decoder, DecoderConfig},
    error::{ModelError, Result, read_json},
    generate::TextGenerator,
    identity::{Manifest, ModelIdentity},
    roles::{
        BertEmbedder, CrossEncoder, DecoderEmbedder, Embedder, LlmReranker, Pooling, RERANK_INSTRUCTION, Reranker,
    },
    tensors::Tensors,
    tokenizer::{TextTokenizer, optional_json},
};

/// Options common to every role.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Refuse to load unless the files hash to this identity.
    pub expected_identity: Option<ModelIdentity>,
    /// Override the model's maximum input length (tokens).
    pub max_seq_length: Option<usize>,
    /// Instruction for decoder embedders (queries) and LLM rerankers.
    pub instruction: Option<String>,
    /// Groups a generator's batched decode step runs as (default
    /// [`crate::decoder::DEFAULT_DECODE_GROUPS`]).
    pub decode_groups: Option<usize>,
}

/// A model's files, identity and kind, before its weights are provisioned.
pub struct ModelFiles {
    /// The model folder, or the `.gguf` file.
    pub path: std::path::PathBuf,
    pub manifest: Manifest,
    pub identity: ModelIdentity,
    pub kind: Kind,
}

/// What a checkpoint is.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// BERT encoder; `classifier` when it has a sequence-classification head.
    Bert {
        classifier: bool,
    },
    Decoder(DecoderConfig),
}

impl ModelFiles {
    /// Hashes the model at `path` (a folder, or a GGUF file) and works out its kind.
    pub fn inspect(path: &Path, expected: Option<&ModelIdentity>) -> Result<Self> {
        if !path.exists() {
            return Err(ModelError::Config(format!("model path {} does not exist", path.display())));
        }
        // A folder holding a single GGUF file and no config.json is that file (how the
        // operator's model volumes hold GGUF models).
        if path.is_dir() && !path.join("config.json").exists() {
            let ggufs: Vec<_> = std::fs::read_dir(path)
                .map_err(crate::error::io(path))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
                .collect();
            if let [only] = ggufs.as_slice() {
                return Self::inspect(only, expected);
            }
        }
        let (_, manifest) = Manifest::of_path(path)?;
        if let Some(e) = expected {
            manifest.check(e)?;
        }
        let identity = manifest.identity();
        let kind = if path.is_file() {
            let g = gguf::GgufFile::open(path)?;
            Kind::Decoder(DecoderConfig::from_gguf(&g.llm_hparams()?)?)
        } else {
            let cfg: serde_json::Value = read_json(&path.join("config.json"))?;
            let model_type = cfg.get("model_type").and_then(|v| v.as_str()).unwrap_or_default();
            if model_type == "bert" {
                let classifier = cfg
                    .get("architectures")
                    .and_then(|a| a.as_array())
                    .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("BertForSequenceClassification")));
                Kind::Bert { classifier }
            } else {
                Kind::Decoder(DecoderConfig::from_hf(&cfg)?)
            }
        };
        Ok(ModelFiles { path: path.to_path_buf(), manifest, identity, kind })
    }

    /// Short tag for weight ids (several models can share one executor).
    pub fn tag(&self) -> String {
        hex::encode(&self.identity.0[..6])
    }

    fn tokenizer(&self) -> Result<TextTokenizer> {
        if self.path.is_file() {
            TextTokenizer::from_gguf(&gguf::GgufFile::open(&self.path)?)
        } else {
            TextTokenizer::from_dir(&self.path)
        }
    }

    fn decoder(&self, exec: Arc<dyn Executor>) -> Result<(Decoder, Tensors)> {
        let Kind::Decoder(cfg) = &self.kind else {
            return Err(ModelError::Config("not a decoder model".into()));
        };
        let tensors = Tensors::open(&self.path)?;
        Ok((Decoder::load(&tensors, cfg.clone(), exec, &self.tag())?, tensors))
    }

    fn bert(&self, exec: Arc<dyn Executor>) -> Result<Bert> {
        let cfg: BertConfig = read_json(&self.path.join("config.json"))?;
        Bert::load(&Tensors::open(&self.path)?, cfg, exec, &self.tag())
    }

    /// sentence-transformers settings: pooling mode and `max_seq_length`.
    fn sentence_transformers(&self, default_len: usize) -> Result<(Pooling, usize)> {
        let pooling = match optional_json(&self.path.join("1_Pooling/config.json"))? {
            Some(p) if p.get("pooling_mode_cls_token").and_then(|v| v.as_bool()) == Some(true) => Pooling::Cls,
            Some(p) if p.get("pooling_mode_mean_tokens").and_then(|v| v.as_bool()) == Some(false) => {
                return Err(ModelError::Config("only mean and CLS pooling are supported".into()));
            }
            Some(_) => Pooling::Mean,
            // BGE and most retrieval BERTs without a pooling file use CLS.
            None => Pooling::Cls,
        };
        let max_len = optional_json(&self.path.join("sentence_bert_config.json"))?
            .and_then(|c| c.get("max_seq_length").and_then(|v| v.as_u64()))
            .map_or(default_len, |v| v as usize);
        Ok((pooling, max_len))
    }
}

/// Loads an embedder (BERT, or a decoder with last-token pooling).
pub fn load_embedder(path: &Path, exec: Arc<dyn Executor>, opts: &LoadOptions) -> Result<Box<dyn Embedder>> {
    after_load(embedder(path, exec, opts))
}

fn embedder(path: &Path, exec: Arc<dyn Executor>, opts: &LoadOptions) -> Result<Box<dyn Embedder>> {
    let files = ModelFiles::inspect(path, opts.expected_identity.as_ref())?;
    match &files.kind {
        Kind::Bert { .. } => {
            let bert = files.bert(exec)?;
            let (pooling, st_len) = files.sentence_transformers(bert.cfg.max_position_embeddings)?;
            let max_len = opts.max_seq_length.unwrap_or(st_len).min(bert.cfg.max_position_embeddings);
            let tokenizer = files.tokenizer()?;
            Ok(Box::new(BertEmbedder { bert, tokenizer, pooling, max_len, identity: files.identity }))
        }
        Kind::Decoder(cfg) => {
            let max_len = opts.max_seq_length.unwrap_or(cfg.max_positions.min(8192));
            let tokenizer = files.tokenizer()?;
            let (decoder, _) = files.decoder(exec)?;
            Ok(Box::new(DecoderEmbedder {
                decoder,
                tokenizer,
                max_len,
                instruction: opts.instruction.clone(),
                identity: files.identity,
            }))
        }
    }
}

/// Loads a reranker: a BERT cross-encoder, or a decoder LLM scoring yes/no.
pub fn load_reranker(path: &Path, exec: Arc<dyn Executor>, opts: &LoadOptions) -> Result<Box<dyn Reranker>> {
    after_load(reranker(path, exec, opts))
}

fn reranker(path: &Path, exec: Arc<dyn Executor>, opts: &LoadOptions) -> Result<Box<dyn Reranker>> {
    let files = ModelFiles::inspect(path, opts.expected_identity.as_ref())?;
    match &files.kind {
        Kind::Bert { classifier: true } => {
            let bert = files.bert(exec)?;
            let max_len = opts.max_seq_length.unwrap_or(512).min(bert.cfg.max_position_embeddings);
            // Untruncated: the pair is cut where its tokens are counted (`tokenize_pair`).
            let tokenizer = files.tokenizer()?;
            Ok(Box::new(CrossEncoder { bert, tokenizer, max_len, identity: files.identity }))
        }
        Kind::Bert { classifier: false } => {
            Err(ModelError::Config("a BERT reranker needs a sequence-classification head".into()))
        }
        Kind::Decoder(cfg) => {
            let tokenizer = files.tokenizer()?;
            let (decoder, tensors) = files.decoder(exec)?;
            let id = |t: &str| {
                tokenizer
                    .encode(t, false)
                    .ok()
                    .filter(|ids| ids.len() == 1)
                    .map(|ids| ids[0])
                    .ok_or_else(|| ModelError::Config(format!("the tokenizer has no single token for `{t}`")))
            };
            let head = decoder.provision_token_head("rerank_head", &tensors, &[id("no")?, id("yes")?])?;
            Ok(Box::new(LlmReranker {
                max_len: opts.max_seq_length.unwrap_or(cfg.max_positions.min(8192)),
                decoder,
                tokenizer,
                head,
                instruction: opts.instruction.clone().unwrap_or_else(|| RERANK_INSTRUCTION.to_string()),
                identity: files.identity,
            }))
        }
    }
}

/// Loads a generator (decoder LLM).
pub fn load_generator(path: &Path, exec: Arc<dyn Executor>, opts: &LoadOptions) -> Result<TextGenerator> {
    after_load(generator(path, exec, opts))
}

fn generator(path: &Path, exec: Arc<dyn Executor>, opts: &LoadOptions) -> Result<TextGenerator> {
    let files = ModelFiles::inspect(path, opts.expected_identity.as_ref())?;
    let tokenizer = files.tokenizer()?;
    let (mut decoder, _) = files.decoder(exec)?;
    if let Some(max) = opts.max_seq_length {
        decoder.cfg.max_positions = decoder.cfg.max_positions.min(max);
    }
    if let Some(groups) = opts.decode_groups {
        decoder.set_decode_groups(groups);
    }
    Ok(TextGenerator { decoder, tokenizer, identity: files.identity })
}

/// A load frees its conversion buffers (the checkpoint's tensors, often the model's size
/// again) in one burst once it returns; the process's allocator is asked to hand them back
/// ([`tensor::memory::release_freed`]) instead of holding them as resident memory.
fn after_load<T>(loaded: T) -> T {
    tensor::memory::release_freed();
    loaded
}
