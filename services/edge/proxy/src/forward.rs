//! One request across the attested channel: the local HTTP/1.1 (or HTTP/2) request made an
//! HTTP/2 request to the gateway's RA-TLS port, and its answer, streamed, made the local
//! response. Hop-by-hop headers stay on their hop (RFC 9110, section 7.6.1); the browser's
//! `Origin` and `Sec-Fetch-*`, checked on the proxy's own port, stay there too; everything
//! else, the API key's `Authorization` included, goes to the gateway inside RA-TLS.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Version, header, request::Parts};
use tonic::transport::Channel;
use tower::{Service, ServiceExt};

/// Headers that describe one connection, not the request.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Headers about the browser's page, judged on the proxy's port.
const LOCAL_ONLY: [HeaderName; 6] = [
    header::HOST,
    header::ORIGIN,
    header::EXPECT,
    HeaderName::from_static("sec-fetch-site"),
    HeaderName::from_static("sec-fetch-mode"),
    HeaderName::from_static("sec-fetch-dest"),
];

fn strip(headers: &mut HeaderMap, also: &[HeaderName]) {
    // Headers a `Connection` header names are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(also).chain(&named) {
        headers.remove(name);
    }
}

/// The request to send: method, path and query, and headers of `head`, with `body`. The
/// channel supplies scheme and authority.
pub fn request(head: &Parts, body: Bytes) -> http::Request<tonic::body::Body> {
    let mut headers = head.headers.clone();
    strip(&mut headers, &LOCAL_ONLY);
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = http::Request::new(tonic::body::Body::new(http_body_full(body)));
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = path.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = headers;
    req
}

/// The gateway's answer as the local response, its body streamed as it arrives.
pub fn response(resp: http::Response<tonic::body::Body>) -> axum::response::Response {
    let (mut parts, body) = resp.into_parts();
    strip(&mut parts.headers, &[]);
    parts.version = Version::HTTP_11;
    axum::response::Response::from_parts(parts, axum::body::Body::new(body))
}

/// Sends `req` over `channel` (a new connection of it is verified by the RA-TLS connector
/// before the request crosses it).
pub async fn send(
    mut channel: Channel,
    req: http::Request<tonic::body::Body>,
) -> Result<http::Response<tonic::body::Body>, tonic::transport::Error> {
    channel.ready().await?.call(req).await
}

fn http_body_full(body: Bytes) -> axum::body::Body {
    axum::body::Body::from(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_page_headers_stay_and_the_key_goes() {
        let req = http::Request::builder()
            .method("POST")
            .uri("http://127.0.0.1:8090/v1/chat/completions?x=1")
            .header(header::HOST, "127.0.0.1:8090")
            .header(header::ORIGIN, "http://127.0.0.1:8090")
            .header("sec-fetch-site", "same-origin")
            .header(header::CONNECTION, "keep-alive, x-private")
            .header("x-private", "1")
            .header(header::TRANSFER_ENCODING, "chunked")
            .header(header::AUTHORIZATION, "Bearer gelo-key")
            .header(header::CONTENT_TYPE, "application/json")
            .body(())
            .unwrap();
        let (head, ()) = req.into_parts();
        let out = request(&head, Bytes::from_static(b"{}"));
        assert_eq!(out.uri(), "/v1/chat/completions?x=1");
        assert_eq!(out.method(), "POST");
        assert_eq!(out.version(), Version::HTTP_2);
        let names: Vec<&str> = out.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["authorization", "content-type"], "{names:?}");
    }
}
