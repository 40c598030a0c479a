//! Crash safety: a writer process is killed with SIGKILL in the middle of ingesting, several
//! times over the same store. After each kill the store must hold every document the writer
//! acknowledged, each one complete (of one version, all of its chunks), and nothing partial.
//!
//! The writer is this test binary itself, re-run with `GELO_STORE_CRASH_WRITER` set: the test
//! `writer_process` does nothing in a normal run and becomes the writer in the child.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use store::{Chunk, Document, EncryptedRedbStore, SealingKey, VectorStore};

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
