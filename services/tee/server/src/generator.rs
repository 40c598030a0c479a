//! `gelo.v1.Generator`: streaming generation with continuous batching. One scheduler
//! thread owns every running sequence (and its KV cache); new requests are prefilled and
//! join the running decode batch at the next step; a stream whose client went away
//! (cancel) or whose deadline passed is dropped at the next step, freeing its KV cache.
//! The server enforces `grpc-timeout` itself: tonic's own timeout ends when the handler
//! returns the stream, long before the stream ends.
//!
//! A request is checked in one place, [`TextGenerator::admit`] (the models own the rules;
//! the service's [`Limits`] become its `GenerationLimits`): this module only maps the
//! protobuf fields to a `GenerateRequest` and a refusal to its status
//! ([`status::from_model`]). The scheduler takes only admitted requests.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    task::{Context, Poll},
    time::Instant,
};

use api::v1::{FinishReason as PbFinish, GenerateRequest as PbRequest, GenerateResponse, Usage, generator_server};
use futures::{Stream, StreamExt};
use models::{
    AdmittedRequest, ChatMessage, Chunk, FinishReason, GenerateRequest, GenerationLimits, Prompt, SamplingParams,
    TextGenerator, generate::Sequence,
};
use tokio::sync::mpsc as tmpsc;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument;

use crate::{
    embedder::EngineClock,
    health::Health,
    limits::{Limits, overloaded},
    metrics::Metrics,
    rpc::Call,
    status,
};

const SERVICE: &str = generator_server::SERVICE_NAME;

type Out = tmpsc::UnboundedSender<Result<GenerateResponse, Status>>;

struct NewSeq {
    req: AdmittedRequest,
    out: Out,
    deadline: Option<Instant>,
    /// The largest decode batch the sequence ran in, for its RPC's span.
    peak_batch: Arc<AtomicUsize>,
}

struct Running {
    seq: Sequence,
    out: Out,
    deadline: Option<Instant>,
    peak_batch: Arc<AtomicUsize>,
}

/// The RPC's deadline from its `grpc-timeout` header (`<digits><H|M|S|m|u|n>`).
pub fn deadline(meta: &tonic::metadata::MetadataMap) -> Option<Instant> {
    let v = meta.get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    };
    Instant::now().checked_add(d)
}

/// Whether a deadline has passed; if so, tells the client (`when`: before or during
/// generation).
fn expired(deadline: Option<Instant>, now: Instant, out: &Out, when: &str) -> bool {
    match deadline {
        Some(d) if d <= now => {
            let _ =
                out.send(Err(Status::deadline_exceeded(format!("the request's deadline passed {when} generation"))));
            true
        }
        _ => false,
    }
}

/// Ends sequences whose RPC deadline has passed, telling their clients so. Dropping a
/// sequence frees its KV cache.
fn expire(running: &mut Vec<Running>) {
    let now = Instant::now();
    running.retain(|r| !expired(r.deadline, now, &r.out, "during"));
}

pub struct GeneratorService {
    generator: Arc<TextGenerator>,
    tx: mpsc::Sender<NewSeq>,
    waiting: Arc<AtomicUsize>,
    limits: Limits,
    /// What `limits` says about a generation request, for [`TextGenerator::admit`].
    admission: Arc<GenerationLimits>,
    metrics: Metrics,
    health: Health,
}

/// Tokens generated when a request does not say.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// The service's limits on a generation request; the rest (the longest stop string, the
/// runs `stop_repeated_words` may name) are the models' defaults.
fn admission(limits: &Limits) -> GenerationLimits {
    GenerationLimits {
        max_output_tokens: limits.max_output_tokens,
        max_stop_strings: limits.max_stop_strings,
        max_prompt_tokens: limits.max_prompt_tokens,
        ..GenerationLimits::default()
    }
}

/// The request as the models take it, field for field; a field left at 0 (or empty)
/// means its default. Checking it is [`TextGenerator::admit`]'s business.
fn request(r: PbRequest) -> GenerateRequest {
    let prompt = if r.raw_prompt.is_empty() {
        Prompt::Chat(r.messages.into_iter().map(|m| ChatMessage { role: m.role, content: m.content }).collect())
    } else {
        Prompt::Raw(r.raw_prompt)
    };
    let or = |v: f32, default: f32| if v == 0.0 { default } else { v };
    GenerateRequest {
        prompt,
        max_tokens: if r.max_tokens == 0 { DEFAULT_MAX_TOKENS } else { r.max_tokens as usize },
        sampling: SamplingParams {
            temperature: r.temperature,
            top_k: r.top_k as usize,
            top_p: or(r.top_p, 1.0),
            repetition_penalty: or(r.repetition_penalty, 1.0),
            seed: r.seed,
        },
        stop: r.stop,
        stop_repeated_words: r.stop_repeated_words as usize,
    }
}

impl GeneratorService {
    pub fn new(
        generator: Arc<TextGenerator>,
        limits: Limits,
        metrics: Metrics,
        clock: EngineClock,
        health: Health,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let scheduler = Scheduler {
            g: generator.clone(),
            m: metrics.clone(),
            health: health.clone(),
            clock,
            waiting: waiting.clone(),
            max_batch: limits.max_batch_sequences,
        };
        std::thread::Builder::new()
            .name("gelo-generator".into())
            .spawn(move || scheduler.run(rx))
            .expect("spawning the scheduler");
        health.add_service(SERVICE);
        let admission = Arc::new(admission(&limits));
        GeneratorService { generator, tx, waiting, limits, admission, metrics, health }
    }

    pub fn into_server(self) -> generator_server::GeneratorServer<Self> {
        let max = self.limits.max_request_bytes;
        generator_server::GeneratorServer::new(self).max_decoding_message_size(max)
    }

    async fn handle(&self, r: PbRequest, deadline: Option<Instant>, call: &Call) -> Result<Receiver, Status> {
        self.health.check()?;
        call.items(r.messages.len());
        let req = request(r);
        // Admission tokenizes (renders and counts the prompt): off the runtime.
        let (g, admission) = (self.generator.clone(), self.admission.clone());
        let req = tokio::task::spawn_blocking(move || g.admit(req, &admission))
            .await
            .map_err(|_| Status::internal("tokenizer task failed"))?
            .map_err(|e| status::from_model(&e))?;
        call.input_tokens(req.prompt_tokens().len());
        if self.waiting.load(Ordering::SeqCst) >= self.limits.max_queue {
            return Err(overloaded("generation queue", self.limits.max_queue));
        }
        let (out, rx) = tmpsc::unbounded_channel();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.metrics.queue_depth.set(self.waiting.load(Ordering::SeqCst) as i64);
        let peak_batch = Arc::new(AtomicUsize::new(0));
        self.tx
            .send(NewSeq { req, out, deadline, peak_batch: peak_batch.clone() })
            .map_err(|_| Status::unavailable("the generator has stopped"))?;
        Ok(Receiver { rx, peak_batch })
    }
}

struct Receiver {
    rx: tmpsc::UnboundedReceiver<Result<GenerateResponse, Status>>,
    peak_batch: Arc<AtomicUsize>,
}

fn message(c: &Chunk, seq: &Sequence) -> GenerateResponse {
    let finish = c.finish.map(|f| match f {
        FinishReason::Stop => PbFinish::Stop,
        FinishReason::Length => PbFinish::Length,
    });
    GenerateResponse {
        text: c.text.clone(),
        token_ids: c.tokens.clone(),
        finish_reason: finish.unwrap_or(PbFinish::Unspecified) as i32,
        usage: finish.map(|_| {
            let (p, g) = (seq.prompt_tokens() as u32, seq.generated_tokens() as u32);
            Usage { prompt_tokens: p, completion_tokens: g, total_tokens: p + g }
        }),
    }
}

/// Sends a chunk; false when the client is gone.
fn send(out: &Out, c: &Chunk, seq: &Sequence) -> bool {
    if c.text.is_empty() && c.tokens.is_empty() && c.finish.is_none() {
        return !out.is_closed();
    }
    out.send(Ok(message(c, seq))).is_ok()
}

/// The scheduler thread: owns every running sequence.
struct Scheduler {
    g: Arc<TextGenerator>,
    m: Metrics,
    health: Health,
    clock: EngineClock,
    waiting: Arc<AtomicUsize>,
    max_batch: usize,
}

impl Scheduler {
    fn run(self, rx: mpsc::Receiver<NewSeq>) {
        let (g, m, clock) = (&self.g, &self.m, &self.clock);
        let mut running: Vec<Running> = Vec::new();
        loop {
            // 1. Admit newcomers: block only when idle. A newcomer whose client is gone or
            //    whose deadline passed while it waited is never prefilled; once the engine
            //    has failed, none is.
            let mut new = Vec::new();
            if running.is_empty() {
                match rx.recv() {
                    Ok(n) => new.push(n),
                    Err(_) => return,
                }
            }
            while running.len() + new.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(n) => new.push(n),
                    Err(_) => break,
                }
            }
            self.waiting.fetch_sub(new.len(), Ordering::SeqCst);
            m.queue_depth.set(self.waiting.load(Ordering::SeqCst) as i64);
            let now = Instant::now();
            new.retain(|n| !n.out.is_closed() && !expired(n.deadline, now, &n.out, "before"));
            if let Err(s) = self.health.check() {
                for n in new.drain(..) {
                    let _ = n.out.send(Err(s.clone()));
                }
            }
            if !new.is_empty() {
                self.prefill(new, &mut running);
            }
            expire(&mut running);
            m.active_sequences.set(running.len() as i64);
            if running.is_empty() {
                continue;
            }
            for r in &running {
                r.peak_batch.fetch_max(running.len(), Ordering::Relaxed);
            }
            // 2. One decode step for every running sequence.
            let (t, before) = (Instant::now(), clock());
            let result = {
                let mut refs: Vec<&mut Sequence> = running.iter_mut().map(|r| &mut r.seq).collect();
                models::on_pool(|| g.step(&mut refs))
            };
            m.account(t.elapsed().as_secs_f64(), before, clock());
            m.batch_items.observe(running.len() as f64);
            match result {
                Ok(chunks) => {
                    let mut keep = Vec::with_capacity(running.len());
                    for (r, c) in running.into_iter().zip(chunks) {
                        m.tokens_out.inc_by(c.tokens.len() as u64);
                        let alive = send(&r.out, &c, &r.seq);
                        if alive && !r.seq.is_finished() {
                            keep.push(r);
                        }
                        // Dropping `r` frees the sequence's KV cache (scrubbed on drop).
                    }
                    running = keep;
                    m.active_sequences.set(running.len() as i64);
                }
                Err(e) => {
                    self.health.observe(&e);
                    let s = status::from_model(&e);
                    if s.code() == Code::DataLoss {
                        m.integrity_failures.inc();
                    }
                    tracing::error!(code = ?s.code(), sequences = running.len(), "decode step failed; its sequences are aborted");
                    for r in running.drain(..) {
                        let _ = r.out.send(Err(s.clone()));
                    }
                    m.active_sequences.set(0);
                }
            }
        }
    }

    /// Prefills newcomers in one pass; if that fails, alone, so one bad prompt fails only itself.
    fn prefill(&self, new: Vec<NewSeq>, running: &mut Vec<Running>) {
        let (g, m, clock) = (&self.g, &self.m, &self.clock);
        let failed = |e: &models::ModelError| {
            self.health.observe(e);
            status::from_model(e)
        };
        let reqs: Vec<AdmittedRequest> = new.iter().map(|n| n.req.clone()).collect();
        let (t, before) = (Instant::now(), clock());
        let started = models::on_pool(|| g.start_batch(&reqs));
        m.account(t.elapsed().as_secs_f64(), before, clock());
        let results: Vec<Result<(Sequence, Chunk), Status>> = match started {
            Ok(v) => v.into_iter().map(Ok).collect(),
            Err(e) if new.len() == 1 => vec![Err(failed(&e))],
            Err(e) => {
                let s = failed(&e);
                if status::is_engine_failure(&s) {
                    new.iter().map(|_| Err(s.clone())).collect()
                } else {
                    reqs.iter().map(|r| models::on_pool(|| g.start(r)).map_err(|e| failed(&e))).collect()
                }
            }
        };
        for (n, r) in new.into_iter().zip(results) {
            match r {
                Ok((seq, chunk)) => {
                    m.tokens_in.inc_by(seq.prompt_tokens() as u64);
                    m.tokens_out.inc_by(chunk.tokens.len() as u64);
                    if send(&n.out, &chunk, &seq) && !seq.is_finished() {
                        running.push(Running { seq, out: n.out, deadline: n.deadline, peak_batch: n.peak_batch });
                    }
                }
                Err(s) => {
                    if s.code() == Code::DataLoss {
                        m.integrity_failures.inc();
                    }
                    let _ = n.out.send(Err(s));
                }
            }
        }
    }
}

/// A Generate response stream that closes its RPC when it ends: the latency, the status
/// code (the stream's error, OK at its final message, CANCELLED when tonic drops it early)
/// and the output tokens cover the whole stream, not only the call that opened it.
struct Observed {
    rx: tokio_stream::wrappers::UnboundedReceiverStream<Result<GenerateResponse, Status>>,
    call: Option<Call>,
    peak_batch: Arc<AtomicUsize>,
    output_tokens: usize,
}

impl Observed {
    fn close(&mut self, code: Code) {
        if let Some(call) = self.call.take() {
            call.output_tokens(self.output_tokens);
            call.batch_size(self.peak_batch.load(Ordering::Relaxed));
            call.finish(code);
        }
    }
}

impl Stream for Observed {
    type Item = Result<GenerateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = std::task::ready!(self.rx.poll_next_unpin(cx));
        match &item {
            Some(Ok(m)) => {
                self.output_tokens += m.token_ids.len();
                // The final message (finish reason, usage) ends the call before the client
                // can see it, so a client that saw its answer also sees it counted.
                if m.finish_reason != PbFinish::Unspecified as i32 {
                    self.close(Code::Ok);
                }
            }
            Some(Err(s)) => self.close(s.code()),
            None => self.close(Code::Ok),
        }
        Poll::Ready(item)
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        // Gone before its end: the client cancelled (the sequence leaves the batch at the
        // next step, as the receiver is dropped with us).
        self.close(Code::Cancelled);
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl generator_server::Generator for GeneratorService {
    type GenerateStream = ResponseStream;

    async fn generate(&self, request: Request<PbRequest>) -> Result<Response<Self::GenerateStream>, Status> {
        let call = Call::start(&self.metrics, SERVICE, "Generate");
        let deadline = deadline(request.metadata());
        match self.handle(request.into_inner(), deadline, &call).instrument(call.span().clone()).await {
            Ok(Receiver { rx, peak_batch }) => {
                let rx = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
                Ok(Response::new(Box::pin(Observed { rx, call: Some(call), peak_batch, output_tokens: 0 })))
            }
            Err(s) => {
                call.span()
                    .in_scope(|| tracing::info!(method = "Generate", code = ?s.code(), "request refused or failed"));
                call.finish(s.code());
                Err(s)
            }
        }
    }
}
