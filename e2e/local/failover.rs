//! A generator killed while it streams an answer: that query fails with a clear UNAVAILABLE
//! naming it, within 5 s of the kill,
//! new queries go to the other replica, and the killed one — restarted on the same port and
//! verified again — gets requests again.

use std::time::{Duration, Instant};

use api::v1::{QueryRequest, query_response::Event};

use crate::{stack::*, support::*};

/// The most a client waits, from SIGKILL, for its query's typed error.
const KILL_TO_ERROR: Duration = Duration::from_secs(5);

async fn active(p: &Proc) -> f64 {
    p.metric("gelo_active_sequences", "").await
}

async fn short_query(
    client: &mut api::v1::rag_client::RagClient<tonic::transport::Channel>,
) -> Result<String, tonic::Status> {
    let req = QueryRequest {
        question: "What was replicated in the cohorts?".into(),
        top_k: 1,
        max_tokens: 3,
        rerank: Some(false),
        ..Default::default()
    };
    let mut s = client.query(req).await?.into_inner();
    let mut text = String::new();
    while let Some(m) = s.message().await? {
        if let Some(Event::Text(t)) = m.event {
            text.push_str(&t);
        }
    }
    Ok(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_generator_fails_its_query_and_the_other_replica_takes_over_until_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let e = service("failover-embedder", "embedder", &minilm(), &[], &[]);
    let mut a = service("failover-gen-a", "generator", &smollm(), &[], &[]);
    let mut b = service("failover-gen-b", "generator", &smollm(), &[], &[]);
    let gw = gateway(
        "failover-gateway",
        &dir.path().join("data"),
        &[
            "--embedder",
            &e.target(),
            "--embedder-identity",
            &hex_identity(&minilm()),
            "--generator",
            &format!("{},{}", a.target(), b.target()),
            "--generator-identity",
            &hex_identity(&smollm()),
            "--retry-interval",
            "0.5",
            "--verify-interval",
            "2",
        ],
    );
    let mut client = rag(&gw).await;
    eventually(Duration::from_secs(30), "both generators verified", || {
        let mut c = client.clone();
        async move { stats(&mut c).await.backends.iter().filter(|b| b.role == "generator" && b.verified).count() == 2 }
    })
    .await;
    ingest(&mut client, vec![doc("c1", "Cohorts", &paragraph("sleep and memory", 4))]).await.unwrap();

    // 1. A long answer; kill whichever generator is decoding it.
    let req = QueryRequest {
        question: "Describe every finding in detail.".into(),
        top_k: 1,
        max_tokens: 400,
        rerank: Some(false),
        ..Default::default()
    };
    let mut stream = client.query(req).await.unwrap().into_inner();
    loop {
        match stream.message().await.unwrap().and_then(|m| m.event) {
            Some(Event::Text(_)) => break,
            Some(_) => continue,
            None => panic!("the answer ended before any text"),
        }
    }
    let (busy_a, busy_b) = (active(&a).await, active(&b).await);
    assert_eq!(busy_a + busy_b, 1.0, "exactly one generator decodes the query");
    let (victim, survivor) = if busy_a > 0.0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
    let port = victim.grpc.port();
    let survivor_before = requests(survivor).await;
    let killed = Instant::now();
    victim.kill();
    let failed = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the answer completed although its generator was killed"),
            Err(s) => break s,
        }
    };
    // The bound: the kernel resets the dead process's connection at once, so the gateway
    // sees the stream break within milliseconds; 5 s leaves room for a loaded CI machine.
    let took = killed.elapsed();
    assert!(took < KILL_TO_ERROR, "the typed error came {took:?} after the kill");
    eprintln!("failover: the client had its typed error {took:?} after SIGKILL");
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert!(
        failed.message().contains("generator")
            && failed.message().contains(&format!("127.0.0.1:{port}"))
            && failed.message().contains("retry"),
        "{}",
        failed.message()
    );

    // 2. New queries go to the survivor.
    for _ in 0..3 {
        let text = short_query(&mut client).await.expect("a query after the kill");
        assert!(!text.is_empty());
    }
    assert_eq!(requests(survivor).await, survivor_before + 3.0);
    let st = stats(&mut client).await;
    let down = st.backends.iter().find(|b| b.endpoint == format!("127.0.0.1:{port}")).unwrap();
    assert!(!down.verified && !down.reason.is_empty(), "{down:?}");

    // 3. Restarted on the same port, verified again, and used again.
    let listen = format!("127.0.0.1:{port}");
    let restarted = service("failover-gen-restarted", "generator", &smollm(), &["--listen", &listen], &[]);
    eventually(Duration::from_secs(60), "the restarted generator is verified again", || {
        let mut c = client.clone();
        let ep = listen.clone();
        async move { stats(&mut c).await.backends.iter().any(|b| b.endpoint == ep && b.verified) }
    })
    .await;
    for _ in 0..4 {
        short_query(&mut client).await.expect("a query after the restart");
    }
    assert!(requests(&restarted).await >= 1.0, "round-robin sends the restarted generator requests again");
}
