//! The server and the client over real TCP on 127.0.0.1.

mod common;
use common::{raw, send, wait_until, T};

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};
use vigil_store::protocol::{put_bytes, put_u64, Request};
use vigil_store::{StoreClient, StoreError, StoreHandle, StoreServer};

async fn start() -> StoreHandle {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    let addr = server.local_addr().unwrap();
    assert_ne!(addr.port(), 0, "port 0 picks a real port");
    let handle = server.spawn();
    assert_eq!(handle.local_addr(), addr);
    handle
}

async fn client(addr: SocketAddr) -> StoreClient {
    StoreClient::connect(addr, T).await.expect("connect")
}

/// Reads until the server closes the connection (or fails on a timeout).
async fn expect_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    let n = timeout(T, s.read(&mut buf))
        .await
        .expect("server should close the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "expected EOF, got {:?}", &buf[..n]);
}

#[tokio::test]
async fn every_operation_round_trips() {
    let h = start().await;
    let mut c = client(h.local_addr()).await;
    assert!(c.ping().await.unwrap() < T);

    c.set("a", b"1").await.unwrap();
    assert_eq!(c.get("a").await.unwrap(), b"1");
    c.set("a", b"").await.unwrap();
    assert_eq!(c.get("a").await.unwrap(), b"", "empty values are values");

    assert_eq!(c.add("n", 5).await.unwrap(), 5);
    assert_eq!(c.add("n", -7).await.unwrap(), -2);
    assert_eq!(
        c.get("n").await.unwrap(),
        b"-2",
        "counters are ASCII decimal"
    );
    c.set("m", b"40").await.unwrap();
    assert_eq!(c.add("m", 2).await.unwrap(), 42);

    assert!(c.check(&["a", "n"]).await.unwrap());
    assert!(!c.check(&["a", "missing"]).await.unwrap());
    assert!(c.check(&[]).await.unwrap(), "no keys: ready");
    c.wait(&["a", "n"], T).await.unwrap();

    c.append("ap", b"x").await.unwrap();
    c.append("ap", b"yz").await.unwrap();
    assert_eq!(c.get("ap").await.unwrap(), b"xyz");

    c.multi_set(&[("k1", b"v1"), ("k2", b"v2")]).await.unwrap();
    assert_eq!(
        c.multi_get(&["k2", "k1"]).await.unwrap(),
        vec![b"v2".to_vec(), b"v1".to_vec()]
    );

    // a, n, m, ap, k1, k2
    assert_eq!(c.num_keys().await.unwrap(), 6);
    assert!(c.delete_key("k1").await.unwrap());
    assert!(!c.delete_key("k1").await.unwrap());
    assert_eq!(c.num_keys().await.unwrap(), 5);
    let mut keys = c.list_keys().await.unwrap();
    keys.sort();
    assert_eq!(keys, ["a", "ap", "k2", "m", "n"]);

    // Client keys carry torch's "/" prefix on the server.
    assert_eq!(h.key_space().get_raw(b"/k2").unwrap(), b"v2");
    assert_eq!(h.key_space().get_raw(b"k2"), None);

    c.queue_push("q", b"first").await.unwrap();
    c.queue_push("q", b"second").await.unwrap();
    assert_eq!(c.queue_len("q").await.unwrap(), 2);
    assert_eq!(c.queue_pop("q", false).await.unwrap(), b"first");
    assert_eq!(c.queue_pop("q", true).await.unwrap(), b"second");
    assert_eq!(c.queue_len("q").await.unwrap(), 0);
    assert!(matches!(
        c.queue_pop("q", false).await,
        Err(StoreError::QueueEmpty)
    ));
    assert!(!c.is_broken(), "an empty queue is not a broken connection");
    assert_eq!(c.queue_len("never").await.unwrap(), 0);

    c.barrier("b1", 1, T).await.unwrap();
    assert_eq!(c.get("b1").await.unwrap(), b"1");
    h.shutdown().await;
}

#[tokio::test]
async fn compare_set_follows_torch() {
    let h = start().await;
    let mut c = client(h.local_addr()).await;
    // Missing key, empty expected: created.
    assert_eq!(c.compare_set("cs", b"", b"x").await.unwrap(), b"x");
    assert_eq!(c.get("cs").await.unwrap(), b"x");
    // Missing key, non-empty expected: the reply is `expected`, nothing is set.
    assert_eq!(c.compare_set("gone", b"e", b"x").await.unwrap(), b"e");
    assert!(!c.check(&["gone"]).await.unwrap());
    // Present and equal: swapped.
    assert_eq!(c.compare_set("cs", b"x", b"y").await.unwrap(), b"y");
    // Present and different: unchanged, current value returned.
    assert_eq!(c.compare_set("cs", b"bad", b"z").await.unwrap(), b"y");
    // Present, empty expected, value non-empty: unchanged.
    assert_eq!(c.compare_set("cs", b"", b"z").await.unwrap(), b"y");
    assert_eq!(c.get("cs").await.unwrap(), b"y");
    h.shutdown().await;
}

#[tokio::test]
async fn add_on_a_non_counter_drops_only_that_connection() {
    let h = start().await;
    let mut c = client(h.local_addr()).await;
    let mut other = client(h.local_addr()).await;
    c.set("word", b"abc").await.unwrap();
    assert!(c.add("word", 1).await.is_err());
    assert!(c.is_broken());
    assert!(matches!(c.ping().await, Err(StoreError::Broken)));
    assert_eq!(other.get("word").await.unwrap(), b"abc");
    assert_eq!(other.add("ok", 1).await.unwrap(), 1);
    assert_eq!(h.stats().dropped_for_protocol_errors, 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_another_clients_set() {
    let h = start().await;
    let addr = h.local_addr();
    let keys = h.key_space().clone();
    let waiter = tokio::spawn(async move {
        let mut c = client(addr).await;
        let start = Instant::now();
        let v = c.get("late").await.unwrap();
        (v, start.elapsed())
    });
    wait_until(|| keys.stats().pending_waits == 1).await;
    sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "get must block until the key exists");
    let mut setter = client(addr).await;
    setter.set("late", b"here").await.unwrap();
    let (v, took) = timeout(T, waiter).await.unwrap().unwrap();
    assert_eq!(v, b"here");
    assert!(took >= Duration::from_millis(100));
    assert_eq!(h.stats().pending_waits, 0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_on_several_keys_needs_all_of_them() {
    let h = start().await;
    let addr = h.local_addr();
    let keys = h.key_space().clone();
    let waiter = tokio::spawn(async move {
        let mut c = client(addr).await;
        c.wait(&["x", "y", "z"], T).await
    });
    let mut s = client(addr).await;
    s.set("y", b"1").await.unwrap();
    wait_until(|| keys.stats().pending_waits == 1).await;
    s.add("x", 1).await.unwrap();
    s.append("x", b"0").await.unwrap();
    sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "z is still missing");
    s.multi_set(&[("z", b"3")]).await.unwrap();
    timeout(T, waiter).await.unwrap().unwrap().unwrap();
    h.shutdown().await;
}

#[tokio::test]
async fn wait_timeout_cancels_and_keeps_the_connection() {
    let h = start().await;
    let mut c = client(h.local_addr()).await;
    let start = Instant::now();
    let err = c
        .wait(&["never"], Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(!c.is_broken());
    assert_eq!(
        h.stats().pending_waits,
        0,
        "CANCEL_WAIT unregisters the waiter"
    );
    // The connection still works, and a later set does not send a stray byte.
    c.set("never", b"now").await.unwrap();
    assert_eq!(c.get("never").await.unwrap(), b"now");
    assert_eq!(c.add("n", 1).await.unwrap(), 1);
    let err = c
        .get_timeout("other", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    h.shutdown().await;
}

#[tokio::test]
async fn cancel_wait_bytes_match_torch() {
    let h = start().await;
    let addr = h.local_addr();
    let mut s = raw(addr).await;
    // No wait parked: just WAIT_CANCELED.
    send(&mut s, Request::CancelWait).await;
    assert_eq!(s.read_u8().await.unwrap(), 1);

    // Parked, then released by another client before the cancel arrives:
    // STOP_WAITING (0) first, then WAIT_CANCELED (1).
    send(
        &mut s,
        Request::Wait {
            keys: vec![b"/k".to_vec()],
        },
    )
    .await;
    wait_until(|| h.stats().pending_waits == 1).await;
    let mut c = client(addr).await;
    c.set("k", b"v").await.unwrap();
    wait_until(|| h.stats().pending_waits == 0).await;
    send(&mut s, Request::CancelWait).await;
    let mut two = [9u8; 2];
    s.read_exact(&mut two).await.unwrap();
    // The wake-up may be written before or together with the cancel answer;
    // either way the order is STOP_WAITING, WAIT_CANCELED.
    assert_eq!(two, [0, 1]);

    // Parked and cancelled: only WAIT_CANCELED, and a later set sends nothing.
    send(
        &mut s,
        Request::Wait {
            keys: vec![b"/k2".to_vec()],
        },
    )
    .await;
    wait_until(|| h.stats().pending_waits == 1).await;
    send(&mut s, Request::CancelWait).await;
    assert_eq!(s.read_u8().await.unwrap(), 1);
    assert_eq!(h.stats().pending_waits, 0);
    c.set("k2", b"v").await.unwrap();
    c.ping().await.unwrap(); // the set has been applied
    send(&mut s, Request::Ping { nonce: 77 }).await;
    assert_eq!(s.read_u32_le().await.unwrap(), 77, "no stray STOP_WAITING");
    h.shutdown().await;
}

#[tokio::test]
async fn wait_for_present_keys_answers_at_once() {
    let h = start().await;
    let mut s = raw(h.local_addr()).await;
    send(
        &mut s,
        Request::Set {
            key: b"/p".to_vec(),
            value: b"1".to_vec(),
        },
    )
    .await;
    send(
        &mut s,
        Request::Wait {
            keys: vec![b"/p".to_vec()],
        },
    )
    .await;
    assert_eq!(s.read_u8().await.unwrap(), 0);
    send(&mut s, Request::Wait { keys: vec![] }).await;
    assert_eq!(s.read_u8().await.unwrap(), 0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_queue_pop_is_woken_by_a_push() {
    let h = start().await;
    let addr = h.local_addr();
    let keys = h.key_space().clone();
    let mut poppers = Vec::new();
    for _ in 0..3 {
        poppers.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            c.queue_pop("jobs", true).await
        }));
    }
    wait_until(|| keys.stats().pending_waits == 3).await;
    let mut p = client(addr).await;
    p.queue_push("jobs", b"1").await.unwrap();
    wait_until(|| keys.stats().pending_waits == 2).await;
    sleep(Duration::from_millis(50)).await;
    assert_eq!(
        poppers.iter().filter(|t| t.is_finished()).count(),
        1,
        "one push releases one popper"
    );
    p.queue_push("jobs", b"2").await.unwrap();
    p.queue_push("jobs", b"3").await.unwrap();
    let mut got = Vec::new();
    for t in poppers {
        got.push(timeout(T, t).await.unwrap().unwrap().unwrap());
    }
    got.sort();
    assert_eq!(got, [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    assert_eq!(p.queue_len("jobs").await.unwrap(), 0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_releases_everyone_at_world_size() {
    let h = start().await;
    let addr = h.local_addr();
    let keys = h.key_space().clone();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            c.barrier("bar", 4, T).await
        }));
    }
    wait_until(|| keys.stats().pending_waits == 3).await;
    assert!(tasks.iter().all(|t| !t.is_finished()));
    let mut last = client(addr).await;
    last.barrier("bar", 4, T).await.unwrap();
    for t in tasks {
        timeout(T, t).await.unwrap().unwrap().unwrap();
    }
    assert_eq!(last.get("bar").await.unwrap(), b"4");
    // A barrier that never fills times out and cancels cleanly.
    let err = last
        .barrier("lonely", 2, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(h.stats().pending_waits, 0);
    assert_eq!(last.add("after", 1).await.unwrap(), 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_concurrently() {
    let h = start().await;
    let addr = h.local_addr();
    const CLIENTS: usize = 64;
    const ADDS: i64 = 50;
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            // Everyone parks on "go" first: one set releases all of them.
            c.wait(&["go"], T).await.unwrap();
            for _ in 0..ADDS {
                c.add("counter", 1).await.unwrap();
            }
            c.set(&format!("done/{i}"), b"1").await.unwrap();
            c.add("finished", 1).await.unwrap()
        }));
    }
    let keys = h.key_space().clone();
    wait_until(|| keys.stats().pending_waits == CLIENTS).await;
    assert_eq!(h.stats().connections, CLIENTS);
    let mut c = client(addr).await;
    c.set("go", b"1").await.unwrap();
    let mut finished: Vec<i64> = Vec::new();
    for t in tasks {
        finished.push(timeout(T, t).await.unwrap().unwrap());
    }
    finished.sort();
    assert_eq!(finished, (1..=CLIENTS as i64).collect::<Vec<_>>());
    assert_eq!(
        c.get("counter").await.unwrap(),
        (CLIENTS as i64 * ADDS).to_string().into_bytes()
    );
    let done: Vec<String> = (0..CLIENTS).map(|i| format!("done/{i}")).collect();
    let done: Vec<&str> = done.iter().map(|s| s.as_str()).collect();
    assert!(c.check(&done).await.unwrap());
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_input_drops_only_that_connection() {
    let h = start().await;
    let addr = h.local_addr();
    let mut good = client(addr).await;
    good.set("keep", b"1").await.unwrap();

    // Unknown opcode after a valid VALIDATE.
    let mut s = raw(addr).await;
    s.write_all(&[0xEE, 1, 2, 3]).await.unwrap();
    expect_closed(&mut s).await;

    // Wrong magic.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0, 1, 2, 3, 4]).await.unwrap();
    expect_closed(&mut s).await;

    // A request before VALIDATE.
    let mut s = TcpStream::connect(addr).await.unwrap();
    send(&mut s, Request::GetNumKeys).await;
    expect_closed(&mut s).await;

    // HTTP on the store port.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    expect_closed(&mut s).await;

    // An absurd length.
    let mut s = raw(addr).await;
    let mut b = vec![3u8];
    put_u64(&mut b, u64::MAX);
    s.write_all(&b).await.unwrap();
    expect_closed(&mut s).await;

    // Too many keys.
    let mut s = raw(addr).await;
    let mut b = vec![6u8];
    put_u64(&mut b, 1 << 40);
    s.write_all(&b).await.unwrap();
    expect_closed(&mut s).await;

    // A second WAIT while one is parked.
    let mut s = raw(addr).await;
    send(
        &mut s,
        Request::Wait {
            keys: vec![b"/w1".to_vec()],
        },
    )
    .await;
    send(
        &mut s,
        Request::Wait {
            keys: vec![b"/w2".to_vec()],
        },
    )
    .await;
    expect_closed(&mut s).await;

    // Requests before a bad one are still answered, then the connection ends.
    let mut s = raw(addr).await;
    let mut b = Vec::new();
    Request::Ping { nonce: 4321 }.encode(&mut b);
    Request::Add {
        key: b"/before-bad".to_vec(),
        delta: 2,
    }
    .encode(&mut b);
    b.push(0xAB);
    s.write_all(&b).await.unwrap();
    assert_eq!(s.read_u32_le().await.unwrap(), 4321);
    assert_eq!(s.read_i64_le().await.unwrap(), 2);
    expect_closed(&mut s).await;

    // A truncated request, then the client hangs up.
    let mut s = raw(addr).await;
    let mut b = vec![1u8];
    put_bytes(&mut b, b"/half");
    put_u64(&mut b, 100);
    b.extend_from_slice(b"only a few");
    s.write_all(&b).await.unwrap();
    drop(s);

    assert_eq!(good.get("keep").await.unwrap(), b"1");
    assert_eq!(good.add("still", 1).await.unwrap(), 1);
    assert!(
        !good.check(&["half"]).await.unwrap(),
        "a partial SET stores nothing"
    );
    let keys = h.key_space().clone();
    wait_until(|| keys.stats().connections == 1).await;
    assert_eq!(h.stats().dropped_for_protocol_errors, 8);
    assert_eq!(
        h.stats().pending_waits,
        0,
        "dropped connections leave no waiters"
    );
    assert!(h.key_space().last_protocol_error().is_some());
    h.shutdown().await;
}

#[tokio::test]
async fn requests_split_across_many_writes() {
    let h = start().await;
    let mut s = raw(h.local_addr()).await;
    let mut b = Vec::new();
    Request::Set {
        key: b"/big".to_vec(),
        value: vec![7u8; 300_000],
    }
    .encode(&mut b);
    Request::Get {
        key: b"/big".to_vec(),
    }
    .encode(&mut b);
    for chunk in b.chunks(997) {
        s.write_all(chunk).await.unwrap();
    }
    assert_eq!(s.read_u64_le().await.unwrap(), 300_000);
    let mut v = vec![0u8; 300_000];
    s.read_exact(&mut v).await.unwrap();
    assert!(v.iter().all(|&x| x == 7));
    h.shutdown().await;
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let h = start().await;
    let mut s = raw(h.local_addr()).await;
    let mut b = Vec::new();
    for i in 0..100u32 {
        Request::Add {
            key: b"/p".to_vec(),
            delta: 1,
        }
        .encode(&mut b);
        Request::Ping { nonce: i }.encode(&mut b);
    }
    s.write_all(&b).await.unwrap();
    for i in 0..100u32 {
        assert_eq!(s.read_i64_le().await.unwrap(), i as i64 + 1);
        assert_eq!(s.read_u32_le().await.unwrap(), i);
    }
    h.shutdown().await;
}

#[tokio::test]
async fn reset_keeps_only_agent_keys() {
    let h = start().await;
    let mut c = client(h.local_addr()).await;
    c.set("vigil/restarts", b"2").await.unwrap();
    c.set("vigil/nodes/0", b"up").await.unwrap();
    c.set("init/", b"x").await.unwrap();
    c.set("worker/attempt_0/rank0", b"addr").await.unwrap();
    c.add("counter", 3).await.unwrap();
    c.queue_push("q", b"1").await.unwrap();
    h.key_space().set_raw(b"init/", b"1"); // torch's own unprefixed key
    assert_eq!(c.num_keys().await.unwrap(), 6);

    let removed = h.reset();
    assert_eq!(
        removed, 5,
        "three user keys, torch's raw init/ and one queue"
    );
    let mut keys = c.list_keys().await.unwrap();
    keys.sort();
    assert_eq!(keys, ["vigil/nodes/0", "vigil/restarts"]);
    assert_eq!(c.queue_len("q").await.unwrap(), 0);
    assert_eq!(c.add("counter", 1).await.unwrap(), 1, "counters restart");

    assert_eq!(h.clear_prefix(b"/vigil/nodes/"), 1);
    assert_eq!(
        h.key_space().keys_raw(),
        vec![b"/counter".to_vec(), b"/vigil/restarts".to_vec()]
    );
    assert_eq!(h.key_space().reset_except(b"/nothing"), 2);
    assert_eq!(c.num_keys().await.unwrap(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn reset_leaves_parked_waiters_for_the_next_attempt() {
    let h = start().await;
    let addr = h.local_addr();
    let mut waiter = raw(addr).await;
    send(
        &mut waiter,
        Request::Wait {
            keys: vec![b"/next".to_vec()],
        },
    )
    .await;
    let keys = h.key_space().clone();
    wait_until(|| keys.stats().pending_waits == 1).await;
    h.reset();
    assert_eq!(h.stats().pending_waits, 1);
    h.key_space().set_raw(b"/next", b"1");
    assert_eq!(waiter.read_u8().await.unwrap(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_connections_and_frees_the_port() {
    let h = start().await;
    let addr = h.local_addr();
    let mut c = client(addr).await;
    let mut parked = raw(addr).await;
    send(
        &mut parked,
        Request::Wait {
            keys: vec![b"/never".to_vec()],
        },
    )
    .await;
    c.set("x", b"1").await.unwrap();
    timeout(T, h.shutdown()).await.expect("shutdown finishes");
    expect_closed(&mut parked).await;
    assert!(c.get("x").await.is_err());
    // The port can be bound again at once.
    let again = StoreServer::bind(addr).await.expect("rebind the same port");
    let h2 = again.spawn();
    let mut c2 = client(addr).await;
    assert_eq!(c2.num_keys().await.unwrap(), 0, "a new server starts empty");
    h2.shutdown().await;
}

#[tokio::test]
async fn serve_future_runs_until_dropped() {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let keys = server.key_space();
    let task = tokio::spawn(server.serve());
    let mut c = client(addr).await;
    c.set("k", b"v").await.unwrap();
    c.ping().await.unwrap(); // SET has no reply: a round trip orders it
    assert_eq!(keys.get_raw(b"/k").unwrap(), b"v");
    task.abort();
    let _ = task.await;
    assert!(
        c.get("k").await.is_err(),
        "dropping serve() closes connections"
    );
}

#[tokio::test]
async fn connect_retries_until_the_server_is_up() {
    // Reserve a port, release it, start the server on it a bit later.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let starter = tokio::spawn(async move {
        sleep(Duration::from_millis(300)).await;
        StoreServer::bind(addr).await.unwrap().spawn()
    });
    let mut c = StoreClient::connect(addr, T)
        .await
        .expect("retried connect");
    c.set("k", b"v").await.unwrap();
    c.ping().await.unwrap();
    let h = starter.await.unwrap();
    assert_eq!(h.key_space().get_raw(b"/k").unwrap(), b"v");
    h.shutdown().await;

    let err = StoreClient::connect(addr, Duration::from_millis(200))
        .await
        .err()
        .expect("nothing listens any more");
    assert!(matches!(err, StoreError::Connect { .. }), "{err}");
}

#[tokio::test]
async fn a_dropped_operation_marks_the_client_broken() {
    let h = start().await;
    let mut c = client(h.local_addr()).await;
    // Drop a get half way (it is parked on a missing key).
    let r = timeout(Duration::from_millis(100), c.get("missing")).await;
    assert!(r.is_err(), "the get was still waiting");
    assert!(c.is_broken());
    assert!(matches!(c.set("x", b"1").await, Err(StoreError::Broken)));
    h.shutdown().await;
}
