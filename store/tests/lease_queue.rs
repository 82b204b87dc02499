//! A store outside the job, over real TCP: an agent that does not host the store resets and
//! clears the key space with CLEAR_EXCEPT / CLEAR_PREFIX, and learns of lost leases from the
//! queue `vigil/lease_events` (`StoreServer::set_lease_queue`).

use std::time::Duration;

use vigil_store::{lease_event_json, MuxClient, StoreClient, StoreHandle, StoreServer};

const SECRET: &[u8] = b"0123456789abcdef-the-job";
const T: Duration = Duration::from_secs(10);

async fn start(lease_queue: bool) -> StoreHandle {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    server.set_secret(Some(SECRET.to_vec()));
    server.set_lease_queue(lease_queue);
    server.spawn()
}

async fn agent(h: &StoreHandle) -> MuxClient {
    MuxClient::connect(h.local_addr(), T, Some(SECRET))
        .await
        .expect("connect")
}

#[tokio::test]
async fn an_agent_clears_the_key_space_over_the_wire_and_a_rank_cannot() {
    let h = start(true).await;
    let a = agent(&h).await;
    for k in [
        "vigil/job",
        "vigil/c1/x",
        "init/",
        "default_pg/1",
        "default_pg/2",
    ] {
        a.set(k, b"v").await.unwrap();
    }
    assert_eq!(a.clear_prefix(b"/default_pg/").await.unwrap(), 2);
    assert_eq!(a.clear_except(b"/vigil/").await.unwrap(), 1);
    assert_eq!(
        h.key_space().keys_raw(),
        vec![b"/vigil/c1/x".to_vec(), b"/vigil/job".to_vec()]
    );
    assert_eq!(a.clear_prefix(b"/vigil/c1/").await.unwrap(), 1);

    // A rank's connection is closed for it, and nothing is deleted.
    let mut r = StoreClient::connect(h.local_addr(), T).await.unwrap();
    r.authenticate(Some(SECRET)).await.unwrap();
    r.rank_only().await.unwrap();
    let m = MuxClient::from_client(r).unwrap();
    assert!(m.clear_except(b"/nothing").await.is_err());
    assert_eq!(h.key_space().keys_raw(), vec![b"/vigil/job".to_vec()]);
}

#[tokio::test]
async fn a_lost_lease_reaches_a_client_parked_on_the_lease_queue_in_order() {
    let h = start(true).await;
    let watcher = agent(&h).await;
    let parked = {
        let w = watcher.clone();
        tokio::spawn(async move { w.next_lease_event(T).await })
    };
    let a = agent(&h).await;
    a.set("vigil/lease/node/1", b"host-1").await.unwrap();
    let b = agent(&h).await;
    b.set("vigil/lease/node/2", b"host-2").await.unwrap();
    drop(a);
    let first = parked.await.unwrap().unwrap();
    assert_eq!(first, lease_event_json("node/1", b"host-1"));
    drop(b);
    let second = watcher.next_lease_event(T).await.unwrap();
    assert_eq!(second, lease_event_json("node/2", b"host-2"));
    // A reset between attempts keeps the queue (it is under /vigil/).
    watcher.clear_except(b"/vigil/").await.unwrap();
    assert!(watcher
        .next_lease_event(Duration::from_millis(100))
        .await
        .is_err());
}

#[tokio::test]
async fn without_the_lease_queue_nothing_is_queued() {
    let h = start(false).await;
    let a = agent(&h).await;
    a.set("vigil/lease/node/1", b"x").await.unwrap();
    drop(a);
    let w = agent(&h).await;
    // The lease is gone (settled) but no event is queued.
    for _ in 0..200 {
        if !w.check(&["vigil/lease/node/1"]).await.unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!w.check(&["vigil/lease/node/1"]).await.unwrap());
    assert_eq!(w.queue_pop("vigil/lease_events").await.unwrap(), None);
}
