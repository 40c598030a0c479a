//! `gelo.v1.Embedder`: dynamic batching across requests, one masked forward pass per batch.

use std::{sync::Arc, time::Instant};

use api::v1::{EmbedRequest, EmbedResponse, Embedding, Usage, embedder_server};
use models::{Embedder, bert::Encoded};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::{
    batcher::{BatchPolicy, Batcher},
    health::Health,
    limits::{Limits, too_large},
    metrics::Metrics,
    rpc::{Call, code_of},
    status,
};

const SERVICE: &str = embedder_server::SERVICE_NAME;

/// Seconds the engine has spent so far (for engine vs TEE time).
pub type EngineClock = Arc<dyn Fn() -> f64 + Send + Sync>;

pub struct EmbedderService {
    embedder: Arc<dyn Embedder>,
    batcher: Batcher<Vec<Encoded>, Vec<Vec<f32>>>,
    limits: Limits,
    metrics: Metrics,
    health: Health,
    model: String,
}

impl EmbedderService {
    pub fn new(
        embedder: Arc<dyn Embedder>,
        limits: Limits,
        metrics: Metrics,
        clock: EngineClock,
        health: Health,
    ) -> Self {
        let policy = BatchPolicy {
            window: limits.batch_window,
            budget: limits.batch_tokens,
            max_items: limits.max_texts,
            max_queue: limits.max_queue,
        };
        let (e, m, h) = (embedder.clone(), metrics.clone(), health.clone());
        let batcher = Batcher::spawn("embedder", policy, metrics.clone(), move |jobs: Vec<Vec<Encoded>>| {
            run_batch(e.as_ref(), &m, &h, &clock, jobs)
        });
        health.add_service(SERVICE);
        EmbedderService { model: embedder.identity().to_string(), embedder, batcher, limits, metrics, health }
    }

    pub fn into_server(self) -> embedder_server::EmbedderServer<Self> {
        let max = self.limits.max_request_bytes;
        embedder_server::EmbedderServer::new(self)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max.max(64 << 20))
    }

    async fn handle(&self, req: EmbedRequest, call: &Call) -> Result<EmbedResponse, Status> {
        self.health.check()?;
        call.items(req.texts.len());
        if req.texts.is_empty() {
            return Err(Status::invalid_argument("texts is empty"));
        }
        if req.texts.len() > self.limits.max_texts {
            return Err(too_large("texts per request", req.texts.len(), self.limits.max_texts));
        }
        if let Some(i) = req.texts.iter().position(|t| t.trim().is_empty()) {
            return Err(Status::invalid_argument(format!("texts[{i}] is empty")));
        }
        // Tokenize once, off the async runtime (long texts take milliseconds): the limit is
        // checked and enforced on these tokens, and the batch carries them to the model.
        let (embedder, limits) = (self.embedder.clone(), self.limits.clone());
        let (inputs, counts) = tokio::task::spawn_blocking(move || -> Result<(Vec<Encoded>, Vec<usize>), Status> {
            let max = limits.max_tokens_per_text.unwrap_or(embedder.max_tokens()).min(embedder.max_tokens());
            let texts: Vec<String> = if req.instruction.is_empty() {
                req.texts
            } else {
                req.texts
                    .iter()
                    .map(|t| embedder.with_instruction(&req.instruction, t))
                    .collect::<Result<_, _>>()
                    .map_err(|e| status::from_model(&e))?
            };
            let mut inputs = Vec::with_capacity(texts.len());
            let mut counts = Vec::with_capacity(texts.len());
            for (i, t) in texts.iter().enumerate() {
                let tokenized = embedder.tokenize(t, max).map_err(|e| status::from_model(&e))?;
                if tokenized.counted > max && !req.truncate {
                    return Err(too_large(
                        &format!("texts[{i}] tokens (set truncate to cut them)"),
                        tokenized.counted,
                        max,
                    ));
                }
                counts.push(tokenized.tokens.ids.len());
                inputs.push(tokenized.tokens);
            }
            Ok((inputs, counts))
        })
        .await
        .map_err(|_| Status::internal("tokenizer task failed"))??;
        let tokens: usize = counts.iter().sum();
        call.input_tokens(tokens);
        let (vectors, batch) = self.batcher.submit(inputs, tokens).await?;
        call.batch_size(batch);
        self.metrics.tokens_in.inc_by(tokens as u64);
        Ok(EmbedResponse {
            embeddings: vectors.into_iter().map(|values| Embedding { values }).collect(),
            usage: Some(Usage { prompt_tokens: tokens as u32, completion_tokens: 0, total_tokens: tokens as u32 }),
            model: self.model.clone(),
        })
    }
}

/// Embeds the texts of several requests in one pass. If the pass fails for a reason other
/// than the engine, each request is retried alone so one bad request cannot fail others;
/// an engine integrity failure is never retried. Once the engine has failed, nothing runs.
fn run_batch(
    e: &dyn Embedder,
    m: &Metrics,
    health: &Health,
    clock: &EngineClock,
    jobs: Vec<Vec<Encoded>>,
) -> Vec<Result<Vec<Vec<f32>>, Status>> {
    if let Err(s) = health.check() {
        return jobs.iter().map(|_| Err(s.clone())).collect();
    }
    let all: Vec<Encoded> = jobs.iter().flatten().cloned().collect();
    let (t, before) = (Instant::now(), clock());
    let result = e.embed_tokens(&all);
    m.account(t.elapsed().as_secs_f64(), before, clock());
    match result {
        Ok(mut vectors) => {
            let mut out = Vec::with_capacity(jobs.len());
            for job in &jobs {
                let rest = vectors.split_off(job.len());
                out.push(Ok(std::mem::replace(&mut vectors, rest)));
            }
            out
        }
        Err(err) => {
            health.observe(&err);
            let s = status::from_model(&err);
            if s.code() == tonic::Code::DataLoss {
                m.integrity_failures.inc();
            }
            if jobs.len() == 1 || status::is_engine_failure(&s) {
                return jobs.iter().map(|_| Err(s.clone())).collect();
            }
            jobs.iter()
                .map(|job| {
                    e.embed_tokens(job).map_err(|err| {
                        health.observe(&err);
                        status::from_model(&err)
                    })
                })
                .collect()
        }
    }
}

#[tonic::async_trait]
impl embedder_server::Embedder for EmbedderService {
    async fn embed(&self, request: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let call = Call::start(&self.metrics, SERVICE, "Embed");
        let result = self.handle(request.into_inner(), &call).instrument(call.span().clone()).await;
        if let Err(s) = &result {
            call.span().in_scope(|| tracing::info!(method = "Embed", code = ?s.code(), "request refused or failed"));
        }
        call.finish(code_of(&result));
        result.map(Response::new)
    }
}
