//! Crash safety: a writer process is killed with SIGKILL in the middle of ingesting, several
//! times over the same store. After each kill the store must hold every document the writer
//! acknowledged, each one complete (of one version, all of its chunks), and nothing partial.
//!
//! The writer is this test binary itself, re-run with `GELO_STORE_CRASH_WRITER` set: the test
//! `writer_process` does nothing in a normal run and becomes the writer in the child.
//!
//! And a full disk: a writer on a 2 MiB tmpfs (or, where nothing can be mounted, under a
//! 2 MiB file-size limit) is refused with `DiskFull`, and loses nothing it acknowledged.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use store::{Chunk, Document, EncryptedRedbStore, SealingKey, StoreError, VectorStore};

const DIM: usize = 24;
const IDS: u64 = 40;
const ENV: &str = "GELO_STORE_CRASH_WRITER";

fn key() -> SealingKey {
    SealingKey::from_bytes([0x33; 32])
}

/// Sequence number `seq` writes version `seq` of document `seq % IDS`; its chunk count and
/// contents follow from `seq`, so a reader can tell a complete version from a torn one.
fn version(seq: u64) -> Document {
    let chunks = 1 + (seq * 7 % 13) as usize;
    Document {
        id: format!("doc-{}", seq % IDS),
        title: format!("v{seq}"),
        metadata: BTreeMap::from([("chunks".to_string(), chunks.to_string())]),
        chunks: (0..chunks)
            .map(|c| Chunk {
                text: format!("v{seq} chunk {c} {}", "lorem ipsum ".repeat(30)),
                embedding: (0..DIM).map(|j| 1.0 + ((seq as usize * 31 + c * 7 + j) % 17) as f32).collect(),
            })
            .collect(),
    }
}

/// The child: ingest forever (until killed), printing each sequence number once its commit
/// has returned. Small batches so that commits are frequent and a kill lands in all phases.
#[test]
fn writer_process() {
    let Ok(spec) = std::env::var(ENV) else { return };
    let (path, start) = spec.split_once('|').expect("path|start");
    let start: u64 = start.parse().unwrap();
    let store = EncryptedRedbStore::open(path, &key(), DIM).unwrap();
    let mut seq = start;
    loop {
        let batch: Vec<Document> = (seq..seq + 3).map(version).collect();
        store.upsert(&batch).unwrap();
        for s in seq..seq + 3 {
            println!("acked {s}");
        }
        seq += 3;
    }
}

/// Runs the writer until it has acknowledged `acks` sequence numbers, lets it run on for
/// `grace` (so that the kill lands at an arbitrary point of a batch: sealing, inserting,
/// committing, printing), then kills it. Returns every sequence number it acknowledged.
fn run_and_kill(path: &Path, start: u64, acks: usize, grace: Duration) -> Vec<u64> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer_process", "--nocapture", "--test-threads=1"])
        .env(ENV, format!("{}|{start}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    // Drain stdout on a thread, so the writer never blocks on a full pipe during the grace.
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(s) = line.strip_prefix("acked ") {
                let _ = tx.send(s.parse::<u64>().unwrap());
            }
        }
    });
    let mut acked = Vec::new();
    while acked.len() < acks {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(seq) => acked.push(seq),
            Err(_) => panic!("the writer stopped after {} acks", acked.len()),
        }
    }
    std::thread::sleep(grace);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    acked.extend(rx.try_iter());
    acked
}

/// Every stored document must be exactly one whole version, no older than its last ack.
fn check(store: &EncryptedRedbStore, last_acked: &BTreeMap<String, u64>) -> u64 {
    let mut present = 0;
    let mut max_seq = 0;
    for i in 0..IDS {
        let id = format!("doc-{i}");
        let Some(doc) = store.get(&id).unwrap() else {
            assert!(!last_acked.contains_key(&id), "{id} was acknowledged but is missing");
            continue;
        };
        present += 1;
        let seq: u64 = doc.title.strip_prefix('v').unwrap().parse().unwrap();
        assert_eq!(seq % IDS, i, "{id} holds another document's version");
        if let Some(&acked) = last_acked.get(&id) {
            assert!(seq >= acked, "{id} rolled back from v{acked} to v{seq}");
        }
        let want = version(seq);
        assert_eq!(doc.metadata, want.metadata);
        assert_eq!(doc.chunks.len(), want.chunks.len(), "{id} v{seq} is partial");
        for (got, want) in doc.chunks.iter().zip(&want.chunks) {
            assert_eq!(got.text, want.text, "{id} v{seq} mixes versions");
        }
        // Search sees the same version: its own first chunk comes back first, with its text.
        let hit = &store.search(&want.chunks[0].embedding, 1).unwrap()[0];
        assert!((hit.score - 1.0).abs() < 1e-5);
        max_seq = max_seq.max(seq);
    }
    let stats = store.stats().unwrap();
    assert_eq!(stats.documents, present, "documents outside the expected ids");
    let chunks: u64 =
        (0..IDS).filter_map(|i| store.get(&format!("doc-{i}")).unwrap()).map(|d| d.chunks.len() as u64).sum();
    assert_eq!(stats.chunks, chunks, "the index holds chunks no document owns");
    max_seq
}

#[test]
fn killed_writer_leaves_acknowledged_documents_complete() {
    if std::env::var(ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let mut last_acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut next = 0;
    // Several rounds, later ones replacing documents written by earlier ones. The grace
    // before each kill spreads over a few batches' time, so kills land in every phase.
    for round in 0..12u64 {
        let acks = 10 + (round as usize * 7) % 23;
        let grace = Duration::from_micros(round * 397 % 2500);
        for seq in run_and_kill(&path, next, acks, grace) {
            let id = format!("doc-{}", seq % IDS);
            let slot = last_acked.entry(id).or_default();
            *slot = (*slot).max(seq);
        }
        let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
        let max_seq = check(&store, &last_acked);
        assert!(max_seq >= *last_acked.values().max().unwrap(), "round {round}");
        // The next writer continues after anything this one may have committed unacknowledged.
        next = max_seq + 1;
    }
}

/// Set in the child that fills a disk: `path|limit` (limit: 0 on a small tmpfs, else the
/// file-size limit in bytes the child sets on itself).
const FULL_ENV: &str = "GELO_STORE_DISK_FULL_WRITER";

/// The child: ingests until the disk is full, printing `acked SEQ` after each commit and
/// `refused KIND` for the write that did not fit; then tries once more (still refused, still
/// typed) and exits. A panic or a signal fails the parent's checks.
#[test]
fn disk_full_writer_process() {
    let Ok(spec) = std::env::var(FULL_ENV) else { return };
    let (path, limit) = spec.split_once('|').expect("path|limit");
    let limit: u64 = limit.parse().unwrap();
    if limit > 0 {
        // The fallback where no tmpfs can be mounted: the kernel refuses writes past this size
        // with EFBIG, as it refuses them with ENOSPC on a full file system. SIGXFSZ, which
        // would kill the writer instead, is ignored so the write returns the error.
        let rl = libc::rlimit { rlim_cur: limit, rlim_max: limit };
        // SAFETY: `signal` and `setrlimit` with valid arguments; they change this child process only.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rl), 0);
        }
    }
    let store = EncryptedRedbStore::open(path, &key(), DIM).unwrap();
    let mut seq = 0;
    let refusal = loop {
        assert!(seq < 1_000_000, "the disk never filled");
        let batch: Vec<Document> = (seq..seq + 3).map(fresh).collect();
        match store.upsert(&batch) {
            Ok(()) => {
                for s in seq..seq + 3 {
                    println!("acked {s}");
                }
                seq += 3;
            }
            Err(e) => break e,
        }
    };
    println!("refused {}", kind(&refusal));
    let again = store.upsert(&[fresh(seq)]).expect_err("a full disk takes no more writes");
    println!("refused {}", kind(&again));
}

/// A new document for each sequence number (ids never repeat, so the store only grows).
fn fresh(seq: u64) -> Document {
    Document { id: format!("full-{seq}"), ..version(seq) }
}

fn kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::DiskFull(_) => "disk_full",
        StoreError::Io(_) => "io",
        StoreError::Db(_) => "db",
        StoreError::Corrupt { .. } => "corrupt",
        _ => "other",
    }
}

/// Unmounts the small tmpfs when the test ends, however it ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A 2 MiB tmpfs, or `None` where mounting is refused (no root, no CAP_SYS_ADMIN).
fn small_tmpfs(at: &Path) -> Option<Mounted> {
    std::fs::create_dir_all(at).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "gelo-disk-full"])
        .arg(at)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| Mounted(at.to_path_buf()))
}

/// The disk fills up under a writer: the write that does not fit is refused with
/// `DiskFull` (no panic, no torn document), every document acknowledged before it is whole
/// when the store is reopened with room again, and the store then takes writes again.
#[test]
fn a_full_disk_refuses_the_write_and_loses_nothing_acknowledged() {
    if std::env::var(ENV).is_ok() || std::env::var(FULL_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    // GELO_STORE_TEST_NO_MOUNT takes the fallback even where mounting works.
    let mounted = if std::env::var_os("GELO_STORE_TEST_NO_MOUNT").is_some() { None } else { small_tmpfs(&small) };
    let path = small.join("full.redb");
    // Without a tmpfs: the same 2 MiB, as a file-size limit on the writer.
    let limit = if mounted.is_some() { 0 } else { 2 << 20 };
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "disk_full_writer_process", "--nocapture", "--test-threads=1"])
        .env(FULL_ENV, format!("{}|{limit}", path.display()))
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the writer failed (panic or signal): {:?}\n{stdout}", out.status);
    // The harness may print `test NAME ... ` in front of the child's first line.
    let acked: Vec<u64> = stdout.lines().filter_map(|l| l.split("acked ").nth(1)?.trim().parse().ok()).collect();
    let refusals: Vec<&str> = stdout.lines().filter_map(|l| l.split("refused ").nth(1)).collect();
    // The write that did not fit says why; after it redb may refuse every write until the
    // store is reopened (its `PreviousIo`), which is typed too.
    assert!(matches!(refusals[..], ["disk_full", "disk_full" | "db"]), "{stdout}");
    assert!(acked.len() >= 3, "the disk filled before the first commit: {stdout}");
    eprintln!(
        "disk full ({}): {} document versions acknowledged, then refused",
        if mounted.is_some() { "2 MiB tmpfs" } else { "2 MiB file-size limit" },
        acked.len()
    );

    // Room again (the tmpfs grown in place), then the same file: everything acknowledged is
    // there, whole, and nothing else.
    if let Some(m) = &mounted {
        let grown = Command::new("mount").args(["-o", "remount,size=64m"]).arg(&m.0).status().unwrap();
        assert!(grown.success());
    }
    let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
    let last = *acked.iter().max().unwrap();
    // Every acknowledged document whole; none of the refused batch (sequence numbers past
    // the last acknowledged one), in part or whole.
    let mut found = 0;
    for seq in 0..=last + 3 {
        let want = fresh(seq);
        match store.get(&want.id).unwrap() {
            Some(got) => {
                found += 1;
                assert!(seq <= last, "{} of the refused write was stored", want.id);
                let texts: Vec<&str> = got.chunks.iter().map(|c| c.text.as_str()).collect();
                let expected: Vec<&str> = want.chunks.iter().map(|c| c.text.as_str()).collect();
                assert_eq!(texts, expected, "{} is not whole", want.id);
            }
            None => assert!(!acked.contains(&seq), "acknowledged {} is missing", want.id),
        }
    }
    assert_eq!(found, acked.len(), "documents nobody acknowledged");
    assert_eq!(store.stats().unwrap().documents as usize, found, "the index and the records disagree");
    let max_seq = last + 4;
    store.upsert(&[fresh(max_seq)]).expect("writes succeed once there is room");
    assert_eq!(store.get(&fresh(max_seq).id).unwrap().unwrap().title, format!("v{max_seq}"));
}
