//! The private RAG flow, independent of the transport: the gRPC `Rag` service and the
//! OpenAI-compatible HTTP API both call it.
//!
//! Ingest: validate → chunk by the embedder's tokens → embed (embedder backend) → upsert into
//! the sealed store, whole documents per transaction. Search: embed the query → exact top-k in
//! the store → optionally rerank the candidates (reranker backend). Query: search → focus on the units
//! closest to the question → prompt with the passages, numbered → stream the generator's
//! answer, each citation checked against the passages, a restated question replaced ([`answer`]).
//! Plaintext exists only in this process (the CVM) and, over RA-TLS, in verified backends.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use api::v1::{
    Chunking, EmbedRequest, GenerateRequest, GenerateResponse, RerankRequest, Skipped, Usage,
    embedder_client::EmbedderClient, generator_client::GeneratorClient, reranker_client::RerankerClient,
};
use store::VectorStore;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use attest::Role;

use crate::{
    backends::{BackendStream, Pool, Routed},
    chunker::{Chunker, Planned},
    docstore::DocStore,
    error::{GatewayError, Result},
    focus, prompt,
};

mod answer;
mod compose;
mod words;

use answer::{Answering, Evidence, Unit};

/// Units of the retrieved passages scored against a question at most ([`Pipeline::focus`]).
const MAX_FOCUS_UNITS: usize = 64;

/// Largest message a backend may answer with (a batch of embeddings).
const MAX_BACKEND_MESSAGE: usize = 64 << 20;

/// The gateway's knobs for the RAG flow.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Passages a Search returns when the request says 0.
    pub search_top_k: usize,
    /// Passages a Query uses when the request says 0.
    pub query_top_k: usize,
    pub max_top_k: usize,
    /// Rerank by default (when a reranker is configured).
    pub rerank: bool,
    /// Candidates retrieved for the reranker (at least top_k).
    pub rerank_candidates: usize,
    /// Texts per Embed call.
    pub embed_batch: usize,
    /// Passages gathered before one embed + store transaction.
    pub ingest_batch: usize,
    pub max_document_bytes: usize,
    pub max_id_bytes: usize,
    pub max_question_bytes: usize,
    /// Characters of passage text in a Query's prompt.
    pub context_chars: usize,
    /// Answer tokens when a Query says 0.
    pub max_tokens: u32,
    /// Repetition penalty of a Query's answer (1: none); chosen on eval/rag/questions.jsonl.
    pub repetition_penalty: f32,
    /// Units (sentences, items, rows) of each passage a Query's prompt shows, from the one
    /// closest to the question ([`crate::focus`]); 0 shows whole passages.
    pub focus_units: usize,
    /// Passages retrieved for the focus to choose a Query's `top_k` from, by their best
    /// unit (at least top_k; focus on only).
    pub focus_candidates: usize,
    /// A Query's answer ends once a run of this many words repeats one it wrote (0: off).
    pub stop_repeated_words: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            search_top_k: 10,
            query_top_k: 4,
            max_top_k: 1000,
            rerank: true,
            rerank_candidates: 10,
            // Small enough that one forward pass stays well inside a service's queue timeout
            // on a loaded 2-core machine (16 × 256 tokens); the service batches concurrent
            // calls itself.
            embed_batch: 16,
            ingest_batch: 64,
            max_document_bytes: 4 << 20,
            max_id_bytes: 512,
            max_question_bytes: 32 << 10,
            context_chars: 6000,
            max_tokens: 256,
            repetition_penalty: 1.0,
            focus_units: 2,
            focus_candidates: 8,
            stop_repeated_words: 6,
        }
    }
}

/// A retrieved passage, with its reranker score when reranked.
#[derive(Clone, Debug)]
pub struct Hit {
    pub passage: store::Passage,
    pub rerank_score: Option<f32>,
}

/// Where a request's time went.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub embed: Duration,
    pub search: Duration,
    pub rerank: Duration,
    pub generate: Duration,
    pub first_token: Duration,
}

impl From<Timings> for api::v1::StageTimings {
    fn from(t: Timings) -> Self {
        api::v1::StageTimings {
            embed_seconds: t.embed.as_secs_f64(),
            search_seconds: t.search.as_secs_f64(),
            rerank_seconds: t.rerank.as_secs_f64(),
            generate_seconds: t.generate.as_secs_f64(),
            first_token_seconds: t.first_token.as_secs_f64(),
        }
    }
}

/// What a Query streams, in this order: passages, text…, usage, citations, timings.
#[derive(Debug)]
pub enum QueryEvent {
    Passages(Vec<Hit>),
    Text(String),
    /// Token counts, and whether the answer was cut at `max_tokens`.
    Usage(Usage, bool),
    Citations {
        cited: Vec<String>,
        unknown: Vec<String>,
    },
    Timings(Timings),
}

#[derive(Clone, Debug, Default)]
pub struct QueryParams {
    pub question: String,
    pub top_k: u32,
    pub max_tokens: u32,
    pub temperature: f32,
    pub seed: u64,
    pub rerank: Option<bool>,
}

pub struct Pipeline {
    pub pool: Pool,
    pub store: Arc<DocStore>,
    pub chunker: Arc<Chunker>,
    pub settings: Settings,
}

/// The answer text a Query gives when the store has nothing to answer from; the generator is
/// not asked, so it cannot make something up.
pub const NO_PASSAGES: &str = "No stored passage matches the question, so there is nothing to answer from.";

impl Pipeline {
    /// Embeds `texts` in batches of `embed_batch`; returns the vectors and the tokens used.
    pub async fn embed(&self, texts: &[String], truncate: bool) -> Result<(Vec<Vec<f32>>, u32)> {
        let mut out = Vec::with_capacity(texts.len());
        let mut tokens = 0u32;
        for batch in texts.chunks(self.settings.embed_batch.max(1)) {
            let req = EmbedRequest { texts: batch.to_vec(), instruction: String::new(), truncate };
            let resp = retry_busy(|| {
                self.pool.unary(Role::Embedder, |ch| {
                    let req = req.clone();
                    async move {
                        EmbedderClient::new(ch)
                            .max_decoding_message_size(MAX_BACKEND_MESSAGE)
                            .embed(req)
                            .await
                            .map(|r| r.into_inner())
                    }
                })
            })
            .await?;
            if resp.embeddings.len() != batch.len() {
                return Err(GatewayError::Internal(format!(
                    "the embedder returned {} vectors for {} texts",
                    resp.embeddings.len(),
                    batch.len()
                )));
            }
            tokens = tokens.saturating_add(resp.usage.map_or(0, |u| u.prompt_tokens));
            out.extend(resp.embeddings.into_iter().map(|e| e.values));
        }
        Ok((out, tokens))
    }

    /// Scores `documents` against `query`; `(index, score)` best first, and the tokens used.
    pub async fn rerank(&self, query: &str, documents: Vec<String>, top_n: u32) -> Result<(Vec<(usize, f32)>, u32)> {
        let req = RerankRequest { query: query.to_string(), documents, top_n, truncate: true };
        let resp = retry_busy(|| {
            self.pool.unary(Role::Reranker, |ch| {
                let req = req.clone();
                async move {
                    RerankerClient::new(ch)
                        .max_decoding_message_size(MAX_BACKEND_MESSAGE)
                        .rerank(req)
                        .await
                        .map(|r| r.into_inner())
                }
            })
        })
        .await?;
        let n = req.documents.len();
        let mut out = Vec::with_capacity(resp.results.len());
        for r in resp.results {
            let i = r.index as usize;
            if i >= n {
                return Err(GatewayError::Internal(format!("the reranker returned index {i} for {n} documents")));
            }
            out.push((i, r.score));
        }
        Ok((out, resp.usage.map_or(0, |u| u.prompt_tokens)))
    }

    /// Opens a generation on a verified generator (fails over until the first message).
    pub(crate) async fn generate(
        &self,
        req: GenerateRequest,
    ) -> Result<(Routed, Option<GenerateResponse>, BackendStream<GenerateResponse>)> {
        self.pool
            .stream(Role::Generator, |ch| {
                let req = req.clone();
                async move { GeneratorClient::new(ch).generate(req).await.map(|r| r.into_inner()) }
            })
            .await
    }

    fn check_question(&self, what: &str, q: &str) -> Result<()> {
        if q.trim().is_empty() {
            return Err(GatewayError::invalid(format!("{what} is empty")));
        }
        if q.len() > self.settings.max_question_bytes {
            return Err(GatewayError::TooLarge {
                what: format!("{what} bytes"),
                got: q.len(),
                limit: self.settings.max_question_bytes,
            });
        }
        Ok(())
    }

    fn top_k(&self, requested: u32, default: usize) -> Result<usize> {
        let k = if requested == 0 { default } else { requested as usize };
        if k > self.settings.max_top_k {
            return Err(GatewayError::TooLarge { what: "top_k".into(), got: k, limit: self.settings.max_top_k });
        }
        Ok(k)
    }

    /// Retrieval: the `top_k` best passages for `query`, reranked if asked (or by default
    /// when a reranker is configured).
    pub async fn search(&self, query: &str, top_k: u32, rerank: Option<bool>) -> Result<(Vec<Hit>, Timings)> {
        self.check_question("query", query)?;
        let k = self.top_k(top_k, self.settings.search_top_k)?;
        self.retrieve(query, k, rerank).await
    }

    async fn retrieve(&self, query: &str, k: usize, rerank: Option<bool>) -> Result<(Vec<Hit>, Timings)> {
        let mut t = Timings::default();
        let rerank = rerank.unwrap_or(self.settings.rerank && self.pool.configured(Role::Reranker));
        let start = Instant::now();
        let (mut vectors, _) = self.embed(&[query.to_string()], true).await?;
        t.embed = start.elapsed();
        let query_vector = vectors.pop().ok_or_else(|| GatewayError::Internal("no query embedding".into()))?;
        let Some(store) = self.store.get() else {
            return Ok((Vec::new(), t)); // nothing ingested yet
        };
        if store.dimension() != query_vector.len() {
            return Err(GatewayError::DimensionMismatch { expected: store.dimension(), got: query_vector.len() });
        }
        let candidates = if rerank { k.max(self.settings.rerank_candidates) } else { k };
        let start = Instant::now();
        let found = tokio::task::spawn_blocking(move || store.search(&query_vector, candidates)).await??;
        t.search = start.elapsed();
        let mut hits: Vec<Hit> = found.into_iter().map(|passage| Hit { passage, rerank_score: None }).collect();
        if rerank && !hits.is_empty() {
            let start = Instant::now();
            let docs = hits.iter().map(|h| with_title(&h.passage.title, &h.passage.text)).collect();
            let (order, _) = self.rerank(query, docs, 0).await?;
            let mut reranked = Vec::with_capacity(order.len());
            for (i, score) in order {
                let mut h = hits[i].clone();
                h.rerank_score = Some(score);
                reranked.push(h);
            }
            hits = reranked;
            t.rerank = start.elapsed();
        }
        hits.truncate(k);
        Ok((hits, t))
    }

    /// Starts a Query; its events arrive on the returned stream. Dropping the stream cancels
    /// the generation.
    pub fn query(self: &Arc<Self>, q: QueryParams) -> ReceiverStream<Result<QueryEvent>> {
        let (tx, rx) = mpsc::channel(64);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.run_query(q, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        ReceiverStream::new(rx)
    }

    async fn run_query(&self, q: QueryParams, tx: &mpsc::Sender<Result<QueryEvent>>) -> Result<()> {
        let arrived = Instant::now();
        self.check_question("question", &q.question)?;
        let k = self.top_k(q.top_k, self.settings.query_top_k)?;
        let candidates = if self.settings.focus_units > 0 { k.max(self.settings.focus_candidates) } else { k };
        let (mut hits, mut t) = self.retrieve(&q.question, candidates, q.rerank).await?;
        let start = Instant::now();
        let mut evidence = Evidence::default();
        let excerpts = self.focus(&q.question, &hits).await?.map(|(mut excerpts, mut units)| {
            // The generator is shown the k best excerpts; the passages are those.
            excerpts.truncate(k);
            let shown: Vec<Hit> = excerpts.iter().map(|e| hits[e.passage].clone()).collect();
            evidence.passages = excerpts.iter().map(|e| std::mem::take(&mut units[e.passage])).collect();
            for (i, e) in excerpts.iter_mut().enumerate() {
                e.passage = i;
            }
            hits = shown;
            excerpts
        });
        hits.truncate(k);
        if excerpts.is_none() && !hits.is_empty() {
            // Focus off: the shown passages' units, for checking the answer's citations.
            evidence.passages = self.score_units(&q.question, &hits).await?.unwrap_or_default();
        }
        t.embed += start.elapsed();
        let sources: Vec<prompt::Source<'_>> = match &excerpts {
            Some(excerpts) => excerpts
                .iter()
                .map(|e| prompt::Source { id: &hits[e.passage].passage.passage_id, title: "", text: &e.text })
                .collect(),
            None => hits
                .iter()
                .map(|h| prompt::Source { id: &h.passage.passage_id, title: &h.passage.title, text: &h.passage.text })
                .collect(),
        };
        let ids: Vec<String> = sources.iter().map(|s| s.id.to_string()).collect();
        let messages = prompt::messages(&q.question, &sources, self.settings.context_chars);
        if tx.send(Ok(QueryEvent::Passages(hits.clone()))).await.is_err() {
            return Ok(()); // the client went away
        }
        if hits.is_empty() {
            t.first_token = arrived.elapsed();
            let citations = QueryEvent::Citations { cited: Vec::new(), unknown: Vec::new() };
            let events = [QueryEvent::Text(NO_PASSAGES.into()), QueryEvent::Usage(Usage::default(), false), citations];
            for e in events.into_iter().chain([QueryEvent::Timings(t)]) {
                if tx.send(Ok(e)).await.is_err() {
                    break;
                }
            }
            return Ok(());
        }
        let req = GenerateRequest {
            messages,
            max_tokens: if q.max_tokens == 0 { self.settings.max_tokens } else { q.max_tokens },
            temperature: q.temperature,
            seed: q.seed,
            repetition_penalty: self.settings.repetition_penalty,
            stop_repeated_words: self.settings.stop_repeated_words,
            ..Default::default()
        };
        let answering = Answering { tx, question: &q.question, ids: &ids, evidence: &evidence, arrived };
        self.answer(req, answering, t).await
    }

    /// The excerpts of `hits` the generator is shown ([`focus`]), with every hit's scored
    /// units ([`Self::score_units`]), or `None` to show whole passages (focus off, or no
    /// passage has a unit to score).
    async fn focus(&self, question: &str, hits: &[Hit]) -> Result<Option<(Vec<focus::Excerpt>, Vec<Vec<Unit>>)>> {
        if self.settings.focus_units == 0 || hits.is_empty() {
            return Ok(None);
        }
        let Some(units) = self.score_units(question, hits).await? else {
            return Ok(None);
        };
        let texts: Vec<Vec<String>> = units.iter().map(|u| u.iter().map(|u| u.text.clone()).collect()).collect();
        let scores: Vec<Vec<f32>> = units.iter().map(|u| u.iter().map(|u| u.score).collect()).collect();
        Ok(Some((focus::excerpts(&texts, &scores, self.settings.focus_units), units)))
    }

    /// Each hit's units ([`focus::units`]) with their embeddings and their cosine to the
    /// question's, or `None` when no hit has a unit. Units past [`MAX_FOCUS_UNITS`] are not
    /// embedded: the later passages keep their first units only. A unit that quotes the
    /// question is left out ([`focus::quotes`]). Each score adds the unit's overlap with the
    /// question's terms ([`answer::add_overlap`]).
    async fn score_units(&self, question: &str, hits: &[Hit]) -> Result<Option<Vec<Vec<Unit>>>> {
        let mut budget = MAX_FOCUS_UNITS;
        let units: Vec<Vec<String>> = hits
            .iter()
            .map(|h| {
                let mut u = focus::units(&h.passage.text);
                u.retain(|unit| !focus::quotes(unit, question));
                u.truncate(budget);
                budget -= u.len();
                u
            })
            .collect();
        if units.iter().all(Vec::is_empty) {
            return Ok(None);
        }
        let mut texts = Vec::with_capacity(1 + MAX_FOCUS_UNITS);
        texts.push(question.to_string());
        texts.extend(units.iter().flatten().cloned());
        let (vectors, _) = self.embed(&texts, true).await?;
        let mut vectors = vectors.into_iter();
        let q = vectors.next().unwrap_or_default();
        let mut scored: Vec<Vec<Unit>> = units
            .into_iter()
            .map(|u| {
                u.into_iter()
                    .zip(vectors.by_ref())
                    .map(|(text, vector)| Unit { text, score: models::ops::cosine(&q, &vector), vector })
                    .collect()
            })
            .collect();
        answer::add_overlap(question, &mut scored);
        Ok(Some(scored))
    }

    /// Deletes documents by id; returns how many existed.
    pub async fn delete(&self, ids: Vec<String>) -> Result<u64> {
        if ids.iter().any(|i| i.is_empty()) {
            return Err(GatewayError::invalid("an id is empty"));
        }
        let Some(store) = self.store.get() else { return Ok(0) };
        Ok(tokio::task::spawn_blocking(move || store.delete(&ids)).await??)
    }

    /// Documents, chunks, bytes on disk and the dimension (0 before the first embedding).
    pub async fn stats(&self) -> Result<(store::Stats, usize)> {
        let Some(store) = self.store.get() else {
            return Ok((store::Stats { documents: 0, chunks: 0, bytes_on_disk: 0 }, 0));
        };
        let dim = store.dimension();
        Ok((tokio::task::spawn_blocking(move || store.stats()).await??, dim))
    }

    pub fn ingest(self: &Arc<Self>) -> Ingest {
        Ingest {
            pipe: self.clone(),
            pending: Vec::new(),
            pending_chunks: 0,
            documents: 0,
            chunks: 0,
            skipped: Vec::new(),
            seen: 0,
            stored: None,
        }
    }
}

/// Retries a call the backend refused as overloaded (RESOURCE_EXHAUSTED: its queue is full or
/// a batch waited too long), twice, after 1 s and 3 s: an ingest should ride out a busy
/// moment rather than fail half-way.
async fn retry_busy<T, F, Fut>(mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut waits = [1u64, 3].into_iter();
    loop {
        let result = call().await;
        if let Err(GatewayError::Backend { status, .. }) = &result
            && status.code() == tonic::Code::ResourceExhausted
            && let Some(w) = waits.next()
        {
            tracing::info!(wait_seconds = w, "backend overloaded; retrying");
            tokio::time::sleep(Duration::from_secs(w)).await;
            continue;
        }
        return result;
    }
}

fn with_title(title: &str, text: &str) -> String {
    if title.trim().is_empty() { text.to_string() } else { format!("{} {text}", title.trim()) }
}

/// A document in, not yet embedded.
pub struct IngestDocument {
    pub id: String,
    pub title: String,
    pub text: String,
    pub metadata: BTreeMap<String, String>,
    pub chunking: Chunking,
}

impl From<api::v1::Document> for IngestDocument {
    fn from(d: api::v1::Document) -> Self {
        let chunking = d.chunking();
        IngestDocument { id: d.id, title: d.title, text: d.text, metadata: d.metadata.into_iter().collect(), chunking }
    }
}

struct Pending {
    id: String,
    title: String,
    metadata: BTreeMap<String, String>,
    passages: Vec<Planned>,
}

/// One ingest stream: documents are chunked as they arrive and committed in batches of whole
/// documents (one store transaction each), so a crash keeps every committed document and
/// none in part.
pub struct Ingest {
    pipe: Arc<Pipeline>,
    pending: Vec<Pending>,
    pending_chunks: usize,
    pub documents: u32,
    pub chunks: u32,
    pub skipped: Vec<Skipped>,
    seen: usize,
    /// Each committed document's id and passage count, when asked for ([`Ingest::listing`]);
    /// not for a gRPC stream, which may carry a whole corpus.
    stored: Option<Vec<(String, u32)>>,
}

impl Ingest {
    /// Keeps the id and passage count of every document committed from now on.
    pub fn listing(mut self) -> Self {
        self.stored = Some(Vec::new());
        self
    }

    /// The documents committed so far, with their passage counts (empty unless [`Self::listing`]).
    pub fn stored(&self) -> &[(String, u32)] {
        self.stored.as_deref().unwrap_or_default()
    }

    fn skip(&mut self, id: &str, reason: impl Into<String>) {
        self.skipped.push(Skipped { id: id.to_string(), reason: reason.into() });
    }

    /// Takes one document: skipped (with the reason) if it is unusable, else chunked and
    /// queued; a full batch is committed. Errors are the backend's or the store's.
    pub async fn add(&mut self, doc: IngestDocument) -> Result<()> {
        let position = self.seen;
        self.seen += 1;
        let s = &self.pipe.settings;
        if doc.id.is_empty() {
            self.skip("", format!("document {position}: empty id"));
            return Ok(());
        }
        if doc.id.len() > s.max_id_bytes {
            let reason = format!("id is {} bytes (limit {})", doc.id.len(), s.max_id_bytes);
            let mut cut = s.max_id_bytes;
            while !doc.id.is_char_boundary(cut) {
                cut -= 1;
            }
            self.skip(&doc.id[..cut], reason);
            return Ok(());
        }
        let size =
            doc.text.len() + doc.title.len() + doc.metadata.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if size > s.max_document_bytes {
            self.skip(&doc.id, format!("document is {size} bytes (limit {})", s.max_document_bytes));
            return Ok(());
        }
        if doc.text.trim().is_empty() {
            self.skip(&doc.id, "no text");
            return Ok(());
        }
        let chunker = self.pipe.chunker.clone();
        let IngestDocument { id, title, text, metadata, chunking } = doc;
        let (title, planned) = tokio::task::spawn_blocking(move || {
            let p = chunker.plan(&title, &text, chunking);
            (title, p)
        })
        .await?;
        let passages = match planned {
            Ok(p) if p.is_empty() => {
                self.skip(&id, "no text");
                return Ok(());
            }
            Ok(p) => p,
            Err(e) => {
                self.skip(&id, e.to_string());
                return Ok(());
            }
        };
        // The same id twice in one stream: the later document replaces the earlier one.
        if let Some(i) = self.pending.iter().position(|p| p.id == id) {
            let old = self.pending.remove(i);
            self.pending_chunks -= old.passages.len();
        }
        self.pending_chunks += passages.len();
        self.pending.push(Pending { id, title, metadata, passages });
        if self.pending_chunks >= self.pipe.settings.ingest_batch {
            self.flush().await?;
        }
        Ok(())
    }

    /// Embeds and commits the queued documents (one transaction).
    pub async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let inputs: Vec<String> =
            self.pending.iter().flat_map(|d| d.passages.iter().map(|p| p.embed_input.clone())).collect();
        let (vectors, _) = self.pipe.embed(&inputs, true).await?;
        let dim = vectors.first().map_or(0, Vec::len);
        let docstore = self.pipe.store.clone();
        let store = tokio::task::spawn_blocking(move || docstore.get_or_create(dim)).await??;
        let mut vectors = vectors.into_iter();
        let listed: Option<Vec<(String, u32)>> = self
            .stored
            .as_ref()
            .map(|_| self.pending.iter().map(|d| (d.id.clone(), d.passages.len() as u32)).collect());
        let docs: Vec<store::Document> = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|d| store::Document {
                id: d.id,
                title: d.title,
                metadata: d.metadata,
                chunks: d
                    .passages
                    .into_iter()
                    .map(|p| store::Chunk { text: p.text, embedding: vectors.next().unwrap_or_default() })
                    .collect(),
            })
            .collect();
        let (n_docs, n_chunks) = (docs.len() as u32, self.pending_chunks as u32);
        self.pending_chunks = 0;
        tokio::task::spawn_blocking(move || store.upsert(&docs)).await??;
        self.documents += n_docs;
        self.chunks += n_chunks;
        if let (Some(stored), Some(listed)) = (&mut self.stored, listed) {
            for (id, n) in listed {
                stored.retain(|(earlier, _)| *earlier != id); // replaced by the later copy
                stored.push((id, n));
            }
        }
        Ok(())
    }
}
