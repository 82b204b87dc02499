//! RENEW and SWEEP over real TCP: liveness renewals are one-way, and one sweep per period
//! names exactly the counters that stopped moving (docs/scale.md, "Liveness").

use std::time::Duration;

use vigil_store::{StoreClient, StoreHandle, StoreServer};

const T: Duration = Duration::from_secs(10);

async fn start() -> (StoreHandle, StoreClient, StoreClient) {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    let h = server.spawn();
    let a = StoreClient::connect(h.local_addr(), T).await.unwrap();
    let b = StoreClient::connect(h.local_addr(), T).await.unwrap();
    (h, a, b)
}

/// RENEW has no reply: a round trip on the same connection makes sure the server applied it
/// before another connection sweeps.
async fn renew(c: &mut StoreClient, key: &str) {
    c.renew(key).await.unwrap();
    c.ping().await.unwrap();
}

#[tokio::test]
async fn a_renewal_has_no_reply_and_counts_like_an_add() {
    let (_h, mut a, mut b) = start().await;
    for _ in 0..3 {
        a.renew("alive/1").await.unwrap();
    }
    // Had RENEW a reply, it would be read here as the counter's value.
    assert_eq!(a.add("alive/1", 0).await.unwrap(), 3);
    assert_eq!(b.get("alive/1").await.unwrap(), b"3");
}

#[tokio::test]
async fn a_sweep_names_the_counters_that_did_not_move_since_the_last_one() {
    let (_h, mut a, mut b) = start().await;
    for n in 1..=3 {
        renew(&mut a, &format!("alive/{n}")).await;
    }
    // A counter set by hand, never renewed, is nobody's liveness.
    b.set("alive/9", b"7").await.unwrap();
    // Another prefix is another sweeper's.
    renew(&mut a, "other/1").await;
    assert!(b.sweep("alive/").await.unwrap().is_empty(), "all renewed");
    // Period 2: nodes 1 and 3 renew, node 2 is silent.
    renew(&mut a, "alive/1").await;
    renew(&mut a, "alive/3").await;
    assert_eq!(b.sweep("alive/").await.unwrap(), vec!["alive/2"]);
    // Period 3: nobody renews.
    assert_eq!(
        b.sweep("alive/").await.unwrap(),
        vec!["alive/1", "alive/2", "alive/3"]
    );
    // A node that left deletes its counter, or sets it below 1: forgotten, not stale.
    assert!(b.delete_key("alive/2").await.unwrap());
    b.set("alive/3", b"-1").await.unwrap();
    renew(&mut a, "alive/1").await;
    assert!(b.sweep("alive/").await.unwrap().is_empty());
    // ...until it counts again (-1, 0, 1).
    renew(&mut a, "alive/3").await;
    renew(&mut a, "alive/3").await;
    assert_eq!(b.sweep("alive/").await.unwrap(), vec!["alive/1"]);
    assert_eq!(b.sweep("alive/").await.unwrap(), vec!["alive/1", "alive/3"]);
    // The other prefix was never swept: its first sweep finds it renewed.
    assert!(b.sweep("other/").await.unwrap().is_empty());
    assert_eq!(b.sweep("other/").await.unwrap(), vec!["other/1"]);
}

#[tokio::test]
async fn a_renewal_of_a_key_that_is_not_a_counter_drops_that_connection_only() {
    let (h, mut a, mut b) = start().await;
    b.set("alive/1", b"not a number").await.unwrap();
    a.renew("alive/1").await.unwrap();
    assert!(a.ping().await.is_err(), "the renewing connection is closed");
    assert_eq!(b.get("alive/1").await.unwrap(), b"not a number");
    assert!(h.stats().dropped_for_protocol_errors >= 1);
}

#[tokio::test]
async fn renewals_and_sweeps_ride_a_tagged_connection() {
    let (h, _a, mut b) = start().await;
    let m = vigil_store::MuxClient::connect(h.local_addr(), T, None)
        .await
        .unwrap();
    for _ in 0..3 {
        m.renew("alive/1").unwrap();
    }
    m.renew("alive/2").unwrap();
    // A one-way request gets no frame: had it one, this ADD's reply would be misread.
    assert_eq!(m.add("alive/1", 0).await.unwrap(), 3);
    assert!(m.sweep("alive/").await.unwrap().is_empty());
    m.renew("alive/2").unwrap();
    assert_eq!(m.sweep("alive/").await.unwrap(), vec!["alive/1"]);
    assert_eq!(b.get("alive/2").await.unwrap(), b"2");
}
