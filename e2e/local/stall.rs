//! An embedder stopped with SIGSTOP (alive, its connections open, answering nothing): the
//! call routed to it fails with DEADLINE_EXCEEDED naming it within the gateway's
//! `--backend-timeout`, it leaves the rotation, calls to the other replica never wait on it,
//! and once it runs again (SIGCONT) it verifies and serves again.

use std::time::{Duration, Instant};

use api::v1::SearchRequest;

use crate::stack::*;

/// The gateway's `--backend-timeout` here.
const TIMEOUT: Duration = Duration::from_secs(3);
/// What a call may take beyond it on a loaded machine before the test calls it blocked.
const SLACK: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_embedder_times_out_by_name_and_never_blocks_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let a = service("stall-embedder-a", "embedder", &minilm(), &[], &[]);
    let b = service("stall-embedder-b", "embedder", &minilm(), &[], &[]);
    let gw = gateway(
        "stall-gateway",
        &dir.path().join("data"),
        &[
            "--embedder",
            &format!("{},{}", a.target(), b.target()),
            "--embedder-identity",
            &hex_identity(&minilm()),
            "--backend-timeout",
            &TIMEOUT.as_secs().to_string(),
            "--verify-timeout",
            "5",
            "--retry-interval",
            "1",
        ],
    );
    let mut client = rag(&gw).await;
    eventually(Duration::from_secs(30), "both embedders verified", || {
        let mut c = client.clone();
        async move { stats(&mut c).await.backends.iter().filter(|b| b.verified).count() == 2 }
    })
    .await;
    ingest(&mut client, vec![doc("s1", "Stalls", &paragraph("stopped processes", 3))]).await.unwrap();

    a.signal("STOP");
    let search = |mut c: api::v1::rag_client::RagClient<tonic::transport::Channel>| async move {
        let t = Instant::now();
        let req = SearchRequest { query: "stopped processes".into(), top_k: 1, rerank: None };
        let r = tokio::time::timeout(TIMEOUT + SLACK + SLACK, c.search(req)).await;
        (r.expect("a search hung past the backend timeout"), t.elapsed())
    };
    // A second client searches back to back the whole time: none of its calls may wait on A.
    let stop_bg = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let (c, stop) = (client.clone(), stop_bg.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                out.push(search(c.clone()).await);
            }
            out
        })
    };
    // Back-to-back searches here until a search (this client's or the other's) was routed to
    // A, timed out, and took A out of the rotation.
    let stopped = Instant::now();
    let mut foreground = Vec::new();
    loop {
        foreground.push(search(client.clone()).await);
        let st = stats(&mut client).await;
        if st.backends.iter().any(|x| x.endpoint == a.target() && !x.verified) {
            break;
        }
        assert!(stopped.elapsed() < 4 * TIMEOUT, "the stopped embedder is still in the rotation");
    }
    let after_timeout: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(search(client.clone()).await);
        }
        v
    };
    stop_bg.store(true, std::sync::atomic::Ordering::SeqCst);
    let background = background.await.unwrap();

    let mut timed_out = 0usize;
    for (r, took) in foreground.iter().chain(&background).chain(&after_timeout) {
        match r {
            Ok(_) => assert!(*took < SLACK, "a search answered by the running embedder took {took:?}"),
            Err(s) => {
                timed_out += 1;
                assert_eq!(s.code(), tonic::Code::DeadlineExceeded, "{s:?}");
                assert!(s.message().contains(&a.target()), "the error names the stopped embedder: {}", s.message());
                assert!(*took < TIMEOUT + SLACK, "the timeout came after {took:?}");
            }
        }
    }
    assert!(timed_out >= 1, "no search was routed to the stopped embedder");
    assert!(after_timeout.iter().all(|(r, _)| r.is_ok()), "after its timeout A is out of the rotation");
    let served = background.iter().filter(|(r, _)| r.is_ok()).count();
    assert!(served >= 2, "the other client was blocked: {served} searches answered while A stalled");
    eprintln!(
        "stall: {timed_out} searches timed out on the stopped embedder, {served} of {} concurrent ones answered",
        background.len()
    );
    let st = stats(&mut client).await;
    let down = st.backends.iter().find(|x| x.endpoint == a.target()).unwrap();
    assert!(!down.verified && down.reason.contains("timeout"), "{down:?}");

    // Running again: verified again and used again.
    a.signal("CONT");
    eventually(Duration::from_secs(30), "the resumed embedder is verified again", || {
        let (mut c, ep) = (client.clone(), a.target());
        async move { stats(&mut c).await.backends.iter().any(|x| x.endpoint == ep && x.verified) }
    })
    .await;
    let before = requests(&a).await;
    for _ in 0..4 {
        search(client.clone()).await.0.expect("a search after SIGCONT");
    }
    assert!(requests(&a).await > before, "the resumed embedder gets requests again");
}
