//! API keys of the HTTP port: how a key is made, the file of their SHA-256 digests the
//! gateway reads (and reads again when it changes), and the check of a presented key.
//!
//! A key is `gelo-` and 43 base64url characters: 256 random bits from the OS. That much
//! entropy makes its plain SHA-256 as hard to invert as the key is to guess, so the file
//! holds no secret and needs no salt or slow hash; it must only be kept from writers (whoever
//! writes it adds keys). One key per line, `sha256:<64 hex> [name]`, `#` starts a comment:
//!
//! ```text
//! # GELO API keys (SHA-256 digests): `gelo api-key new|list|revoke --keys-file FILE`
//! sha256:5b0e…c1 laptop
//! ```
//!
//! A key is named in logs by its id, the first 8 hex digits of its digest (32 of its 256
//! bits, nothing that helps to find the key), or by the name its line gives.

use std::{
    fmt,
    io::{Read, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// What every key starts with, so a leaked one is recognisable (secret scanners, logs).
pub const KEY_PREFIX: &str = "gelo-";
/// The header line of a keys file the gateway or `gelo` creates.
pub const FILE_HEADER: &str = "# GELO API keys (SHA-256 digests): `gelo api-key new|list|revoke --keys-file FILE`\n";
/// How often at most the keys file is read again: a revoked key stops working within this.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// Longer presented keys are refused before hashing (a key is 48 characters).
const MAX_PRESENTED: usize = 256;
/// A keys file is small: a larger one is refused rather than read.
const MAX_FILE: u64 = 1 << 20;
const MAX_NAME: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: larger than {MAX_FILE} bytes, not a keys file")]
    TooLarge { path: PathBuf },
    /// The line is left out of the message: it may be the key itself.
    #[error(
        "{path} line {line}: a plaintext API key; the file holds only digests (`gelo api-key new` writes them), \
         so remove the line and consider that key exposed"
    )]
    Plaintext { path: PathBuf, line: usize },
    #[error(
        "{path} line {line}: expected `sha256:<64 hex digits> [name]` (a name: up to {MAX_NAME} of A-Z a-z 0-9 . _ - @ +)"
    )]
    Syntax { path: PathBuf, line: usize },
    #[error("{path} line {line}: the same key as line {first}")]
    Duplicate { path: PathBuf, line: usize, first: usize },
    #[error("{path}: no key with id or name `{id}`")]
    NoSuchKey { path: PathBuf, id: String },
    #[error("key name `{0}`: up to {MAX_NAME} of A-Z a-z 0-9 . _ - @ +")]
    InvalidName(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeysError + '_ {
    move |source| KeysError::Io { path: path.to_path_buf(), source }
}

/// A plaintext key. Shown once, to whoever made it; its `Debug` shows only its id.
pub struct ApiKey(String);

impl ApiKey {
    /// A fresh key from the OS's random source.
    pub fn generate() -> ApiKey {
        let secret = attest::random_nonce();
        ApiKey(format!("{KEY_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn digest(&self) -> KeyDigest {
        KeyDigest::of(&self.0)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({})", self.digest().id())
    }
}

/// The SHA-256 of a key, as the keys file holds it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyDigest([u8; 32]);

impl KeyDigest {
    pub fn of(key: &str) -> KeyDigest {
        KeyDigest(Sha256::digest(key.as_bytes()).into())
    }

    /// The short id logs and `gelo api-key list` show.
    pub fn id(&self) -> String {
        hex::encode(&self.0[..4])
    }

    /// The keys file's line for this digest.
    pub fn line(&self, name: Option<&str>) -> String {
        match name {
            Some(n) => format!("sha256:{} {n}", hex::encode(self.0)),
            None => format!("sha256:{}", hex::encode(self.0)),
        }
    }

    fn ct_eq(&self, other: &KeyDigest) -> bool {
        self.0[..].ct_eq(&other.0[..]).into()
    }
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyDigest({})", self.id())
    }
}

/// Whether `name` may name a key: it goes into log lines, so no spaces or control
/// characters, and it must not look like a key.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-@+".contains(&b))
        && !looks_like_a_key(name)
}

/// A word that may be a key pasted where a digest belongs (a key is 48 characters).
fn looks_like_a_key(word: &str) -> bool {
    word.starts_with(KEY_PREFIX) && word.len() >= 40
}

/// One line of the keys file.
#[derive(Clone, Debug)]
pub struct KeyEntry {
    pub digest: KeyDigest,
    pub name: Option<String>,
}

impl KeyEntry {
    /// How logs name the key: its name, else its id.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.digest.id())
    }
}

/// The keys of a file's text; `path` only names it in errors.
pub fn parse(text: &str, path: &Path) -> Result<Vec<KeyEntry>, KeysError> {
    let mut entries: Vec<(usize, KeyEntry)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let (line, path) = (i + 1, path.to_path_buf());
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if l.split_whitespace().any(looks_like_a_key) {
            return Err(KeysError::Plaintext { path, line });
        }
        let mut words = l.split_whitespace();
        let digest = words.next().and_then(|w| w.strip_prefix("sha256:")).and_then(|h| {
            let mut d = [0u8; 32];
            hex::decode_to_slice(h, &mut d).ok().map(|()| KeyDigest(d))
        });
        let name = words.next();
        let (Some(digest), None) = (digest, words.next()) else { return Err(KeysError::Syntax { path, line }) };
        if name.is_some_and(|n| !valid_name(n)) {
            return Err(KeysError::Syntax { path, line });
        }
        if let Some((first, _)) = entries.iter().find(|(_, e)| e.digest == digest) {
            return Err(KeysError::Duplicate { path, line, first: *first });
        }
        entries.push((line, KeyEntry { digest, name: name.map(str::to_string) }));
    }
    Ok(entries.into_iter().map(|(_, e)| e).collect())
}

/// The file's text, refused when it is too large to be a keys file.
fn read_text(path: &Path) -> Result<String, KeysError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut text = String::new();
    Read::by_ref(&mut f).take(MAX_FILE + 1).read_to_string(&mut text).map_err(io(path))?;
    if text.len() as u64 > MAX_FILE {
        return Err(KeysError::TooLarge { path: path.to_path_buf() });
    }
    Ok(text)
}

/// The keys of the file at `path`.
pub fn read(path: &Path) -> Result<Vec<KeyEntry>, KeysError> {
    parse(&read_text(path)?, path)
}

/// Adds `digest` (named `name`) to the keys file at `path`, creating it readable and
/// writable by its owner only.
pub fn append(path: &Path, digest: &KeyDigest, name: Option<&str>) -> Result<(), KeysError> {
    if let Some(n) = name.filter(|n| !valid_name(n)) {
        return Err(KeysError::InvalidName(n.to_string()));
    }
    let existing = match std::fs::metadata(path) {
        Ok(_) => Some(read(path)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(path)(e)),
    };
    let mut options = std::fs::OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(path).map_err(io(path))?;
    let mut text = String::new();
    if existing.is_none() {
        text.push_str(FILE_HEADER);
    }
    text.push_str(&digest.line(name));
    text.push('\n');
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(io(path))
}

/// Removes the keys whose id or name is `id` from the file at `path` (written whole to a
/// sibling and renamed over it, so a reader sees the old file or the new one); returns the
/// removed entries.
pub fn remove(path: &Path, id: &str) -> Result<Vec<KeyEntry>, KeysError> {
    let text = read_text(path)?;
    parse(&text, path)?;
    let matches = |e: &KeyEntry| e.digest.id() == id || e.name.as_deref() == Some(id);
    let mut kept = String::new();
    let mut removed = Vec::new();
    for line in text.lines() {
        match parse(line, path).ok().and_then(|mut v| v.pop()) {
            Some(e) if matches(&e) => removed.push(e),
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    if removed.is_empty() {
        return Err(KeysError::NoSuchKey { path: path.to_path_buf(), id: id.to_string() });
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options
        .open(&tmp)
        .and_then(|mut f| f.write_all(kept.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io(path))?;
    Ok(removed)
}

/// Why a presented key was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A header, but not one that can carry a key.
    Malformed,
    /// A well-formed key that is not in the file.
    Unknown,
    /// The keys file could not be read or parsed at its last change: every key is refused
    /// until it is fixed (a revocation must never be undone by a bad edit).
    FileUnusable,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing_key",
            Refusal::Malformed => "malformed_authorization",
            Refusal::Unknown => "unknown_key",
            Refusal::FileUnusable => "keys_file_unusable",
        }
    }
}

/// The keys in force: the file's, read again when its content changes (checked at most
/// every [`RELOAD_EVERY`], on a request's way in).
pub struct KeyStore {
    path: PathBuf,
    state: Mutex<Loaded>,
}

struct Loaded {
    /// `None` while the file is unusable: every key is refused.
    entries: Option<Arc<[KeyEntry]>>,
    /// The SHA-256 of the text the entries came from (or of the error that refused it).
    fingerprint: [u8; 32],
    checked: Instant,
}

impl KeyStore {
    /// Reads the file now: a missing or invalid file is an error at start.
    pub fn open(path: &Path) -> Result<KeyStore, KeysError> {
        let text = read_text(path)?;
        let entries = parse(&text, path)?;
        if entries.is_empty() {
            tracing::warn!(path = %path.display(), "the API keys file holds no key: every API request is refused");
        }
        warn_if_writable_by_others(path);
        let loaded = Loaded {
            entries: Some(entries.into()),
            fingerprint: Sha256::digest(&text).into(),
            checked: Instant::now(),
        };
        Ok(KeyStore { path: path.to_path_buf(), state: Mutex::new(loaded) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The keys in force now, after reading the file again if it is due.
    fn current(&self) -> Option<Arc<[KeyEntry]>> {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.checked.elapsed() >= RELOAD_EVERY {
            s.checked = Instant::now();
            self.reload(&mut s);
        }
        s.entries.clone()
    }

    /// A small file read at most once a second, under the lock: requests meanwhile wait for
    /// it rather than use keys that may have been revoked.
    fn reload(&self, s: &mut Loaded) {
        let text = read_text(&self.path);
        let fingerprint: [u8; 32] = match &text {
            Ok(t) => Sha256::digest(t).into(),
            Err(e) => Sha256::digest(e.to_string()).into(),
        };
        if fingerprint == s.fingerprint {
            return;
        }
        s.fingerprint = fingerprint;
        match text.and_then(|t| parse(&t, &self.path)) {
            Ok(entries) => {
                tracing::info!(path = %self.path.display(), keys = entries.len(), "API keys file changed: keys reloaded");
                s.entries = Some(entries.into());
            }
            Err(e) => {
                tracing::error!(error = %e, "API keys file unusable: every API request is refused until it is fixed");
                s.entries = None;
            }
        }
    }

    /// The entry of the key in `authorization` (the header's value, if any).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<KeyEntry, Refusal> {
        let key = bearer(authorization.ok_or(Refusal::Missing)?)?;
        let entries = self.current().ok_or(Refusal::FileUnusable)?;
        let presented = KeyDigest::of(key);
        // Every digest is compared, each in constant time: the time taken tells nothing of
        // how close a guess came.
        let mut found = None;
        for e in entries.iter() {
            if e.digest.ct_eq(&presented) {
                found = Some(e);
            }
        }
        found.cloned().ok_or(Refusal::Unknown)
    }
}

/// The key of an `Authorization: Bearer KEY` value (the scheme's case is free, RFC 7235).
fn bearer(value: &[u8]) -> Result<&str, Refusal> {
    let value = std::str::from_utf8(value).map_err(|_| Refusal::Malformed)?.trim();
    let (scheme, key) = value.split_once(' ').ok_or(Refusal::Malformed)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer")
        || key.is_empty()
        || key.len() > MAX_PRESENTED
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(Refusal::Malformed);
    }
    Ok(key)
}

fn warn_if_writable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path)
            && m.permissions().mode() & 0o022 != 0
        {
            tracing::warn!(
                path = %path.display(),
                "the API keys file is writable by other users, who could add keys: chmod 600 it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_256_random_bits_behind_the_prefix_and_its_debug_shows_only_the_id() {
        let (a, b) = (ApiKey::generate(), ApiKey::generate());
        assert_ne!(a.expose(), b.expose());
        let body = a.expose().strip_prefix(KEY_PREFIX).unwrap();
        assert_eq!(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(body).unwrap().len(), 32);
        let shown = format!("{a:?} {:?}", a.digest());
        assert!(!shown.contains(body) && !shown.contains(&hex::encode(a.digest().0)), "{shown}");
        assert!(shown.contains(&a.digest().id()), "{shown}");
    }

    #[test]
    fn the_digest_is_plain_sha256_of_the_key_text() {
        // printf %s gelo-test | sha256sum
        let d = KeyDigest::of("gelo-test");
        assert_eq!(hex::encode(d.0), hex::encode(Sha256::digest(b"gelo-test")));
        assert_eq!(d.line(Some("ci")), format!("sha256:{} ci", hex::encode(d.0)));
        assert_eq!(d.id().len(), 8);
    }

    #[test]
    fn parse_reads_digests_names_and_comments_and_refuses_the_rest_by_line() {
        let (a, b) = (KeyDigest::of("a"), KeyDigest::of("b"));
        let p = Path::new("keys");
        let text = format!("{FILE_HEADER}\n{}\n  {}  \n", a.line(Some("laptop")), b.line(None));
        let e = parse(&text, p).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].digest, e[0].name.as_deref(), e[0].label()), (a, Some("laptop"), "laptop".into()));
        assert_eq!((e[1].digest, e[1].name.as_deref(), e[1].label()), (b, None, b.id()));

        let bad = |text: &str| parse(text, p).unwrap_err();
        assert!(matches!(bad("sha256:abcd\n"), KeysError::Syntax { line: 1, .. }));
        assert!(matches!(bad(&format!("# c\n{} two words", a.line(None))), KeysError::Syntax { line: 2, .. }));
        assert!(matches!(bad(&format!("{} bad\tname!", a.line(None))), KeysError::Syntax { .. }));
        assert!(matches!(bad(&format!("md5:{}", hex::encode([0u8; 32]))), KeysError::Syntax { .. }));
        let dup = format!("{}\n{}\n", a.line(None), a.line(Some("again")));
        assert!(matches!(bad(&dup), KeysError::Duplicate { line: 2, first: 1, .. }));
        // A key pasted by mistake: refused, and its text is not in the message.
        let key = ApiKey::generate();
        let e = bad(&format!("{}\n{}\n", a.line(None), key.expose()));
        assert!(matches!(e, KeysError::Plaintext { line: 2, .. }));
        assert!(!e.to_string().contains(key.expose()), "{e}");
    }

    #[test]
    fn append_creates_an_owner_only_file_and_remove_rewrites_it_without_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let (a, b) = (ApiKey::generate(), ApiKey::generate());
        append(&path, &a.digest(), Some("first")).unwrap();
        append(&path, &b.digest(), None).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(FILE_HEADER) && !text.contains(a.expose()), "{text}");
        assert_eq!(read(&path).unwrap().len(), 2);
        assert!(matches!(append(&path, &a.digest(), Some("bad name")), Err(KeysError::InvalidName(_))));

        let removed = remove(&path, "first").unwrap();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].digest, a.digest());
        let left = read(&path).unwrap();
        assert_eq!((left.len(), left[0].digest), (1, b.digest()));
        assert!(std::fs::read_to_string(&path).unwrap().starts_with(FILE_HEADER), "comments are kept");
        assert!(matches!(remove(&path, "first"), Err(KeysError::NoSuchKey { .. })));
        remove(&path, &b.digest().id()).unwrap();
        assert!(read(&path).unwrap().is_empty());
    }

    #[test]
    fn the_store_accepts_listed_keys_only_and_tells_why_it_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let key = ApiKey::generate();
        append(&path, &key.digest(), Some("ci")).unwrap();
        let store = KeyStore::open(&path).unwrap();
        let header = |v: &str| store.check(Some(v.as_bytes()));
        assert_eq!(header(&format!("Bearer {}", key.expose())).unwrap().label(), "ci");
        assert_eq!(header(&format!("bearer   {}  ", key.expose())).unwrap().digest, key.digest());
        assert_eq!(store.check(None).unwrap_err(), Refusal::Missing);
        assert_eq!(header(&format!("Basic {}", key.expose())).unwrap_err(), Refusal::Malformed);
        assert_eq!(header("Bearer").unwrap_err(), Refusal::Malformed);
        assert_eq!(header(&format!("Bearer {}", "x".repeat(MAX_PRESENTED + 1))).unwrap_err(), Refusal::Malformed);
        assert_eq!(store.check(Some(b"Bearer \xff\xfe")).unwrap_err(), Refusal::Malformed);
        assert_eq!(header(&format!("Bearer {}x", key.expose())).unwrap_err(), Refusal::Unknown);
        assert_eq!(header(&format!("Bearer {}", ApiKey::generate().expose())).unwrap_err(), Refusal::Unknown);
    }

    #[test]
    fn a_missing_or_invalid_file_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(KeyStore::open(&dir.path().join("none")), Err(KeysError::Io { .. })));
        let path = dir.path().join("keys");
        std::fs::write(&path, "not a digest\n").unwrap();
        assert!(matches!(KeyStore::open(&path), Err(KeysError::Syntax { line: 1, .. })));
    }
}
