//! Who may use the store and how much it holds: the job's secret guards the `/vigil/` keys,
//! values and the total are bounded, and memory is given back. Real TCP on 127.0.0.1.

mod common;
use common::{raw, send, wait_until, T};

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use vigil_store::protocol::{put_bytes, put_u64, Opcode, Request, MAX_VALUE_LEN};
use vigil_store::{StoreClient, StoreError, StoreHandle, StoreServer};

const SECRET: &[u8] = b"0123456789abcdef-the-job";

async fn start(secret: Option<&[u8]>, max_total: Option<usize>) -> StoreHandle {
    let mut server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    server.set_secret(secret.map(<[u8]>::to_vec));
    if let Some(m) = max_total {
        server.set_max_total(m);
    }
    server.spawn()
}

async fn agent(addr: SocketAddr, secret: Option<&[u8]>) -> Result<StoreClient, StoreError> {
    let mut c = StoreClient::connect(addr, T).await?;
    c.authenticate(secret).await?;
    Ok(c)
}

async fn expect_closed(s: &mut TcpStream) {
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + T;
    loop {
        let n = timeout(deadline - Instant::now(), s.read(&mut buf))
            .await
            .expect("server should close the connection")
            .unwrap_or(0);
        if n == 0 {
            return;
        }
    }
}

#[tokio::test]
async fn with_a_secret_only_the_handshake_is_served_before_the_proof() {
    let h = start(Some(SECRET), None).await;
    let addr = h.local_addr();
    let mut a = agent(addr, Some(SECRET))
        .await
        .expect("the agent proves the secret");
    a.set("vigil/owner/0", b"node0").await.unwrap();
    a.set("init/x", b"1").await.unwrap();
    assert_eq!(a.get("vigil/owner/0").await.unwrap(), b"node0");

    // A torch client that did not prove the secret: VALIDATE and PING (its connect) are the
    // handshake; its first request after them, on any key, closes it.
    let mut t = StoreClient::connect(addr, T).await.unwrap();
    assert!(t.get_timeout("init/x", T).await.is_err());
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains("before the connection proved the job's secret"));
    for req in [
        Request::Sweep { prefix: Vec::new() },
        Request::Set {
            key: b"/data".to_vec(),
            value: b"evil".to_vec(),
        },
        Request::ListKeys,
    ] {
        let mut r = raw(addr).await;
        send(&mut r, req).await;
        expect_closed(&mut r).await;
    }
    assert_eq!(h.key_space().get_raw(b"/data"), None);

    // A rank's connection (authenticated, then RANK_ONLY): its own keys only, vigil's hidden.
    let mut rank = agent(addr, Some(SECRET)).await.unwrap();
    rank.rank_only().await.unwrap();
    rank.set("data", b"ok").await.unwrap();
    assert_eq!(rank.get("data").await.unwrap(), b"ok");
    let mut listed = rank.list_keys().await.unwrap();
    listed.sort();
    assert_eq!(listed, vec!["data", "init/x"]);
    assert_eq!(rank.num_keys().await.unwrap(), 2);
    assert!(rank.get_timeout("vigil/owner/0", T).await.is_err());
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains("from a rank's connection"));
    for forbidden in ["sweep", "renew"] {
        let mut rank = agent(addr, Some(SECRET)).await.unwrap();
        rank.rank_only().await.unwrap();
        let r = match forbidden {
            "sweep" => rank.sweep("").await.map(|_| ()),
            _ => {
                let _ = rank.renew("vigil/alive/0").await;
                rank.ping().await.map(|_| ())
            }
        };
        assert!(
            r.is_err(),
            "{forbidden} from a rank's connection was served"
        );
    }
    // The agent sees everything.
    assert_eq!(a.num_keys().await.unwrap(), 3);
}

#[tokio::test]
async fn a_wrong_or_missing_secret_is_refused_with_a_clear_error() {
    let h = start(Some(SECRET), None).await;
    let addr = h.local_addr();
    match agent(addr, Some(b"another-secret-of-16")).await {
        Err(StoreError::Auth(why)) => assert!(why.contains("VIGIL_STORE_SECRET"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    match agent(addr, None).await {
        Err(StoreError::Auth(why)) => assert!(why.contains("requires a secret"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    // A proof without a challenge, or garbage after the challenge, closes the connection.
    let mut r = raw(addr).await;
    send(&mut r, Request::AuthProof { proof: [0; 32] }).await;
    expect_closed(&mut r).await;
}

#[tokio::test]
async fn without_a_secret_every_connection_is_trusted() {
    let h = start(None, None).await;
    let mut a = agent(h.local_addr(), Some(SECRET)).await.unwrap();
    a.set("vigil/x", b"1").await.unwrap();
    let mut t = StoreClient::connect(h.local_addr(), T).await.unwrap();
    assert_eq!(t.list_keys().await.unwrap(), vec!["vigil/x"]);
}

#[tokio::test]
async fn a_huge_length_closes_the_connection_before_anything_is_buffered() {
    let h = start(None, None).await;
    for n in [u64::MAX, 1 << 63, MAX_VALUE_LEN + 1] {
        let mut r = raw(h.local_addr()).await;
        let mut b = vec![Opcode::Set as u8];
        put_bytes(&mut b, b"/k");
        put_u64(&mut b, n);
        r.write_all(&b).await.unwrap();
        expect_closed(&mut r).await;
    }
    assert_eq!(h.stats().dropped_for_protocol_errors, 3);
    assert_eq!(h.stats().buffered_bytes, 0);
}

#[tokio::test]
async fn the_total_is_bounded_and_deleting_gives_it_back() {
    let max = 40 << 20;
    let h = start(None, Some(max)).await;
    let mut c = StoreClient::connect(h.local_addr(), T).await.unwrap();
    let v = vec![7u8; 8 << 20];
    for i in 0..4 {
        c.set(&format!("v{i}"), &v).await.unwrap();
    }
    c.ping().await.unwrap();
    let stored = h.stats().stored_bytes;
    assert!(stored >= 32 << 20 && stored < max, "{stored}");
    // The fifth does not fit: that connection is closed, nothing is stored.
    let mut r = raw(h.local_addr()).await;
    send(
        &mut r,
        Request::Set {
            key: b"/v4".to_vec(),
            value: v.clone(),
        },
    )
    .await;
    expect_closed(&mut r).await;
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains("full"));
    assert_eq!(h.key_space().get_raw(b"/v4"), None);
    assert_eq!(h.stats().stored_bytes, stored);
    for i in 0..4 {
        assert!(c.delete_key(&format!("v{i}")).await.unwrap());
    }
    assert_eq!(h.stats().stored_bytes, 0);
    c.set("v4", &v).await.unwrap();
    c.ping().await.unwrap();
    assert!(h.stats().stored_bytes > 8 << 20);
    drop(c);
    wait_until(|| h.stats().connections == 0).await;
    assert_eq!(
        h.stats().buffered_bytes,
        0,
        "buffers are uncharged on close"
    );
    h.reset();
    assert_eq!(h.stats().stored_bytes, 0);
}

#[tokio::test]
async fn a_client_that_never_reads_cannot_pile_up_replies() {
    let max = 64 << 20;
    let h = start(None, Some(max)).await;
    let mut c = StoreClient::connect(h.local_addr(), T).await.unwrap();
    c.set("big", &vec![1u8; 4 << 20]).await.unwrap();
    // A thousand pipelined GETs of 4 MiB (4 GB of replies), never read.
    let mut r = raw(h.local_addr()).await;
    let mut b = Vec::new();
    for _ in 0..1000 {
        Request::Get {
            key: b"/big".to_vec(),
        }
        .encode(&mut b);
    }
    r.write_all(&b).await.unwrap();
    // The server writes until the socket is full, then waits: what it holds stays bounded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = h.stats();
    assert!(s.buffered_bytes <= 16 << 20, "{s:?}");
    // It still serves everybody else.
    assert_eq!(c.get("big").await.unwrap().len(), 4 << 20);
    // A MULTI_GET asking for far too much is refused.
    let mut m = raw(h.local_addr()).await;
    send(
        &mut m,
        Request::MultiGet {
            keys: vec![b"/big".to_vec(); 100],
        },
    )
    .await;
    expect_closed(&mut m).await;
    assert!(h
        .key_space()
        .last_protocol_error()
        .unwrap()
        .contains("reply"));
}
