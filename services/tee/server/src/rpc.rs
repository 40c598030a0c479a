//! One RPC, observed from its start to its final status: a tracing span (exported as an
//! OpenTelemetry span when the binary installs an OTLP exporter) and the request count and
//! latency metrics, both by method and status code.
//!
//! A span carries the method, the status code, and item, batch and token counts. It never
//! carries request or response text, nor status messages; nothing in this module can
//! record a string that came from a client.

use std::time::Instant;

use tonic::Code;
use tracing::{Span, field::Empty};

use crate::metrics::Metrics;

/// Target of the RPC spans (and the filter the OTLP layer selects them by).
pub const TARGET: &str = "gelo::rpc";

pub struct Call {
    method: &'static str,
    span: Span,
    start: Instant,
    metrics: Metrics,
    finished: bool,
}

impl Call {
    /// `service` is the gRPC service's full name (`gelo.v1.Embedder`), `method` its method.
    pub fn start(metrics: &Metrics, service: &'static str, method: &'static str) -> Call {
        let span = tracing::info_span!(
            target: TARGET,
            "rpc",
            otel.name = %format_args!("{service}/{method}"),
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = method,
            rpc.grpc.status_code = Empty,
            gelo.items = Empty,
            gelo.batch_size = Empty,
            gelo.input_tokens = Empty,
            gelo.output_tokens = Empty,
        );
        Call { method, span, start: Instant::now(), metrics: metrics.clone(), finished: false }
    }

    /// The span to run the handler in.
    pub fn span(&self) -> &Span {
        &self.span
    }

    // Counts are recorded as i64: tracing-opentelemetry exports a u64 as a string.

    /// Texts, documents or messages in the request.
    pub fn items(&self, n: usize) {
        self.span.record("gelo.items", n as i64);
    }

    /// Requests that shared this request's forward pass (generator: the largest decode
    /// batch its sequence ran in).
    pub fn batch_size(&self, n: usize) {
        self.span.record("gelo.batch_size", n as i64);
    }

    pub fn input_tokens(&self, n: usize) {
        self.span.record("gelo.input_tokens", n as i64);
    }

    pub fn output_tokens(&self, n: usize) {
        self.span.record("gelo.output_tokens", n as i64);
    }

    /// Records the final status; the latency runs from `start` to here.
    pub fn finish(mut self, code: Code) {
        self.close(code);
    }

    fn close(&mut self, code: Code) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        // tracing-opentelemetry ends a span at its last exit, not when it closes: enter it
        // here so the span ends with the call (a stream: its last message), not when the
        // handler last ran.
        let _end = self.span.enter();
        self.span.record("rpc.grpc.status_code", code as i32);
        if is_server_error(code) {
            self.span.record("otel.status_code", "ERROR");
        }
        self.metrics.observe(self.method, code, self.start.elapsed().as_secs_f64());
    }
}

/// A call dropped before it finished was cancelled: the client went away (or its deadline
/// passed in tonic) while the handler or the stream was still running.
impl Drop for Call {
    fn drop(&mut self) {
        self.close(Code::Cancelled);
    }
}

/// The codes OpenTelemetry's gRPC conventions count as server errors.
fn is_server_error(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// The status code of a handler's result.
pub fn code_of<T>(r: &Result<T, tonic::Status>) -> Code {
    r.as_ref().map_or_else(|s| s.code(), |_| Code::Ok)
}
