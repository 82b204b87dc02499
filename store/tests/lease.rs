//! Lease keys (`vigil/lease/...`) over real TCP: a connection's leases are
//! deleted and reported when it ends, and only then.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{sleep, timeout, Instant};
use vigil_store::protocol::Request;
use vigil_store::{LeaseEvent, StoreClient, StoreHandle, StoreServer, VALIDATION_MAGIC};

const T: Duration = Duration::from_secs(10);

async fn start() -> (StoreHandle, UnboundedReceiver<LeaseEvent>) {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    let events = server.lease_events();
    (server.spawn(), events)
}

async fn client(addr: SocketAddr) -> StoreClient {
    StoreClient::connect(addr, T).await.expect("connect")
}

/// SET has no reply: a round trip makes sure the server has applied it
/// before another connection acts.
async fn applied(c: &mut StoreClient) {
    c.ping().await.unwrap();
}

async fn next(events: &mut UnboundedReceiver<LeaseEvent>) -> LeaseEvent {
    timeout(T, events.recv())
        .await
        .expect("a lease event within 10 s")
        .expect("the event channel is open")
}

fn lost(key: &str, value: &[u8]) -> LeaseEvent {
    LeaseEvent::Lost {
        key: key.into(),
        value: value.to_vec(),
    }
}

fn released(key: &str) -> LeaseEvent {
    LeaseEvent::Released { key: key.into() }
}

/// Waits until the server has finished with every connection but `keep`
/// (the connection count drops after a connection's leases are settled).
async fn wait_connections(h: &StoreHandle, keep: usize) {
    let deadline = Instant::now() + T;
    while h.stats().connections != keep {
        assert!(Instant::now() < deadline, "connections did not close");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Once every client is dropped and the server has settled their
/// connections, proves that no event is queued: a fresh connection sets and
/// closes a sentinel lease, whose event must be the next one.
async fn assert_no_more_events(h: &StoreHandle, events: &mut UnboundedReceiver<LeaseEvent>) {
    wait_connections(h, 0).await;
    let mut s = client(h.local_addr()).await;
    s.set("vigil/lease/sentinel", b"s").await.unwrap();
    drop(s);
    assert_eq!(next(events).await, lost("sentinel", b"s"));
    wait_connections(h, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_owner_loses_its_lease() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    a.set("vigil/lease/node1", b"host-a").await.unwrap();
    applied(&mut a).await;
    let mut b = client(h.local_addr()).await;
    assert!(b.check(&["vigil/lease/node1"]).await.unwrap());
    drop(a);

    assert_eq!(next(&mut events).await, lost("node1", b"host-a"));
    // The event is sent after the deletion.
    assert!(!b.check(&["vigil/lease/node1"]).await.unwrap());
    assert_eq!(h.key_space().get_raw(b"/vigil/lease/node1"), None);
    drop(b);
    assert_no_more_events(&h, &mut events).await;
    h.shutdown().await;
}

#[tokio::test]
async fn deleting_your_own_lease_releases_it() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    a.set("vigil/lease/node1", b"host-a").await.unwrap();
    assert!(a.delete_key("vigil/lease/node1").await.unwrap());
    drop(a);
    assert_eq!(next(&mut events).await, released("node1"));
    assert_no_more_events(&h, &mut events).await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_overwritten_lease_is_released_and_kept() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    let mut b = client(h.local_addr()).await;
    a.set("vigil/lease/node1", b"host-a").await.unwrap();
    applied(&mut a).await;
    b.set("vigil/lease/node1", b"host-b").await.unwrap();
    applied(&mut b).await;
    drop(a);
    assert_eq!(next(&mut events).await, released("node1"));
    assert_eq!(b.get("vigil/lease/node1").await.unwrap(), b"host-b");

    // Now b owns it.
    drop(b);
    assert_eq!(next(&mut events).await, lost("node1", b"host-b"));
    let mut c = client(h.local_addr()).await;
    assert!(!c.check(&["vigil/lease/node1"]).await.unwrap());
    h.shutdown().await;
}

#[tokio::test]
async fn an_overwrite_with_the_same_value_moves_the_lease() {
    // An agent that reconnects and re-registers before its old connection is
    // found dead must keep its lease.
    let (h, mut events) = start().await;
    let mut old = client(h.local_addr()).await;
    let mut new = client(h.local_addr()).await;
    old.set("vigil/lease/node1", b"host-a").await.unwrap();
    applied(&mut old).await;
    new.set("vigil/lease/node1", b"host-a").await.unwrap();
    applied(&mut new).await;
    drop(old);
    assert_eq!(next(&mut events).await, released("node1"));
    assert_eq!(new.get("vigil/lease/node1").await.unwrap(), b"host-a");
    drop(new);
    assert_eq!(next(&mut events).await, lost("node1", b"host-a"));
    h.shutdown().await;
}

#[tokio::test]
async fn connections_without_leases_report_nothing_and_keep_their_keys() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    a.set("plain", b"1").await.unwrap();
    a.set("vigil/state/node1", b"up").await.unwrap();
    a.set("vigil/leasehold", b"not a lease").await.unwrap();
    a.add("counter", 3).await.unwrap();
    a.queue_push("vigil/lease/q", b"queues are not leases")
        .await
        .unwrap();
    // Writes that do not take ownership, even of a lease key.
    a.append("vigil/lease/appended", b"x").await.unwrap();
    a.add("vigil/lease/added", 1).await.unwrap();
    drop(a);
    assert_no_more_events(&h, &mut events).await;

    let mut b = client(h.local_addr()).await;
    for k in [
        "plain",
        "vigil/state/node1",
        "vigil/leasehold",
        "counter",
        "vigil/lease/q",
        "vigil/lease/appended",
        "vigil/lease/added",
    ] {
        assert!(b.check(&[k]).await.unwrap(), "{k} was removed");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn compare_set_and_multi_set_take_leases() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    // A compare_set that does not store takes nothing.
    assert_eq!(
        a.compare_set("vigil/lease/cas", b"wrong", b"x")
            .await
            .unwrap(),
        b"wrong"
    );
    assert_eq!(
        a.compare_set("vigil/lease/cas", b"", b"v1").await.unwrap(),
        b"v1"
    );
    a.multi_set(&[("vigil/lease/m", b"m1"), ("plain", b"p")])
        .await
        .unwrap();
    drop(a);
    // One connection's events come in key order.
    assert_eq!(next(&mut events).await, lost("cas", b"v1"));
    assert_eq!(next(&mut events).await, lost("m", b"m1"));
    assert_no_more_events(&h, &mut events).await;
    assert_eq!(h.key_space().get_raw(b"/plain"), Some(b"p".to_vec()));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_writers_release_a_lease() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    let mut b = client(h.local_addr()).await;
    for k in ["add", "append", "barrier", "raw", "cleared"] {
        a.set(&format!("vigil/lease/{k}"), b"7").await.unwrap();
    }
    applied(&mut a).await;
    b.add("vigil/lease/add", 1).await.unwrap();
    b.append("vigil/lease/append", b"more").await.unwrap();
    b.barrier("vigil/lease/barrier", 1, T).await.unwrap();
    h.key_space().set_raw(b"/vigil/lease/raw", b"agent");
    assert_eq!(h.clear_prefix(b"/vigil/lease/cleared"), 1);
    // reset() keeps agent keys, leases included.
    a.set("vigil/lease/kept", b"k").await.unwrap();
    applied(&mut a).await;
    h.reset();
    drop(a);
    for k in ["add", "append", "barrier", "cleared"] {
        assert_eq!(next(&mut events).await, released(k));
    }
    assert_eq!(next(&mut events).await, lost("kept", b"k"));
    assert_eq!(next(&mut events).await, released("raw"));
    assert_eq!(b.get("vigil/lease/add").await.unwrap(), b"8");
    assert_eq!(b.get("vigil/lease/append").await.unwrap(), b"7more");
    assert_eq!(b.get("vigil/lease/raw").await.unwrap(), b"agent");
    drop(b);
    assert_no_more_events(&h, &mut events).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_connection_dropped_for_a_protocol_error_loses_its_leases() {
    let (h, mut events) = start().await;
    let mut s = TcpStream::connect(h.local_addr()).await.unwrap();
    let mut b = Vec::new();
    Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .encode(&mut b);
    Request::Set {
        key: b"/vigil/lease/raw".to_vec(),
        value: b"r".to_vec(),
    }
    .encode(&mut b);
    b.push(0xEE); // not an opcode
    s.write_all(&b).await.unwrap();
    assert_eq!(next(&mut events).await, lost("raw", b"r"));
    assert_eq!(h.stats().dropped_for_protocol_errors, 1);
    h.shutdown().await;
}

#[tokio::test]
async fn a_parked_owner_that_closes_loses_its_lease() {
    let (h, mut events) = start().await;
    let mut a = client(h.local_addr()).await;
    a.set("vigil/lease/w", b"w").await.unwrap();
    let mut raw = TcpStream::connect(h.local_addr()).await.unwrap();
    // A raw connection that sets a lease and parks in WAIT, then closes.
    let mut b = Vec::new();
    Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .encode(&mut b);
    Request::Set {
        key: b"/vigil/lease/parked".to_vec(),
        value: b"p".to_vec(),
    }
    .encode(&mut b);
    Request::Wait {
        keys: vec![b"/never".to_vec()],
    }
    .encode(&mut b);
    raw.write_all(&b).await.unwrap();
    let deadline = Instant::now() + T;
    while h.stats().pending_waits != 1 {
        assert!(Instant::now() < deadline, "wait not parked");
        sleep(Duration::from_millis(5)).await;
    }
    drop(raw);
    assert_eq!(next(&mut events).await, lost("parked", b"p"));
    assert_eq!(h.stats().pending_waits, 0);
    drop(a);
    assert_eq!(next(&mut events).await, lost("w", b"w"));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reports_nothing() {
    let (h, mut events) = start().await;
    let mut clients = Vec::new();
    for i in 0..4 {
        let mut c = client(h.local_addr()).await;
        c.set(&format!("vigil/lease/n{i}"), b"v").await.unwrap();
        applied(&mut c).await;
        clients.push(c);
    }
    h.shutdown().await;
    // Every sender is gone with the server: the channel ends with no event.
    assert_eq!(
        timeout(T, events.recv()).await.expect("the channel closes"),
        None
    );
    drop(clients);
}

#[tokio::test]
async fn dropping_the_serve_future_reports_nothing() {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let mut events = server.lease_events();
    let task = tokio::spawn(server.serve());
    let mut c = client(addr).await;
    c.set("vigil/lease/n", b"v").await.unwrap();
    applied(&mut c).await;
    task.abort();
    let _ = task.await;
    assert_eq!(
        timeout(T, events.recv()).await.expect("the channel closes"),
        None
    );
}

#[tokio::test]
async fn without_a_subscriber_lost_leases_are_still_deleted() {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let h = server.spawn();
    let mut a = client(h.local_addr()).await;
    a.set("vigil/lease/n", b"v").await.unwrap();
    drop(a);
    wait_connections(&h, 0).await;
    assert_eq!(h.key_space().get_raw(b"/vigil/lease/n"), None);
    h.shutdown().await;
}

#[tokio::test]
async fn wait_forever_returns_when_the_key_is_set() {
    let (h, _events) = start().await;
    // Duration::MAX must not overflow anywhere, connect included.
    let mut w = StoreClient::connect(h.local_addr(), Duration::MAX)
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        w.wait(&["late"], Duration::MAX).await.unwrap();
        let v = w.get_timeout("late", Duration::MAX).await.unwrap();
        w.barrier("b", 2, Duration::MAX).await.unwrap();
        v
    });
    let mut s = client(h.local_addr()).await;
    let deadline = Instant::now() + T;
    while h.stats().pending_waits != 1 {
        assert!(Instant::now() < deadline, "wait not parked");
        sleep(Duration::from_millis(5)).await;
    }
    s.set("late", b"now").await.unwrap();
    s.barrier("b", 2, T).await.unwrap();
    let v = timeout(T, waiter).await.expect("wait returned").unwrap();
    assert_eq!(v, b"now");
    h.shutdown().await;
}
