//! Dynamic batching: requests queued together (up to a token budget) share one forward
//! pass, each sequence still with its own mask; a burst gets a short window to gather, a
//! lone request on an idle service runs at once. The model runs on a
//! dedicated OS thread so the async runtime never blocks on it.

use std::{
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use tokio::sync::oneshot;
use tonic::Status;

use crate::{limits::overloaded, metrics::Metrics};

struct Item<J, R> {
    job: J,
    cost: usize,
    /// The result and how many requests shared its forward pass.
    reply: oneshot::Sender<(Result<R, Status>, usize)>,
}

/// How a batcher groups work.
#[derive(Clone, Copy, Debug)]
pub struct BatchPolicy {
    pub window: Duration,
    /// Sum of item costs (tokens) per batch; a single larger item runs alone.
    pub budget: usize,
    pub max_items: usize,
    pub max_queue: usize,
}

/// A queue in front of one model thread.
pub struct Batcher<J, R> {
    tx: mpsc::Sender<Item<J, R>>,
    depth: Arc<AtomicUsize>,
    policy: BatchPolicy,
    metrics: Metrics,
}

impl<J: Send + 'static, R: Send + 'static> Batcher<J, R> {
    /// Starts the model thread. `run` gets the jobs of one batch and returns one result
    /// per job, in order.
    pub fn spawn(
        name: &str,
        policy: BatchPolicy,
        metrics: Metrics,
        mut run: impl FnMut(Vec<J>) -> Vec<Result<R, Status>> + Send + 'static,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<Item<J, R>>();
        let depth = Arc::new(AtomicUsize::new(0));
        let (d, m) = (depth.clone(), metrics.clone());
        std::thread::Builder::new()
            .name(format!("gelo-{name}"))
            .spawn(move || {
                let take = |i: Item<J, R>| {
                    d.fetch_sub(1, Ordering::SeqCst);
                    m.queue_depth.set(d.load(Ordering::SeqCst) as i64);
                    i
                };
                let mut pending: Option<Item<J, R>> = None;
                loop {
                    let first = match pending.take() {
                        Some(i) => i,
                        None => match rx.recv() {
                            Ok(i) => take(i),
                            Err(_) => return, // every sender dropped: shut down
                        },
                    };
                    let mut cost = first.cost;
                    let mut batch = vec![first];
                    let deadline = Instant::now() + policy.window;
                    while batch.len() < policy.max_items {
                        // Everything already queued joins at once. When the queue is empty,
                        // a lone request runs straight away (an idle service adds no
                        // latency), while a burst in progress gets the window to gather
                        // the rest of it.
                        let next = match rx.try_recv() {
                            Ok(i) => Some(i),
                            Err(mpsc::TryRecvError::Empty) if batch.len() >= 2 => {
                                let left = deadline.saturating_duration_since(Instant::now());
                                if left.is_zero() { None } else { rx.recv_timeout(left).ok() }
                            }
                            Err(_) => None,
                        };
                        let Some(i) = next else { break };
                        let i = take(i);
                        if cost + i.cost > policy.budget {
                            pending = Some(i);
                            break;
                        }
                        cost += i.cost;
                        batch.push(i);
                    }
                    // A client that went away (deadline, cancel) gets no work done.
                    batch.retain(|i| !i.reply.is_closed());
                    if batch.is_empty() {
                        continue;
                    }
                    m.batch_items.observe(batch.len() as f64);
                    let (jobs, replies): (Vec<J>, Vec<_>) = batch.into_iter().map(|i| (i.job, i.reply)).unzip();
                    let n = jobs.len();
                    let results = match std::panic::catch_unwind(AssertUnwindSafe(|| models::on_pool(|| run(jobs)))) {
                        Ok(r) if r.len() == n => r,
                        Ok(_) => (0..n)
                            .map(|_| Err(Status::internal("batch produced the wrong number of results")))
                            .collect(),
                        Err(_) => {
                            tracing::error!("model thread panicked; the batch failed and the thread goes on");
                            (0..n).map(|_| Err(Status::internal("internal error while running the model"))).collect()
                        }
                    };
                    for (r, reply) in results.into_iter().zip(replies) {
                        let _ = reply.send((r, n));
                    }
                }
            })
            .expect("spawning the model thread");
        Batcher { tx, depth, policy, metrics }
    }

    /// Queues one job and waits for its result and the number of requests in its batch.
    pub async fn submit(&self, job: J, cost: usize) -> Result<(R, usize), Status> {
        if self.depth.load(Ordering::SeqCst) >= self.policy.max_queue {
            return Err(overloaded("request queue", self.policy.max_queue));
        }
        let (reply, rx) = oneshot::channel();
        self.depth.fetch_add(1, Ordering::SeqCst);
        self.metrics.queue_depth.set(self.depth.load(Ordering::SeqCst) as i64);
        if self.tx.send(Item { job, cost, reply }).is_err() {
            return Err(Status::unavailable("the model thread has stopped"));
        }
        match tokio::time::timeout(crate::QUEUE_WAIT, rx).await {
            Ok(Ok((r, batch))) => r.map(|r| (r, batch)),
            Ok(Err(_)) => Err(Status::internal("the model thread dropped the request")),
            Err(_) => Err(Status::resource_exhausted(format!(
                "no result within {}s: the service is overloaded",
                crate::QUEUE_WAIT.as_secs()
            ))),
        }
    }
}
