//! vigil's tagged mode and `MuxClient`: many requests and waits at once on one connection, next
//! to torch-style clients, with its bounds. Real server, real TCP on 127.0.0.1.

mod common;
use common::{raw, send, wait_until, T};

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use vigil_store::protocol::{put_bytes, put_u64, Request};
use vigil_store::{MuxClient, StoreClient, StoreHandle, StoreServer, MAX_TAGGED_WAITS};

async fn start() -> StoreHandle {
    StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind")
        .spawn()
}

async fn mux(addr: SocketAddr) -> MuxClient {
    MuxClient::connect(addr, T, None)
        .await
        .expect("mux connects")
}

fn tagged(tag: u32, inner: Request) -> Request {
    Request::Tagged {
        tag,
        inner: Box::new(inner),
    }
}

/// One reply frame: (tag, payload).
async fn frame(s: &mut TcpStream) -> (u32, Vec<u8>) {
    let tag = timeout(T, s.read_u32_le()).await.unwrap().unwrap();
    let len = s.read_u64_le().await.unwrap();
    let mut v = vec![0; len as usize];
    s.read_exact(&mut v).await.unwrap();
    (tag, v)
}

/// Reads until the server closes `s`.
async fn expect_closed(s: &mut TcpStream) {
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + T;
    loop {
        match timeout(deadline - Instant::now(), s.read(&mut buf))
            .await
            .expect("the server closes the connection")
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn value(v: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    put_bytes(&mut b, v);
    b
}

#[tokio::test]
async fn replies_are_framed_with_their_tag_and_set_is_confirmed_with_an_empty_frame() {
    let h = start().await;
    let mut s = raw(h.local_addr()).await;
    send(
        &mut s,
        tagged(
            7,
            Request::Set {
                key: b"/k".to_vec(),
                value: b"v".to_vec(),
            },
        ),
    )
    .await;
    send(
        &mut s,
        tagged(
            8,
            Request::Get {
                key: b"/k".to_vec(),
            },
        ),
    )
    .await;
    send(
        &mut s,
        tagged(
            9,
            Request::Add {
                key: b"/n".to_vec(),
                delta: 5,
            },
        ),
    )
    .await;
    assert_eq!(frame(&mut s).await, (7, vec![]));
    assert_eq!(frame(&mut s).await, (8, value(b"v")));
    assert_eq!(frame(&mut s).await, (9, 5i64.to_le_bytes().to_vec()));
    // A wait answered at once, then one parked and cancelled by its tag.
    send(
        &mut s,
        tagged(
            10,
            Request::WaitGet {
                key: b"/k".to_vec(),
            },
        ),
    )
    .await;
    assert_eq!(frame(&mut s).await, (10, value(b"v")));
    send(
        &mut s,
        tagged(
            11,
            Request::Wait {
                keys: vec![b"/never".to_vec()],
            },
        ),
    )
    .await;
    wait_until(|| h.stats().pending_waits == 1).await;
    send(&mut s, tagged(11, Request::CancelWait)).await;
    assert_eq!(frame(&mut s).await, (11, vec![1]));
    assert_eq!(h.stats().pending_waits, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn many_calls_at_once_share_one_connection() {
    let h = start().await;
    let c = mux(h.local_addr()).await;
    let calls = (0..200).map(|_| {
        let c = c.clone();
        tokio::spawn(async move { c.add("n", 1).await.unwrap() })
    });
    let mut got = Vec::new();
    for t in calls {
        got.push(t.await.unwrap());
    }
    got.sort();
    assert_eq!(got, (1..=200).collect::<Vec<i64>>());
    c.set("k", b"v").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"v");
    assert!(c.check(&["k", "n"]).await.unwrap());
    assert!(!c.check(&["k", "missing"]).await.unwrap());
    assert_eq!(
        c.multi_get(&["k", "n"]).await.unwrap(),
        vec![b"v".to_vec(), b"200".to_vec()]
    );
    // Without waiting: a missing key reads empty, at once.
    assert_eq!(
        c.multi_get_now(&["k", "missing"]).await.unwrap(),
        vec![b"v".to_vec(), Vec::new()]
    );
    assert_eq!(c.compare_set("k", b"v", b"w").await.unwrap(), b"w");
    assert_eq!(c.compare_set("k", b"v", b"x").await.unwrap(), b"w");
    assert!(c.delete_key("k").await.unwrap());
    assert!(!c.delete_key("k").await.unwrap());
    let raw = c
        .call(Request::Get {
            key: b"/n".to_vec(),
        })
        .await
        .unwrap();
    assert_eq!(raw, value(b"200"));
    assert_eq!(h.stats().connections, 1);
    h.shutdown().await;
}

#[tokio::test]
async fn two_waits_on_one_connection_wake_in_the_order_their_keys_come() {
    let h = start().await;
    let c = mux(h.local_addr()).await;
    let (ca, cb) = (c.clone(), c.clone());
    let a = tokio::spawn(async move { ca.wait_get("a", T).await });
    let b = tokio::spawn(async move { cb.wait(&["b"], T).await });
    wait_until(|| h.stats().pending_waits == 2).await;
    // The connection still serves other requests while both are parked.
    c.set("b", b"2").await.unwrap();
    timeout(T, b).await.unwrap().unwrap().unwrap();
    assert!(!a.is_finished(), "a's wait was woken by b's key");
    assert_eq!(h.stats().pending_waits, 1);
    c.set("a", b"1").await.unwrap();
    assert_eq!(timeout(T, a).await.unwrap().unwrap().unwrap(), b"1");
    assert_eq!(h.stats().pending_waits, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_dropped_or_timed_out_wait_is_cancelled_on_the_server() {
    let h = start().await;
    let c = mux(h.local_addr()).await;
    let c2 = c.clone();
    let parked = tokio::spawn(async move { c2.wait_get("never", Duration::MAX).await });
    wait_until(|| h.stats().pending_waits == 1).await;
    parked.abort();
    wait_until(|| h.stats().pending_waits == 0).await;
    let e = c
        .wait(&["never"], Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    wait_until(|| h.stats().pending_waits == 0).await;
    // The cancels' acknowledgements, for tags nobody waits on, are ignored.
    c.set("never", b"now").await.unwrap();
    assert_eq!(c.wait_get("never", T).await.unwrap(), b"now");
    assert_eq!(h.stats().connections, 1);
    assert_eq!(h.stats().dropped_for_protocol_errors, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_torch_style_client_works_beside_it_and_a_mixed_connection_is_refused() {
    let h = start().await;
    let m = mux(h.local_addr()).await;
    let mut t = StoreClient::connect(h.local_addr(), T).await.unwrap();
    let waiting = {
        let m = m.clone();
        tokio::spawn(async move { m.wait_get("from-torch", T).await })
    };
    t.set("from-torch", b"x").await.unwrap();
    assert_eq!(timeout(T, waiting).await.unwrap().unwrap().unwrap(), b"x");
    m.set("from-mux", b"y").await.unwrap();
    assert_eq!(t.get("from-mux").await.unwrap(), b"y");
    assert_eq!(t.add("c", 2).await.unwrap(), 2);

    // Once tagged, a connection serves nothing untagged.
    let mut s = raw(h.local_addr()).await;
    send(
        &mut s,
        tagged(
            1,
            Request::Get {
                key: b"/c".to_vec(),
            },
        ),
    )
    .await;
    assert_eq!(frame(&mut s).await, (1, value(b"2")));
    send(
        &mut s,
        Request::Get {
            key: b"/c".to_vec(),
        },
    )
    .await;
    expect_closed(&mut s).await;
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains("tagged mode"));
    // WAIT_GET is tagged only.
    let mut s = raw(h.local_addr()).await;
    send(
        &mut s,
        Request::WaitGet {
            key: b"/c".to_vec(),
        },
    )
    .await;
    expect_closed(&mut s).await;
    assert_eq!(h.stats().dropped_for_protocol_errors, 2);
    assert_eq!(t.get("c").await.unwrap(), b"2");
    h.shutdown().await;
}

#[tokio::test]
async fn more_parked_tags_than_the_bound_close_that_connection_only() {
    let h = start().await;
    let other = mux(h.local_addr()).await;
    let mut s = raw(h.local_addr()).await;
    let mut b = Vec::new();
    for tag in 0..MAX_TAGGED_WAITS as u32 {
        tagged(
            tag,
            Request::Wait {
                keys: vec![format!("/w{tag}").into_bytes()],
            },
        )
        .encode(&mut b);
    }
    s.write_all(&b).await.unwrap();
    wait_until(|| h.stats().pending_waits == MAX_TAGGED_WAITS).await;
    // A tag still parked may not be used again, and one more is over the bound.
    send(
        &mut s,
        tagged(
            MAX_TAGGED_WAITS as u32,
            Request::Wait {
                keys: vec![b"/one-more".to_vec()],
            },
        ),
    )
    .await;
    expect_closed(&mut s).await;
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains(&MAX_TAGGED_WAITS.to_string()));
    wait_until(|| h.stats().pending_waits == 0).await;
    let mut s = raw(h.local_addr()).await;
    for _ in 0..2 {
        send(
            &mut s,
            tagged(
                5,
                Request::Wait {
                    keys: vec![b"/w".to_vec()],
                },
            ),
        )
        .await;
    }
    expect_closed(&mut s).await;
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains("tag 5"));
    other.set("still", b"up").await.unwrap();
    assert_eq!(other.get("still").await.unwrap(), b"up");
    h.shutdown().await;
}

#[tokio::test]
async fn a_malformed_tagged_frame_drops_its_connection_and_not_the_server() {
    let h = start().await;
    let other = mux(h.local_addr()).await;
    // A tag inside a tag.
    let mut s = raw(h.local_addr()).await;
    s.write_all(&[0x64, 1, 0, 0, 0, 0x64, 2, 0, 0, 0, 7])
        .await
        .unwrap();
    expect_closed(&mut s).await;
    // WAIT_GET naming two keys.
    let mut s = raw(h.local_addr()).await;
    let mut b = vec![0x64, 1, 0, 0, 0, 0x65];
    put_u64(&mut b, 2);
    s.write_all(&b).await.unwrap();
    expect_closed(&mut s).await;
    // A tagged request before VALIDATE.
    let mut s = TcpStream::connect(h.local_addr()).await.unwrap();
    send(&mut s, tagged(1, Request::GetNumKeys)).await;
    expect_closed(&mut s).await;
    assert_eq!(h.stats().dropped_for_protocol_errors, 3);
    other.set("k", b"v").await.unwrap();
    assert_eq!(other.get("k").await.unwrap(), b"v");
    assert!(!other.is_dead());
    h.shutdown().await;
}

#[tokio::test]
async fn a_dead_connection_fails_every_pending_call_and_every_later_one_at_once() {
    let h = start().await;
    let c = mux(h.local_addr()).await;
    let c2 = c.clone();
    let parked = tokio::spawn(async move { c2.wait_get("never", Duration::MAX).await });
    wait_until(|| h.stats().pending_waits == 1).await;
    h.shutdown().await;
    let e = timeout(T, parked).await.unwrap().unwrap().unwrap_err();
    assert!(!e.is_timeout(), "{e}");
    assert!(e.to_string().contains("closed the connection"), "{e}");
    assert!(c.is_dead());
    let start = Instant::now();
    let e = c.set("k", b"v").await.unwrap_err();
    assert!(!e.is_timeout(), "{e}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn it_runs_on_a_current_thread_runtime_under_a_local_set() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let h = start().await;
        let c = mux(h.local_addr()).await;
        let c2 = c.clone();
        let w = tokio::task::spawn_local(async move { c2.wait_get("k", T).await });
        c.set("k", b"v").await.unwrap();
        assert_eq!(w.await.unwrap().unwrap(), b"v");
        // The last clone dropped closes the connection.
        drop(c);
        wait_until(|| h.stats().connections == 0).await;
        h.shutdown().await;
    });
}

#[tokio::test]
async fn a_tagged_connection_that_closes_releases_its_leases_and_all_its_waits() {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut leases = server.lease_events();
    let h = server.spawn();
    let mut s = raw(h.local_addr()).await;
    send(
        &mut s,
        tagged(
            1,
            Request::Set {
                key: b"/vigil/lease/1".to_vec(),
                value: b"agent 1".to_vec(),
            },
        ),
    )
    .await;
    assert_eq!(frame(&mut s).await, (1, vec![]));
    for (tag, k) in [(2, "/x"), (3, "/y"), (4, "/z")] {
        send(
            &mut s,
            tagged(
                tag,
                Request::WaitGet {
                    key: k.as_bytes().to_vec(),
                },
            ),
        )
        .await;
    }
    wait_until(|| h.stats().pending_waits == 3).await;
    // Closed under its parked waits, as a killed agent's is.
    drop(s);
    let ev = timeout(T, leases.recv()).await.unwrap().unwrap();
    assert_eq!(
        ev,
        vigil_store::LeaseEvent::Lost {
            key: "1".into(),
            value: b"agent 1".to_vec()
        }
    );
    wait_until(|| h.stats().connections == 0).await;
    assert_eq!(h.stats().pending_waits, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_join_sets_the_record_and_counts_it_in_one_request() {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let h = server.spawn();
    let m = MuxClient::connect(h.local_addr(), Duration::from_secs(10), None)
        .await
        .unwrap();
    let watcher = MuxClient::connect(h.local_addr(), Duration::from_secs(10), None)
        .await
        .unwrap();
    assert_eq!(m.join("join/1", b"me", "joined").await.unwrap(), 1);
    assert_eq!(watcher.get("join/1").await.unwrap(), b"me");
    assert_eq!(m.join("join/2", b"you", "joined").await.unwrap(), 2);
    assert_eq!(watcher.get("join/2").await.unwrap(), b"you");
    // A count that is not a counter ends that connection, not the store.
    watcher.set("bad", b"x").await.unwrap();
    assert!(m.join("join/3", b"them", "bad").await.is_err());
    assert_eq!(watcher.get("joined").await.unwrap(), b"2");
}
