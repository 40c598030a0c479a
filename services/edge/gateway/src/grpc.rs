//! `gelo.v1.Rag` over gRPC, on top of [`Pipeline`].

use std::{pin::Pin, sync::Arc, time::Instant};

use api::v1::{
    Backend, Citations, DeleteRequest, DeleteResponse, Document, IngestSummary, Passage, Passages, QueryRequest,
    QueryResponse, SearchRequest, SearchResponse, StatsRequest, StatsResponse, query_response::Event, rag_server,
};
use futures::{Stream, StreamExt};
use server::Metrics;
use tonic::{Request, Response, Status, Streaming};

use crate::{
    admission::{Admission, Admitted, Full},
    error::GatewayError,
    outbox::{Closed, outbox},
    pipeline::{Hit, Pipeline, QueryEvent, QueryParams},
};

pub struct RagService {
    pipeline: Arc<Pipeline>,
    metrics: Metrics,
    max_request_bytes: usize,
    admission: Admission,
}

impl RagService {
    pub fn new(pipeline: Arc<Pipeline>, metrics: Metrics) -> Self {
        // A document up to the configured limit, plus framing.
        let max_request_bytes = pipeline.settings.max_document_bytes + (64 << 10);
        RagService { pipeline, metrics, max_request_bytes, admission: Admission::default() }
    }

    /// Shares `admission` (the HTTP port's too): requests beyond its limit are refused at once.
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Admits a model request now or refuses it now (counted; [`Full::status`] is the reply).
    fn admit(&self, method: &str, t: Instant) -> Result<Admitted, Full> {
        self.admission.try_admit().inspect_err(|_| {
            self.metrics.observe(method, tonic::Code::ResourceExhausted, t.elapsed().as_secs_f64());
        })
    }

    /// An ingest stream's next document (`None` at its end). Waiting on the client keeps the
    /// stream's place for [`Admission::stream_hold`] only: then the place is given back, and
    /// taken again when the document arrives (refused at once if the gateway is full by
    /// then). A client that sends nothing for [`Admission::message_timeout`] ends the call
    /// with `DEADLINE_EXCEEDED`.
    async fn next_document(
        &self,
        docs: &mut Streaming<Document>,
        admitted: &mut Option<Admitted>,
        t: Instant,
    ) -> Result<Option<Document>, Status> {
        let (hold, limit) = (self.admission.stream_hold(), self.admission.message_timeout());
        let mut next = std::pin::pin!(docs.message());
        if let Ok(doc) = tokio::time::timeout(hold, next.as_mut()).await {
            return doc;
        }
        admitted.take();
        let doc = tokio::time::timeout(limit.saturating_sub(hold), next)
            .await
            .map_err(|_| Status::from(GatewayError::ClientTimeout { what: "next document", after: limit }))??;
        if doc.is_some() {
            *admitted = Some(self.admit("Ingest", t).map_err(|f| f.status())?);
        }
        Ok(doc)
    }

    pub fn into_server(self) -> rag_server::RagServer<Self> {
        let max = self.max_request_bytes;
        rag_server::RagServer::new(self).max_decoding_message_size(max).max_encoding_message_size(64 << 20)
    }

    fn observe<T>(&self, method: &str, t: Instant, r: &Result<T, Status>) {
        let code = r.as_ref().map_or_else(|s| s.code(), |_| tonic::Code::Ok);
        self.metrics.observe(method, code, t.elapsed().as_secs_f64());
        if let Err(s) = r {
            tracing::info!(method, code = ?s.code(), "request refused or failed");
        }
    }
}

pub fn passage(h: &Hit) -> Passage {
    let p = &h.passage;
    Passage {
        passage_id: p.passage_id.clone(),
        document_id: p.document_id.clone(),
        title: p.title.clone(),
        text: p.text.clone(),
        score: p.score,
        rerank_score: h.rerank_score,
        metadata: p.metadata.clone().into_iter().collect(),
    }
}

type QueryStream = Pin<Box<dyn Stream<Item = Result<QueryResponse, Status>> + Send>>;

fn to_response(e: Result<QueryEvent, GatewayError>) -> Result<QueryResponse, Status> {
    let event = match e? {
        QueryEvent::Passages(hits) => Event::Passages(Passages { passages: hits.iter().map(passage).collect() }),
        QueryEvent::Text(text) => Event::Text(text),
        QueryEvent::Usage(u, _) => Event::Usage(u),
        QueryEvent::Citations { cited, unknown } => Event::Citations(Citations { passage_ids: cited, unknown }),
        QueryEvent::Timings(timings) => Event::Timings(timings.into()),
    };
    Ok(QueryResponse { event: Some(event) })
}

#[tonic::async_trait]
impl rag_server::Rag for RagService {
    async fn ingest(&self, request: Request<Streaming<Document>>) -> Result<Response<IngestSummary>, Status> {
        let t = Instant::now();
        let mut admitted = Some(self.admit("Ingest", t).map_err(|f| f.status())?);
        let mut docs = request.into_inner();
        let mut ingest = self.pipeline.ingest();
        let result: Result<IngestSummary, Status> = async {
            let stored_so_far = |s: Status, i: &crate::pipeline::Ingest| {
                let mut out = Status::new(
                    s.code(),
                    format!("{}; {} documents were stored before this", s.message(), i.documents),
                );
                *out.metadata_mut() = s.metadata().clone();
                out
            };
            loop {
                let doc = match self.next_document(&mut docs, &mut admitted, t).await {
                    Ok(Some(doc)) => doc,
                    Ok(None) => break,
                    Err(s) => return Err(stored_so_far(s, &ingest)),
                };
                if let Err(e) = ingest.add(doc.into()).await {
                    return Err(stored_so_far(e.into(), &ingest));
                }
            }
            if admitted.is_none() {
                // The stream ended after a wait: the last batch is work, and takes a place.
                admitted = Some(self.admit("Ingest", t).map_err(|f| stored_so_far(f.status(), &ingest))?);
            }
            if let Err(e) = ingest.flush().await {
                return Err(stored_so_far(e.into(), &ingest));
            }
            Ok(IngestSummary {
                documents: ingest.documents,
                chunks: ingest.chunks,
                skipped: std::mem::take(&mut ingest.skipped),
            })
        }
        .await;
        drop(admitted);
        self.observe("Ingest", t, &result);
        result.map(Response::new)
    }

    async fn search(&self, request: Request<SearchRequest>) -> Result<Response<SearchResponse>, Status> {
        let t = Instant::now();
        let _admitted = self.admit("Search", t).map_err(|f| f.status())?;
        let r = request.into_inner();
        let result = self
            .pipeline
            .search(&r.query, r.top_k, r.rerank)
            .await
            .map(|(hits, timings)| SearchResponse {
                passages: hits.iter().map(passage).collect(),
                timings: Some(timings.into()),
            })
            .map_err(Status::from);
        self.observe("Search", t, &result);
        result.map(Response::new)
    }

    type QueryStream = QueryStream;

    async fn query(&self, request: Request<QueryRequest>) -> Result<Response<Self::QueryStream>, Status> {
        let t = Instant::now();
        let admitted = self.admit("Query", t).map_err(|f| f.status())?;
        let r = request.into_inner();
        let params = QueryParams {
            question: r.question,
            top_k: r.top_k,
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            seed: r.seed,
            rerank: r.rerank,
        };
        let metrics = self.metrics.clone();
        let mut events = self.pipeline.query(params);
        // A forwarding task, so the outcome is recorded when the stream ends (a failure can
        // come mid-answer) and a client that goes away, or stops reading for the send
        // timeout, cancels the generation.
        let send_timeout = self.admission.send_timeout();
        let stalled = move || Err(Status::deadline_exceeded(Closed::Stalled(send_timeout).message()));
        let (tx, rx) = outbox(send_timeout, stalled);
        tokio::spawn(async move {
            // The query counts against the admission limit until its last event.
            let _admitted = admitted;
            let mut code = tonic::Code::Ok;
            while let Some(e) = events.next().await {
                let msg = to_response(e);
                let failed = msg.is_err();
                if let Err(s) = &msg {
                    code = s.code();
                    tracing::info!(method = "Query", code = ?s.code(), "query failed");
                }
                if let Err(closed) = tx.send(msg).await {
                    code = match closed {
                        Closed::Gone => tonic::Code::Cancelled,
                        Closed::Stalled(_) => tonic::Code::DeadlineExceeded,
                    };
                    tracing::info!(method = "Query", "{}", closed.message());
                    break;
                }
                if failed {
                    break;
                }
            }
            metrics.observe("Query", code, t.elapsed().as_secs_f64());
        });
        Ok(Response::new(Box::pin(rx)))
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<DeleteResponse>, Status> {
        let t = Instant::now();
        let result = self
            .pipeline
            .delete(request.into_inner().ids)
            .await
            .map(|deleted| DeleteResponse { deleted: deleted.min(u32::MAX as u64) as u32 })
            .map_err(Status::from);
        self.observe("Delete", t, &result);
        result.map(Response::new)
    }

    async fn stats(&self, _request: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        let t = Instant::now();
        let result = self.pipeline.stats().await.map_err(Status::from).map(|(s, dim)| StatsResponse {
            documents: s.documents,
            chunks: s.chunks,
            store_bytes: s.bytes_on_disk,
            dimension: dim as u32,
            backends: self
                .pipeline
                .pool
                .status()
                .into_iter()
                .map(|b| Backend {
                    verified: b.verified(),
                    role: b.role.to_string(),
                    endpoint: b.endpoint,
                    reason: b.reason,
                    model_identity: b.model_identity,
                    tls_spki_sha256: b.tls_spki_sha256,
                    measurement: b.measurement,
                    verified_age_seconds: b.verified_age.map_or(0.0, |d| d.as_secs_f64()),
                    requests: b.requests,
                })
                .collect(),
        });
        self.observe("Stats", t, &result);
        result.map(Response::new)
    }
}
