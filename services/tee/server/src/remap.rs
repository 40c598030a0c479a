//! Client mistakes that tonic reports with server-fault codes, remapped: a request over the
//! size limit (tonic: OUT_OF_RANGE) is RESOURCE_EXHAUSTED, and a request that does not
//! decode — invalid UTF-8 in a string field, say (tonic: INTERNAL) — is INVALID_ARGUMENT.
//! tonic's message, which names the limit or the decode error, is kept.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{HeaderMap, HeaderValue};

#[derive(Clone, Copy, Debug, Default)]
pub struct ClientErrorsLayer;

impl<S> tower::Layer<S> for ClientErrorsLayer {
    type Service = ClientErrors<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ClientErrors(inner)
    }
}

#[derive(Clone, Debug)]
pub struct ClientErrors<S>(S);

impl<S, ReqB, ResB> tower::Service<http::Request<ReqB>> for ClientErrors<S>
where
    S: tower::Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let fut = self.0.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            remap(resp.headers_mut());
            Ok(resp)
        })
    }
}

fn remap(h: &mut HeaderMap) {
    let (Some(code), Some(msg)) = (h.get("grpc-status"), h.get("grpc-message")) else { return };
    let msg = msg.to_str().unwrap_or_default().replace("%20", " ");
    let new = match code.as_bytes() {
        b"11" if msg.contains("message length too large") => "8",
        b"13" if msg.contains("failed to decode Protobuf message") => "3",
        _ => return,
    };
    h.insert("grpc-status", HeaderValue::from_static(new));
}
