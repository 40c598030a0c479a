//! Leader election on a Lease against the fake API server: one holder at a time, renewal,
//! takeover only after the record went unchanged for a lease duration, and release.

mod support;

use std::time::Duration;

use gelo_operator::leader::LeaseLock;
use serde_json::json;
use support::*;

const LEASE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn one_holder_at_a_time_and_takeover_only_after_expiry() {
    let api = FakeApiServer::start().await;
    let a = LeaseLock::new(api.client(), "ops", "gelo-operator", "replica-a", LEASE);
    let b = LeaseLock::new(api.client(), "ops", "gelo-operator", "replica-b", LEASE);

    assert!(a.try_acquire_or_renew().await.expect("a acquires"), "a creates the lease");
    assert!(!b.try_acquire_or_renew().await.expect("b tries"), "a holds it");
    let lease = api.get(LEASES, "ops", "gelo-operator").expect("lease");
    assert_eq!(lease.pointer("/spec/holderIdentity"), Some(&json!("replica-a")));
    assert_eq!(lease.pointer("/spec/leaseTransitions"), Some(&json!(0)));

    // While a renews, b never sees the record unchanged for a whole lease duration.
    for _ in 0..4 {
        tokio::time::sleep(LEASE / 3).await;
        assert!(a.try_acquire_or_renew().await.expect("a renews"));
        assert!(!b.try_acquire_or_renew().await.expect("b tries"), "a is alive");
    }

    // a stops renewing: b takes over once it has watched the record sit for LEASE.
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    assert!(b.try_acquire_or_renew().await.expect("b takes over"));
    let lease = api.get(LEASES, "ops", "gelo-operator").expect("lease");
    assert_eq!(lease.pointer("/spec/holderIdentity"), Some(&json!("replica-b")));
    assert_eq!(lease.pointer("/spec/leaseTransitions"), Some(&json!(1)));
    assert!(!a.try_acquire_or_renew().await.expect("a tries"), "a lost it");

    // b releases on shutdown: a may take it at once.
    b.release().await;
    assert!(a.try_acquire_or_renew().await.expect("a reacquires"));
}

#[tokio::test]
async fn a_replace_with_a_stale_resource_version_is_a_conflict() {
    // LeaseLock's mutual exclusion rests on this: of two candidates that read the same
    // record, only the first write lands.
    let api = FakeApiServer::start().await;
    let a = LeaseLock::new(api.client(), "ops", "lock", "replica-a", LEASE);
    assert!(a.try_acquire_or_renew().await.expect("acquire"));
    // Someone else writes between our read and our write: simulate by a replace with a
    // stale resourceVersion through the API (what LeaseLock sends on a race).
    let stale = api.get(LEASES, "ops", "lock").expect("lease");
    api.update(LEASES, "ops", "lock", |l| l["spec"]["holderIdentity"] = json!("replica-c"));
    let client = api.client();
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(client, "ops");
    let obj: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(stale).expect("lease decodes");
    let err = leases.replace("lock", &Default::default(), &obj).await.expect_err("stale write refused");
    assert!(matches!(err, kube::Error::Api(s) if s.is_conflict()));
}
