//! Who may use the HTTP port, checked before any route runs, in this order:
//!
//! 1. `Host` (or HTTP/2 `:authority`) must be one of this gateway's names: `localhost`,
//!    `127.0.0.1` and `[::1]` with the listening port, the listening address itself, and the
//!    names given with `--http-allowed-hosts` (any port, or the one named). A page whose
//!    DNS name was rebound to this address sends its own name: 421 `host_not_allowed`.
//! 2. A request that carries `Origin` must come from one of those names (scheme `http` or
//!    `https`); `Origin: null` and any other origin get 403 `origin_not_allowed`, and so does
//!    an API request a browser marks `Sec-Fetch-Site: cross-site` or `same-site`. No CORS
//!    header is ever sent, so a browser lets no other origin read an answer either.
//! 3. Every route but the public ones (`GET /`, the console's script and style, and
//!    `GET /openapi.json`: nothing in them comes from the store) needs `Authorization:
//!    Bearer KEY` with a key of the keys file ([`keys`](super::keys)): 401
//!    `invalid_api_key` with `WWW-Authenticate: Bearer` otherwise.
//! 4. Each key has its own token bucket ([`ratelimit`](super::ratelimit)): 429
//!    `rate_limit_exceeded` with `Retry-After`.
//!
//! A key is a header the browser never adds by itself (no cookie), so a page of another
//! origin cannot borrow the user's session: it would have to know the key.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Instant,
};

use axum::{
    extract::{Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use server::Metrics;
use tonic::Code;

use super::{
    ApiError,
    keys::{KeyStore, Refusal},
    ratelimit::RateLimit,
};
use crate::{GatewayError, Result};

/// Routes anyone who passes the `Host` and `Origin` checks may read.
const PUBLIC: &[&str] = &["/", "/console/console.js", "/console/console.css", "/openapi.json"];
const METRICS_METHOD: &str = "http.Access";
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// The HTTP port's access settings, as configured (`--api-keys-file`, `--http-unauthenticated`,
/// `--http-allowed-hosts`, `--http-rate-limit`, `--http-rate-burst`).
#[derive(Clone, Debug, PartialEq)]
pub struct AccessConfig {
    /// The file of the accepted keys' SHA-256 digests; re-read when it changes.
    pub api_keys_file: Option<PathBuf>,
    /// Serve the API without keys: anyone who reaches the port may read and add documents.
    pub unauthenticated: bool,
    /// More `Host` names (`name` for any port, `name:port` for one).
    pub allowed_hosts: Vec<String>,
    /// Requests per second per key, on average.
    pub rate_per_second: f64,
    /// Requests a key may send at once.
    pub burst: u32,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            api_keys_file: None,
            unauthenticated: false,
            allowed_hosts: vec![],
            rate_per_second: 50.0,
            burst: 100,
        }
    }
}

impl AccessConfig {
    /// Refuses a configuration that gives no keys file without saying `--http-unauthenticated`
    /// (or says both), or a rate that is not positive.
    pub fn validate(&self) -> Result<()> {
        if !(self.rate_per_second.is_finite() && self.rate_per_second > 0.0) || self.burst == 0 {
            return Err(GatewayError::Config(
                "--http-rate-limit must be a positive number and --http-rate-burst at least 1".into(),
            ));
        }
        match (&self.api_keys_file, self.unauthenticated) {
            (Some(_), false) | (None, true) => Ok(()),
            (Some(_), true) => {
                Err(GatewayError::Config("--api-keys-file and --http-unauthenticated: give one, not both".into()))
            }
            (None, false) => Err(GatewayError::Config(
                "the HTTP API needs --api-keys-file FILE (clients send `Authorization: Bearer KEY`; \
                 `gelo api-key new --keys-file FILE` makes a key), or --http-unauthenticated to serve it without keys"
                    .into(),
            )),
        }
    }
}

/// A name the port answers to: `port` `None` for any port.
#[derive(Clone, Debug, PartialEq)]
struct HostRule {
    name: String,
    port: Option<u16>,
}

/// `host[:port]` of a `Host` value or an origin: the name lowercased (an IPv6 address keeps
/// its brackets), the port if one is written. `None` for anything else.
fn split_authority(s: &str) -> Option<(String, Option<u16>)> {
    let (name, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let rest = &s[end + 1..];
        let port = if rest.is_empty() { None } else { Some(rest.strip_prefix(':')?) };
        (&s[..=end], port)
    } else {
        match s.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
        None => None,
    };
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b);
    if name.is_empty() || !name.bytes().all(ok) {
        return None;
    }
    Some((name.to_ascii_lowercase(), port))
}

fn literal(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

struct Hosts(Vec<HostRule>);

impl Hosts {
    fn new(extra: &[String], local: SocketAddr) -> Result<Hosts> {
        let port = Some(local.port());
        let mut rules: Vec<HostRule> =
            ["localhost", "127.0.0.1", "[::1]"].iter().map(|n| HostRule { name: (*n).to_string(), port }).collect();
        if !local.ip().is_loopback() && !local.ip().is_unspecified() {
            rules.push(HostRule { name: literal(local.ip()), port });
        }
        for h in extra.iter().map(|h| h.trim()).filter(|h| !h.is_empty()) {
            let (name, port) = split_authority(h).ok_or_else(|| {
                GatewayError::Config(format!("--http-allowed-hosts: `{h}` is not a host name or `name:port`"))
            })?;
            rules.push(HostRule { name, port });
        }
        Ok(Hosts(rules))
    }

    /// Whether `authority` (`default_port` when it names none) is one of these names.
    fn allows(&self, authority: &str, default_port: u16) -> bool {
        let Some((name, port)) = split_authority(authority) else { return false };
        let port = port.unwrap_or(default_port);
        self.0.iter().any(|r| r.name == name && r.port.is_none_or(|p| p == port))
    }

    /// Whether `origin` (`scheme://host[:port]`) is this gateway's own.
    fn allows_origin(&self, origin: &str) -> bool {
        let (authority, port) = if let Some(a) = origin.strip_prefix("http://") {
            (a, 80)
        } else if let Some(a) = origin.strip_prefix("https://") {
            (a, 443)
        } else {
            return false;
        };
        !authority.contains('/') && self.allows(authority, port)
    }
}

/// Whether requests need a key, and the keys.
enum Auth {
    Keys(KeyStore),
    /// `--http-unauthenticated`: chosen by name, never a default.
    Unauthenticated,
}

/// The checks of one HTTP port, made once its listening address is known.
pub struct Access {
    hosts: Hosts,
    auth: Auth,
    limit: RateLimit,
    /// The RA-TLS port ([`Access::attested`]): any `Host`, no `Origin`.
    attested: bool,
}

impl Access {
    /// The checks for a port listening on `local`: [`AccessConfig::validate`], then the keys
    /// file, which must exist and be valid now.
    pub fn new(cfg: &AccessConfig, local: SocketAddr) -> Result<Access> {
        cfg.validate()?;
        let auth = match &cfg.api_keys_file {
            Some(path) => {
                Auth::Keys(KeyStore::open(path).map_err(|e| GatewayError::Config(format!("--api-keys-file: {e}")))?)
            }
            None => {
                tracing::warn!(
                    "UNAUTHENTICATED HTTP API: anything that reaches {local} may read answers from the store and add documents"
                );
                Auth::Unauthenticated
            }
        };
        let hosts = Hosts::new(&cfg.allowed_hosts, local)?;
        Ok(Access { hosts, auth, limit: RateLimit::new(cfg.rate_per_second, cfg.burst), attested: false })
    }

    /// The checks for the HTTP API on the gateway's RA-TLS port ([`super::attested`]): the
    /// same keys and rate, any `Host` name, and no request that carries an `Origin`. A
    /// browser completes no handshake with an RA-TLS certificate (it chains to no web
    /// root), so no page, DNS-rebound or not, reaches this port, and the name a client
    /// dialled proves nothing; a client that serves browsers (`gelo proxy`) checks their
    /// `Host` and `Origin` on its own port and does not forward the `Origin`.
    pub fn attested(cfg: &AccessConfig, local: SocketAddr) -> Result<Access> {
        Ok(Access { attested: true, ..Access::new(cfg, local)? })
    }

    /// The checks of this module's header, in order; the refusal as the client sees it.
    fn check(&self, method: &Method, path: &str, headers: &HeaderMap, authority: Option<&str>) -> Result<(), Denied> {
        // HTTP/1.1 names the host in `Host`; HTTP/2 and an absolute request target in the
        // URI. Every name the request gives must be one of ours.
        let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or("?")).or(authority);
        for name in [host, authority].into_iter().flatten().filter(|_| !self.attested) {
            if !self.hosts.allows(name, 80) {
                return Err(Denied::Host(Some(name.to_string())));
            }
        }
        if host.is_none() && !self.attested {
            return Err(Denied::Host(None));
        }
        if let Some(origin) = headers.get(header::ORIGIN)
            && (self.attested || !origin.to_str().is_ok_and(|o| self.hosts.allows_origin(o)))
        {
            return Err(Denied::Origin);
        }
        let public = (method == Method::GET || method == Method::HEAD) && PUBLIC.contains(&path);
        if public {
            return Ok(());
        }
        let site = headers.get(SEC_FETCH_SITE).map(HeaderValue::as_bytes);
        if matches!(site, Some(b"cross-site" | b"same-site")) {
            return Err(Denied::Origin);
        }
        match &self.auth {
            Auth::Unauthenticated => Ok(()),
            Auth::Keys(keys) => {
                let entry =
                    keys.check(headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes)).map_err(Denied::Key)?;
                self.limit.take(&entry.digest, Instant::now()).map_err(|wait| Denied::Rate(entry.label(), wait))
            }
        }
    }
}

/// Why a request was turned away.
enum Denied {
    Host(Option<String>),
    Origin,
    Key(Refusal),
    Rate(String, std::time::Duration),
}

impl Denied {
    fn reason(&self) -> &'static str {
        match self {
            Denied::Host(_) => "host_not_allowed",
            Denied::Origin => "origin_not_allowed",
            Denied::Key(r) => r.as_str(),
            Denied::Rate(..) => "rate_limit_exceeded",
        }
    }

    fn into_error(self) -> ApiError {
        match self {
            Denied::Host(_) => ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "invalid_request_error",
                "host_not_allowed",
                "this gateway does not answer to that Host name; if it is yours, add it with --http-allowed-hosts",
            ),
            Denied::Origin => ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "origin_not_allowed",
                "requests from another origin are refused: use the console this gateway serves, or a client that is not a web page",
            ),
            Denied::Key(r) => {
                let (message, challenge) = match r {
                    Refusal::Missing => (
                        "Missing API key: send `Authorization: Bearer KEY` (OPENAI_API_KEY for the openai clients)",
                        "Bearer realm=\"gelo\"",
                    ),
                    Refusal::Malformed => (
                        "Malformed Authorization header: send `Authorization: Bearer KEY`",
                        "Bearer realm=\"gelo\", error=\"invalid_request\"",
                    ),
                    Refusal::Unknown | Refusal::FileUnusable => {
                        ("Incorrect API key provided", "Bearer realm=\"gelo\", error=\"invalid_token\"")
                    }
                };
                ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid_api_key", message)
                    .header(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge))
            }
            Denied::Rate(_, wait) => {
                let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "rate_limit_exceeded",
                    format!("Rate limit reached for this API key: retry in {seconds} s"),
                )
                .header(header::RETRY_AFTER, HeaderValue::from(seconds))
            }
        }
    }
}

/// The state of the [`guard`] middleware.
pub(crate) struct Guard {
    pub(crate) access: Access,
    pub(crate) metrics: Metrics,
}

/// Runs [`Access::check`] on every request before its route; logs and counts refusals
/// (reason, method, a key's label; never a key, a digest or a body).
pub(crate) async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let t = Instant::now();
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    match g.access.check(req.method(), req.uri().path(), req.headers(), authority.as_deref()) {
        Ok(()) => next.run(req).await,
        Err(denied) => {
            let reason = denied.reason();
            match &denied {
                Denied::Host(host) => {
                    let host: Option<String> = host.as_deref().map(|h| h.chars().take(80).collect());
                    tracing::warn!(reason, method = %req.method(), host = ?host, "HTTP request refused");
                }
                Denied::Rate(key, _) => {
                    tracing::info!(reason, method = %req.method(), key = %key, "HTTP request refused")
                }
                _ => tracing::warn!(reason, method = %req.method(), "HTTP request refused"),
            }
            let code = match denied {
                Denied::Key(_) => Code::Unauthenticated,
                Denied::Rate(..) => Code::ResourceExhausted,
                _ => Code::PermissionDenied,
            };
            g.metrics.observe(METRICS_METHOD, code, t.elapsed().as_secs_f64());
            denied.into_error().into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(extra: &[&str]) -> Hosts {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_string()).collect();
        Hosts::new(&extra, "127.0.0.1:8080".parse().unwrap()).unwrap()
    }

    #[test]
    fn host_names_are_the_loopback_names_on_the_port_and_the_configured_ones() {
        let h = hosts(&["gelo.internal", "Proxy.Example:443"]);
        for ok in
            ["localhost:8080", "LOCALHOST:8080", "127.0.0.1:8080", "[::1]:8080", "gelo.internal", "gelo.internal:9"]
        {
            assert!(h.allows(ok, 80), "{ok}");
        }
        assert!(h.allows("proxy.example", 443));
        for bad in [
            "evil.example:8080",
            "localhost",
            "localhost:8081",
            "localhost.:8080",
            "127.0.0.2:8080",
            "[::2]:8080",
            "proxy.example:80",
            "localhost:8080:1",
            "localhost:",
            "local host:8080",
            "",
            "[::1",
            "[::1]x",
            "localhost:99999",
        ] {
            assert!(!h.allows(bad, 80), "{bad}");
        }
        assert!(Hosts::new(&["bad/name".into()], "127.0.0.1:1".parse().unwrap()).is_err());
        // A specific non-loopback listening address answers to its own literal.
        let remote = Hosts::new(&[], "10.1.2.3:8080".parse().unwrap()).unwrap();
        assert!(remote.allows("10.1.2.3:8080", 80) && !remote.allows("10.1.2.4:8080", 80));
    }

    #[test]
    fn origins_are_the_gateway_s_own_names_only() {
        let h = hosts(&["gelo.internal:443"]);
        for ok in ["http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080", "https://gelo.internal"] {
            assert!(h.allows_origin(ok), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.example:8080",
            "http://127.0.0.1:8081",
            "http://localhost",
            "http://gelo.internal",
            "file://",
            "ftp://localhost:8080",
            "http://localhost:8080/path",
            "http://user@localhost:8080",
        ] {
            assert!(!h.allows_origin(bad), "{bad}");
        }
    }

    #[test]
    fn the_attested_port_answers_any_host_and_no_origin() {
        let local = "0.0.0.0:50051".parse().unwrap();
        let open = AccessConfig { unauthenticated: true, ..AccessConfig::default() };
        let (attested, plain) = (Access::attested(&open, local).unwrap(), Access::new(&open, local).unwrap());
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gateway.example:50051"));
        let check = |a: &Access, h: &HeaderMap, authority| a.check(&Method::GET, "/v1/models", h, authority);
        assert!(check(&attested, &h, Some("gateway.example:50051")).is_ok());
        assert!(check(&attested, &HeaderMap::new(), None).is_ok(), "HTTP/2 without an authority");
        assert!(matches!(check(&plain, &h, None), Err(Denied::Host(_))), "the plain port still checks names");
        // Its own loopback name as the origin, even: no page reaches this port.
        h.insert(header::ORIGIN, HeaderValue::from_static("http://localhost:50051"));
        assert!(matches!(check(&attested, &h, None), Err(Denied::Origin)));
        assert!(matches!(attested.check(&Method::GET, "/", &h, None), Err(Denied::Origin)));
    }

    #[test]
    fn a_configuration_must_say_how_requests_are_authenticated() {
        let local = "127.0.0.1:8080".parse().unwrap();
        let err = |cfg: AccessConfig| Access::new(&cfg, local).err().expect("refused").to_string();
        assert!(err(AccessConfig::default()).contains("--api-keys-file"));
        let both = AccessConfig { api_keys_file: Some("k".into()), unauthenticated: true, ..AccessConfig::default() };
        assert!(err(both).contains("not both"));
        let missing = AccessConfig { api_keys_file: Some("/nonexistent/keys".into()), ..AccessConfig::default() };
        assert!(err(missing).contains("/nonexistent/keys"));
        let zero = AccessConfig { unauthenticated: true, rate_per_second: 0.0, ..AccessConfig::default() };
        assert!(err(zero).contains("--http-rate-limit"));
        let open = AccessConfig { unauthenticated: true, ..AccessConfig::default() };
        assert!(Access::new(&open, local).is_ok());
    }
}
