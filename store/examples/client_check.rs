//! Drives every client operation against a TCPStore server and checks the
//! answers; exits non-zero on the first mismatch. Used by
//! tests/store/test_torch_client.py to run vigil's client against torch's own
//! `TCPStore(is_master=True)` server.
//!
//! usage: client_check HOST:PORT
//! Leaves `rust/from_rust` = `hello torch` in the store for the caller to read.

use std::net::SocketAddr;
use std::time::Duration;

use vigil_store::{StoreClient, StoreError};

macro_rules! check {
    ($cond:expr) => {
        if !$cond {
            return Err(format!(
                "check failed at line {}: {}",
                line!(),
                stringify!($cond)
            ));
        }
    };
}

async fn run(addr: SocketAddr) -> Result<(), String> {
    let t = Duration::from_secs(20);
    let e = |e: StoreError| e.to_string();
    let mut c = StoreClient::connect(addr, t).await.map_err(e)?;
    let mut d = StoreClient::connect(addr, t).await.map_err(e)?;
    c.ping().await.map_err(e)?;

    c.set("rust/a", b"1").await.map_err(e)?;
    check!(c.get("rust/a").await.map_err(e)? == b"1");
    check!(c.add("rust/n", 5).await.map_err(e)? == 5);
    check!(c.add("rust/n", -2).await.map_err(e)? == 3);
    check!(d.get("rust/n").await.map_err(e)? == b"3");
    check!(c.check(&["rust/a", "rust/n"]).await.map_err(e)?);
    check!(!c.check(&["rust/a", "rust/missing"]).await.map_err(e)?);

    check!(c.compare_set("rust/cs", b"", b"x").await.map_err(e)? == b"x");
    check!(c.compare_set("rust/cs2", b"e", b"x").await.map_err(e)? == b"e");
    check!(c.compare_set("rust/cs", b"x", b"y").await.map_err(e)? == b"y");
    check!(c.compare_set("rust/cs", b"no", b"z").await.map_err(e)? == b"y");

    c.append("rust/ap", b"ab").await.map_err(e)?;
    c.append("rust/ap", b"cd").await.map_err(e)?;
    check!(c.get("rust/ap").await.map_err(e)? == b"abcd");
    c.multi_set(&[("rust/m1", b"1"), ("rust/m2", b"2")])
        .await
        .map_err(e)?;
    check!(
        c.multi_get(&["rust/m2", "rust/m1"]).await.map_err(e)?
            == vec![b"2".to_vec(), b"1".to_vec()]
    );

    let before = c.num_keys().await.map_err(e)?;
    c.set("rust/tmp", b"t").await.map_err(e)?;
    check!(c.num_keys().await.map_err(e)? == before + 1);
    check!(c.delete_key("rust/tmp").await.map_err(e)?);
    check!(!c.delete_key("rust/tmp").await.map_err(e)?);
    check!(c.num_keys().await.map_err(e)? == before);
    let keys = c.list_keys().await.map_err(e)?;
    check!(keys.iter().any(|k| k == "rust/ap"));

    // Wait timeout, then the connection is still usable.
    let err = c
        .wait(&["rust/never"], Duration::from_millis(200))
        .await
        .err();
    check!(err.as_ref().is_some_and(|x| x.is_timeout()));
    check!(c.add("rust/n", 1).await.map_err(e)? == 4);

    // A wait released by another connection's set.
    let (r, ()) = tokio::join!(c.wait(&["rust/late"], t), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        d.set("rust/late", b"1").await.unwrap();
    });
    r.map_err(e)?;

    // Queues (torch's libuv server).
    c.queue_push("rust/q", b"q1").await.map_err(e)?;
    c.queue_push("rust/q", b"q2").await.map_err(e)?;
    check!(c.queue_len("rust/q").await.map_err(e)? == 2);
    check!(c.queue_pop("rust/q", true).await.map_err(e)? == b"q1");
    check!(c.queue_pop("rust/q", false).await.map_err(e)? == b"q2");
    check!(matches!(
        c.queue_pop("rust/q", false).await,
        Err(StoreError::QueueEmpty)
    ));

    // Barrier of two connections.
    let (r1, r2) = tokio::join!(c.barrier("rust/bar", 2, t), d.barrier("rust/bar", 2, t));
    r1.map_err(e)?;
    r2.map_err(e)?;

    c.set("rust/from_rust", b"hello torch").await.map_err(e)?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: client_check HOST:PORT");
        std::process::exit(2);
    };
    let addr: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(err) => {
            eprintln!("bad address {addr}: {err}");
            std::process::exit(2);
        }
    };
    match run(addr).await {
        Ok(()) => println!("client_check: all operations ok"),
        Err(msg) => {
            eprintln!("client_check: {msg}");
            std::process::exit(1);
        }
    }
}
