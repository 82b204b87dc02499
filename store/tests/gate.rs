//! The gate over real TCP: connections that have not proven the secret are bounded in time,
//! bytes and number, and a flood of them never keeps an agent out.

mod common;
use common::{raw, send, wait_until, T};

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::timeout;
use vigil_store::protocol::Request;
use vigil_store::{StoreClient, StoreHandle, StoreServer};

const SECRET: &[u8] = b"0123456789abcdef-the-job";

async fn start(handshake: Duration, max_in_handshake: usize) -> StoreHandle {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    server.set_secret(Some(SECRET.to_vec()));
    server.set_handshake_timeout(handshake);
    server.set_max_in_handshake(max_in_handshake);
    server.spawn()
}

/// Reads until the server closes the connection (EOF or reset), within `T`.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match timeout(T, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_connection_that_does_not_prove_the_secret_in_time_is_closed() {
    let h = start(Duration::from_millis(300), 256).await;
    let mut idle = TcpStream::connect(h.local_addr()).await.unwrap();
    let mut validated = raw(h.local_addr()).await;
    assert!(closed(&mut idle).await);
    assert!(closed(&mut validated).await);
    let why = h.key_space().last_protocol_error().unwrap();
    assert!(why.contains("no proof of the job's secret within"), "{why}");
    wait_until(|| h.stats().connections == 0).await;
    // An agent that proves it stays, however long it idles.
    let mut a = StoreClient::connect(h.local_addr(), T).await.unwrap();
    a.authenticate(Some(SECRET)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    a.set("k", b"v").await.unwrap();
}

#[tokio::test]
async fn a_large_request_before_the_proof_is_refused_before_it_is_buffered() {
    let h = start(Duration::from_secs(30), 256).await;
    let mut r = raw(h.local_addr()).await;
    // The head of a SET with a 1 MiB value: refused on the length, not after 1 MiB arrived.
    send(
        &mut r,
        Request::Set {
            key: b"/k".to_vec(),
            value: vec![0; 1 << 20],
        },
    )
    .await;
    assert!(closed(&mut r).await);
    assert_eq!(h.stats().stored_bytes, 0);
    assert_eq!(h.stats().buffered_bytes, 0);
}

#[tokio::test]
async fn a_flood_of_idle_connections_holds_a_bounded_number_and_agents_still_get_in() {
    let cap = 32;
    let h = start(Duration::from_secs(30), cap).await;
    let mut flood = Vec::new();
    for _ in 0..400 {
        flood.push(TcpStream::connect(h.local_addr()).await.unwrap());
    }
    wait_until(|| h.stats().in_handshake <= cap && h.stats().connections <= cap + 1).await;
    // While the flood goes on, an agent connects, proves the secret and is served.
    let mut a = StoreClient::connect(h.local_addr(), T).await.unwrap();
    a.authenticate(Some(SECRET)).await.unwrap();
    for _ in 0..400 {
        flood.push(TcpStream::connect(h.local_addr()).await.unwrap());
    }
    a.set("k", b"v").await.unwrap();
    assert_eq!(a.get("k").await.unwrap(), b"v");
    wait_until(|| h.stats().in_handshake <= cap).await;
    let why = h.key_space().last_protocol_error().unwrap();
    assert!(why.contains("closed to make room"), "{why}");
    // The oldest of the flood were closed by the server.
    assert!(closed(&mut flood[0]).await);
}

#[tokio::test]
async fn connections_turned_away_in_their_handshake_are_counted_by_kind_and_told() {
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;
    use vigil_store::Refusal;
    let cap = 8;
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    server.set_secret(Some(SECRET.to_vec()));
    server.set_max_in_handshake(cap);
    let told: Arc<Mutex<Vec<Option<Refusal>>>> = Arc::default();
    let t = told.clone();
    server.on_drop(Arc::new(move |_, kind, _| t.lock().unwrap().push(kind)));
    let h = server.spawn();
    let addr = h.local_addr();
    // Junk: bytes that are not the handshake.
    let mut junk = TcpStream::connect(addr).await.unwrap();
    junk.write_all(&[0xff; 64]).await.unwrap();
    assert!(closed(&mut junk).await);
    // A wrong secret.
    let mut wrong = StoreClient::connect(addr, T).await.unwrap();
    assert!(wrong
        .authenticate(Some(b"another-jobs-secret-0123"))
        .await
        .is_err());
    // A flood: more than the cap at once, then every one closed without a byte.
    let mut flood = Vec::new();
    for _ in 0..cap + 5 {
        flood.push(TcpStream::connect(addr).await.unwrap());
    }
    wait_until(|| h.key_space().refusals().over_budget >= 5).await;
    drop(flood);
    // An agent that proves the secret and leaves is no refusal.
    let mut a = StoreClient::connect(addr, T).await.unwrap();
    a.authenticate(Some(SECRET)).await.unwrap();
    drop(a);
    wait_until(|| h.stats().connections == 0).await;
    let r = h.key_space().refusals();
    assert_eq!(
        (
            r.bad_bytes,
            r.wrong_secret,
            r.closed_in_handshake,
            r.over_budget
        ),
        (1, 1, cap as u64, 5),
        "{r:?}"
    );
    assert_eq!(r.total(), cap as u64 + 7);
    assert_eq!(r.last_peer.map(|p| p.ip()), Some(addr.ip()));
    let told = told.lock().unwrap().clone();
    assert_eq!(told.len() as u64, r.total(), "{told:?}");
    assert!(told.iter().all(Option::is_some));
}
