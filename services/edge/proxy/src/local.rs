//! The proxy's own port: plain HTTP on loopback, like the gateway's local port, so it takes
//! the same care with browsers before anything is forwarded. `Host` must be one of
//! `localhost`, `127.0.0.1`, `[::1]` with the port (a page whose DNS name was rebound to
//! 127.0.0.1 sends its own name: 421 `host_not_allowed`); an `Origin` must be one of those
//! too, and an API request a browser marks `Sec-Fetch-Site: cross-site` or `same-site` is
//! refused (403 `origin_not_allowed`). The API key is the gateway's to check.
//!
//! Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`.

use axum::{
    Json,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

/// Routes of the gateway that hold nothing from the store (its console's files and its
/// OpenAPI document): a page of another site may load them, as from the gateway itself.
const PUBLIC: &[&str] = &["/", "/console/console.js", "/console/console.css", "/openapi.json"];

/// The names the proxy's port answers to.
pub struct LocalNames {
    port: u16,
}

impl LocalNames {
    pub fn new(port: u16) -> Self {
        LocalNames { port }
    }

    fn allows(&self, authority: &str) -> bool {
        let authority = authority.to_ascii_lowercase();
        ["localhost", "127.0.0.1", "[::1]"].iter().any(|n| authority == format!("{n}:{}", self.port))
    }

    /// Refuses a request from a page that is not this port's own, before anything is sent.
    pub fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        authority: Option<&str>,
    ) -> Result<(), ApiError> {
        let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or("?")).or(authority);
        if !host.is_some_and(|h| self.allows(h)) || !authority.is_none_or(|a| self.allows(a)) {
            return Err(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "invalid_request_error",
                "host_not_allowed",
                format!("gelo proxy answers only to localhost:{0}, 127.0.0.1:{0} and [::1]:{0}", self.port),
            ));
        }
        let foreign = || {
            ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "origin_not_allowed",
                "requests from another origin are refused: use the console this proxy serves, or a client that is not a web page",
            )
        };
        if let Some(origin) = headers.get(header::ORIGIN) {
            let own = origin.to_str().ok().and_then(|o| o.strip_prefix("http://")).is_some_and(|a| self.allows(a));
            if !own {
                return Err(foreign());
            }
        }
        let public = (method == Method::GET || method == Method::HEAD) && PUBLIC.contains(&path);
        let site = headers.get("sec-fetch-site").map(HeaderValue::as_bytes);
        if !public && matches!(site, Some(b"cross-site" | b"same-site")) {
            return Err(foreign());
        }
        Ok(())
    }
}

/// An error the proxy answers itself.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, code, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "message": self.message, "type": self.kind, "param": null, "code": self.code } });
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(headers: &[(&str, &str)], method: Method, path: &str) -> Result<(), &'static str> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        LocalNames::new(8090).check(&method, path, &h, None).map_err(|e| e.code)
    }

    #[test]
    fn only_this_port_s_loopback_names_and_origins() {
        for host in ["localhost:8090", "LOCALHOST:8090", "127.0.0.1:8090", "[::1]:8090"] {
            assert_eq!(check(&[("host", host)], Method::GET, "/v1/models"), Ok(()), "{host}");
        }
        for host in ["evil.example:8090", "localhost", "127.0.0.1:8091", "10.0.0.1:8090", "localhost:8090.evil"] {
            assert_eq!(check(&[("host", host)], Method::GET, "/v1/models"), Err("host_not_allowed"), "{host}");
        }
        assert_eq!(check(&[], Method::GET, "/v1/models"), Err("host_not_allowed"), "no Host");
        let host = ("host", "127.0.0.1:8090");
        assert_eq!(check(&[host, ("origin", "http://127.0.0.1:8090")], Method::POST, "/v1/chat/completions"), Ok(()));
        for origin in ["null", "http://evil.example", "https://127.0.0.1:8090", "http://127.0.0.1:8091"] {
            let got = check(&[host, ("origin", origin)], Method::POST, "/v1/chat/completions");
            assert_eq!(got, Err("origin_not_allowed"), "{origin}");
        }
        let cross = ("sec-fetch-site", "cross-site");
        assert_eq!(check(&[host, cross], Method::POST, "/v1/embeddings"), Err("origin_not_allowed"));
        assert_eq!(check(&[host, cross], Method::GET, "/console/console.js"), Ok(()));
    }
}
