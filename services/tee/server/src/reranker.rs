//! `gelo.v1.Reranker`: (query, document) pairs of several requests share a forward pass.

use std::{sync::Arc, time::Instant};

use api::v1::{RerankRequest, RerankResponse, RerankResult, Usage, reranker_server};
use models::{Reranker, bert::Encoded};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::{
    batcher::{BatchPolicy, Batcher},
    embedder::EngineClock,
    health::Health,
    limits::{Limits, too_large},
    metrics::Metrics,
    rpc::{Call, code_of},
    status,
};

const SERVICE: &str = reranker_server::SERVICE_NAME;

/// One request's (query, document) pairs, tokenized once.
type Job = Vec<Encoded>;

pub struct RerankerService {
    reranker: Arc<dyn Reranker>,
    batcher: Batcher<Job, Vec<f32>>,
    limits: Limits,
    metrics: Metrics,
    health: Health,
    model: String,
}

impl RerankerService {
    pub fn new(
        reranker: Arc<dyn Reranker>,
        limits: Limits,
        metrics: Metrics,
        clock: EngineClock,
        health: Health,
    ) -> Self {
        let policy = BatchPolicy {
            window: limits.batch_window,
            budget: limits.batch_tokens,
            max_items: limits.max_documents,
            max_queue: limits.max_queue,
        };
        let (r, m, h) = (reranker.clone(), metrics.clone(), health.clone());
        let batcher = Batcher::spawn("reranker", policy, metrics.clone(), move |jobs: Vec<Job>| {
            run_batch(r.as_ref(), &m, &h, &clock, jobs)
        });
        health.add_service(SERVICE);
        RerankerService { model: reranker.identity().to_string(), reranker, batcher, limits, metrics, health }
    }

    pub fn into_server(self) -> reranker_server::RerankerServer<Self> {
        let max = self.limits.max_request_bytes;
        reranker_server::RerankerServer::new(self).max_decoding_message_size(max)
    }

    async fn handle(&self, req: RerankRequest, call: &Call) -> Result<RerankResponse, Status> {
        self.health.check()?;
        call.items(req.documents.len());
        if req.query.trim().is_empty() {
            return Err(Status::invalid_argument("query is empty"));
        }
        if req.documents.is_empty() {
            return Err(Status::invalid_argument("documents is empty"));
        }
        if req.documents.len() > self.limits.max_documents {
            return Err(too_large("documents per request", req.documents.len(), self.limits.max_documents));
        }
        if let Some(i) = req.documents.iter().position(|d| d.trim().is_empty()) {
            return Err(Status::invalid_argument(format!("documents[{i}] is empty")));
        }
        let (r, limits) = (self.reranker.clone(), self.limits.clone());
        let (query, docs, truncate) = (req.query, req.documents, req.truncate);
        // Tokenize each pair once: the limit is checked and enforced on these tokens, and the
        // batch carries them to the model.
        let (inputs, tokens) = tokio::task::spawn_blocking(move || -> Result<_, Status> {
            let max = limits.max_tokens_per_text.unwrap_or(r.max_tokens()).min(r.max_tokens());
            let (mut inputs, mut tokens) = (Vec::with_capacity(docs.len()), 0);
            for (i, d) in docs.iter().enumerate() {
                let pair = r.tokenize_pair(&query, d, max).map_err(|e| status::from_model(&e))?;
                if pair.counted > max && !truncate {
                    return Err(too_large(
                        &format!("documents[{i}] tokens with the query (set truncate to cut them)"),
                        pair.counted,
                        max,
                    ));
                }
                tokens += pair.tokens.ids.len();
                inputs.push(pair.tokens);
            }
            Ok((inputs, tokens))
        })
        .await
        .map_err(|_| Status::internal("tokenizer task failed"))??;
        call.input_tokens(tokens);
        let (scores, batch) = self.batcher.submit(inputs, tokens).await?;
        call.batch_size(batch);
        self.metrics.tokens_in.inc_by(tokens as u64);
        let mut results: Vec<RerankResult> =
            scores.into_iter().enumerate().map(|(i, score)| RerankResult { index: i as u32, score }).collect();
        results.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.index.cmp(&b.index)));
        if req.top_n > 0 {
            results.truncate(req.top_n as usize);
        }
        Ok(RerankResponse {
            results,
            usage: Some(Usage { prompt_tokens: tokens as u32, completion_tokens: 0, total_tokens: tokens as u32 }),
            model: self.model.clone(),
        })
    }
}

fn run_batch(
    r: &dyn Reranker,
    m: &Metrics,
    health: &Health,
    clock: &EngineClock,
    jobs: Vec<Job>,
) -> Vec<Result<Vec<f32>, Status>> {
    if let Err(s) = health.check() {
        return jobs.iter().map(|_| Err(s.clone())).collect();
    }
    let all: Vec<Encoded> = jobs.iter().flatten().cloned().collect();
    let (t, before) = (Instant::now(), clock());
    let result = r.score_tokens(&all);
    m.account(t.elapsed().as_secs_f64(), before, clock());
    match result {
        Ok(mut scores) => jobs
            .iter()
            .map(|job| {
                let rest = scores.split_off(job.len());
                Ok(std::mem::replace(&mut scores, rest))
            })
            .collect(),
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
                    r.score_tokens(job).map_err(|err| {
                        health.observe(&err);
                        status::from_model(&err)
                    })
                })
                .collect()
        }
    }
}

#[tonic::async_trait]
impl reranker_server::Reranker for RerankerService {
    async fn rerank(&self, request: Request<RerankRequest>) -> Result<Response<RerankResponse>, Status> {
        let call = Call::start(&self.metrics, SERVICE, "Rerank");
        let result = self.handle(request.into_inner(), &call).instrument(call.span().clone()).await;
        if let Err(s) = &result {
            call.span().in_scope(|| tracing::info!(method = "Rerank", code = ?s.code(), "request refused or failed"));
        }
        call.finish(code_of(&result));
        result.map(Response::new)
    }
}
