//! A Hugging Face `tokenizers::Tokenizer` rebuilt from GGUF metadata, for GGUF files shipped
//! without a `tokenizer.json`. Target behaviour is llama.cpp's tokenizer on the same file
//! (the reference the model outputs are checked against), not a particular HF release.
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with the pre-tokenizers
//! llama.cpp defines for `tokenizer.ggml.pre` in {`qwen2`, `smollm` and its regex siblings,
//! `gpt-2` and siblings, `llama-bpe`}. How GGUF maps onto HF pieces:
//! - `tokens` (byte-level strings such as `Ġthe`) and their ids form the BPE vocabulary,
//!   `merges` (`"a b"`) the merge list, ranked by position.
//! - `token_type` 3 (control) becomes a special added token, 4 (user-defined) a non-special
//!   added token (the converter stores those as raw text, which is how HF matches them).
//!   As in llama.cpp, control tokens are recognized in input text only when special-token
//!   parsing is on (HF's default; `set_encode_special_tokens(true)` turns it off, which is
//!   llama.cpp's `parse_special = false`), user-defined ones always.
//! - `add_bos_token` / `add_eos_token` become a template post-processor, applied when
//!   encoding with `add_special_tokens = true`.
//! - No NFC normalizer, even for Qwen (whose `tokenizer.json` has one): llama.cpp does not
//!   normalize, and NFC-clean input (almost all text) tokenizes the same either way.

use std::sync::OnceLock;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PostProcessorWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Error, Result};
use crate::file::GgufFile;

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Qwen2's split regex as llama.cpp spells it (the tokenizer.json original with `(?i:...)`
/// expanded): letters with one optional leading non-letter, single digits, punctuation runs
/// with trailing newlines, newline runs, whitespace.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's regex: as Qwen2's but digits in runs of up to three.
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer plus the GGUF settings that `tokenizers` has no field for.
#[derive(Clone)]
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    /// Whether llama.cpp prepends BOS to a prompt (`tokenizer.ggml.add_bos_token`). The
    /// post-processor already does so for `encode(.., add_special_tokens = true)`.
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    /// `tokenizer.chat_template` (Jinja source), if any.
    pub chat_template: Option<String>,
    /// A copy with special-token parsing off, made on first use by `encode`.
    plain: OnceLock<Tokenizer>,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_id", &self.eos_token_id)
            .field("add_bos_token", &self.add_bos_token)
            .finish()
    }
}

impl GgufTokenizer {
    /// Token ids of `text` as llama.cpp's `llama_tokenize(text, add_special, parse_special)`
    /// computes them. `parse_special = false` treats control-token text as plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let encoding = if parse_special {
            self.tokenizer.encode(text, add_special)
        } else {
            // The flag lives on the tokenizer, so this mode gets its own copy, built once.
            let plain = self.plain.get_or_init(|| {
                let mut t = self.tokenizer.clone();
                t.set_encode_special_tokens(true);
                t
            });
            plain.encode(text, add_special)
        };
        Ok(encoding.map_err(|e| Error::Tokenizer(e.to_string()))?.get_ids().to_vec())
    }
}

/// The pre-tokenizer llama.cpp selects for a `tokenizer.ggml.pre` value (llama-vocab.cpp's
/// name → `LLAMA_VOCAB_PRE_TYPE_*` table and that type's regexes), whether BPE looks whole
/// pieces up before merging (`ignore_merges`), and llama.cpp's `add_bos` default.
struct PreTokenizerChoice {
    pre_tokenizer: PreTokenizerWrapper,
    ignore_merges: bool,
    add_bos_default: bool,
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerChoice> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(SplitPattern::Regex(regex.into()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
        // use_regex = false: the Split above already did the splitting.
        Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]).into())
    };
    let plain = |pre_tokenizer| PreTokenizerChoice { pre_tokenizer, ignore_merges: false, add_bos_default: false };
    Ok(match pre {
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => plain(split(QWEN2_REGEX)?),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            PreTokenizerChoice { pre_tokenizer: split(LLAMA3_REGEX)?, ignore_merges: true, add_bos_default: true }
        }
        // `\p{N}` (each digit alone), then the GPT-2 regex: HF's Digits(individual) + ByteLevel.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            plain(Sequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into())
        }
        // The GPT-2 regex alone, which is ByteLevel's own.
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion" | "granite-docling" => {
            plain(ByteLevel::new(false, true, true).into())
        }
        other => {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.pre = `{other}` is not supported (known: qwen2, smollm, gpt-2, llama-bpe and their aliases)"
            )));
        }
    })
}

impl GgufFile {
    /// Rebuilds the file's tokenizer from `tokenizer.ggml.*` metadata.
    pub fn tokenizer(&self) -> Result<GgufTokenizer> {
        let m = self.metadata();
        let model = m.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.model = `{model}`: only byte-level BPE (`gpt2`) is supported"
            )));
        }
        let pre = m.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
        let choice = pre_tokenizer(pre)?;

        let tokens = m.get_str_array("tokenizer.ggml.tokens")?;
        let types = match m.get("tokenizer.ggml.token_type") {
            Some(_) => Some(m.get_i32_array("tokenizer.ggml.token_type")?),
            None => None,
        };
        if let Some(types) = types
            && types.len() != tokens.len()
        {
            return Err(Error::BadMetadata {
                key: "tokenizer.ggml.token_type".into(),
                reason: format!("{} entries for {} tokens", types.len(), tokens.len()),
            });
        }
        let vocab = vocab(tokens)?;
        let merges = merges(m.get_str_array("tokenizer.ggml.merges")?)?;

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(choice.ignore_merges)
            .build()
            .map_err(|e| Error::Tokenizer(format!("BPE model: {e}")))?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(choice.pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));

        if let Some(types) = types {
            let added: Vec<AddedToken> = types
                .iter()
                .zip(tokens)
                .filter_map(|(&t, content)| match t {
                    TOKEN_TYPE_CONTROL => Some(AddedToken::from(content.clone(), true)),
                    // normalized = false: there is no normalizer, and it keeps the content
                    // matched byte for byte as llama.cpp does.
                    TOKEN_TYPE_USER_DEFINED => Some(AddedToken::from(content.clone(), false).normalized(false)),
                    _ => None,
                })
                .collect();
            // Every added token is already in the vocabulary, so it keeps its file id.
            tokenizer.add_tokens(added).map_err(|e| Error::Tokenizer(format!("added tokens: {e}")))?;
        }

        let token_id = |key: &str| -> Result<Option<u32>> {
            let Some(id) = m.opt_u32(key)? else {
                return Ok(None);
            };
            if id as usize >= tokens.len() {
                return Err(Error::BadMetadata {
                    key: key.into(),
                    reason: format!("id {id} is outside the {}-token vocabulary", tokens.len()),
                });
            }
            Ok(Some(id))
        };
        let bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = token_id("tokenizer.ggml.eos_token_id")?;
        let padding_token_id = token_id("tokenizer.ggml.padding_token_id")?;
        let add_bos_token =
            m.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(choice.add_bos_default) && bos_token_id.is_some();
        let add_eos_token = m.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false) && eos_token_id.is_some();

        let processor =
            post_processor(tokens, bos_token_id.filter(|_| add_bos_token), eos_token_id.filter(|_| add_eos_token))?;
        tokenizer.with_post_processor(Some(processor));

        Ok(GgufTokenizer {
            tokenizer,
            bos_token_id,
            eos_token_id,
            padding_token_id,
            add_bos_token,
            add_eos_token,
            chat_template: m.opt_str("tokenizer.chat_template")?.map(str::to_string),
            plain: OnceLock::new(),
        })
    }
}

/// Token string → id; a repeated string is corruption.
fn vocab(tokens: &[String]) -> Result<Vocab> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        // A repeated string would silently shadow an id; llama.cpp keeps the last one too,
        // but no real vocabulary has one, so treat it as corruption.
        if vocab.insert(token.clone(), id as u32).is_some() {
            return Err(Error::BadMetadata {
                key: "tokenizer.ggml.tokens".into(),
                reason: format!("token {token:?} appears twice (second at id {id})"),
            });
        }
    }
    Ok(vocab)
}

/// `tokenizer.ggml.merges` as pairs of symbols.
fn merges(merges: &[String]) -> Result<Merges> {
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            // Split at the first space after the first byte, as llama.cpp does (byte-level
            // symbols never contain a space: it is encoded as `Ġ`).
            merge
                .bytes()
                .skip(1)
                .position(|b| b == b' ')
                .map(|p| (merge[..p + 1].to_string(), merge[p + 2..].to_string()))
                .ok_or_else(|| Error::BadMetadata {
                    key: "tokenizer.ggml.merges".into(),
                    reason: format!("merge {i} ({merge:?}) is not two space-separated symbols"),
                })
        })
        .collect::<Result<_>>()
}

/// The post-processor: a template adding the BOS and EOS tokens the file asks for (`bos`,
/// `eos`: their ids when added), or byte-level offsets only.
fn post_processor(tokens: &[String], bos: Option<u32>, eos: Option<u32>) -> Result<PostProcessorWrapper> {
    Ok(if bos.is_some() || eos.is_some() {
        let mut special = Vec::new();
        let mut single = Vec::new();
        let mut pair = Vec::new();
        if let Some(bos) = bos {
            let s = tokens[bos as usize].clone();
            special.push((s.clone(), bos));
            single.push(s.clone());
            pair.push(s);
        }
        single.push("$A".to_string());
        pair.push("$A".to_string());
        if let Some(eos) = eos {
            let s = tokens[eos as usize].clone();
            special.push((s.clone(), eos));
            single.push(s.clone());
            pair.push(s);
        }
        let n = pair.len();
        pair.extend_from_within(..n);
        if let Some(b) = pair.iter_mut().skip(n).find(|s| *s == "$A") {
            *b = "$B:1".into();
        }
        TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .map_err(|e| Error::Tokenizer(format!("post-processor template: {e}")))?
            .special_tokens(special)
            .build()
            .map_err(|e| Error::Tokenizer(format!("post-processor: {e}")))?
            .into()
    } else {
        // Offsets only: mirrors tokenizer.json files of byte-level models.
        ByteLevel::new(false, false, false).into()
    })
}
