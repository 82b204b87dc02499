//! The core without a socket: every family driven through [`Core::apply`], as the shell does.

use std::time::Instant;

use proptest::prelude::*;

use super::*;
use crate::auth;
use crate::protocol::{Request, VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP_WAITING};

const SECRET: &[u8] = b"0123456789abcdef-the-job";
const NONCE: [u8; auth::NONCE_LEN] = [7; auth::NONCE_LEN];

fn core(secret: Option<&[u8]>) -> Core {
    let mut c = Core::new(Limits::default());
    c.set_secret(secret.map(std::sync::Arc::from));
    c
}

fn open(c: &mut Core) -> Session {
    c.open(Instant::now(), NONCE).0
}

/// Applies `req`; the reply bytes, or why the connection ends.
fn call(c: &mut Core, s: &mut Session, req: Request) -> Result<Vec<u8>, End> {
    let mut out = Vec::new();
    let mut fx = Effects::default();
    c.apply(s, req, &mut out, &mut fx).map(|()| out)
}

fn validate() -> Request {
    Request::Validate {
        magic: VALIDATION_MAGIC,
    }
}

/// A session that proved the secret (or, without one, validated).
fn agent(c: &mut Core) -> Session {
    let mut s = open(c);
    call(c, &mut s, validate()).unwrap();
    call(c, &mut s, Request::AuthChallenge).unwrap();
    let proof = auth::proof(SECRET, &NONCE);
    assert_eq!(call(c, &mut s, Request::AuthProof { proof }).unwrap(), [1]);
    assert_eq!(s.role(), Role::Agent);
    s
}

fn set(key: &[u8], value: &[u8]) -> Request {
    Request::Set {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

fn wait(key: &[u8]) -> Request {
    Request::Wait {
        keys: vec![key.to_vec()],
    }
}

#[test]
fn before_the_proof_only_the_handshake_is_served() {
    let mut c = core(Some(SECRET));
    let mut s = open(&mut c);
    call(&mut c, &mut s, validate()).unwrap();
    assert_eq!(
        call(&mut c, &mut s, Request::Ping { nonce: 5 }).unwrap(),
        5u32.to_le_bytes()
    );
    let challenge = call(&mut c, &mut s, Request::AuthChallenge).unwrap();
    assert_eq!(challenge[0], 1, "the store says it requires the secret");
    assert_eq!(&challenge[1..], &NONCE);
    for req in [
        Request::Sweep { prefix: Vec::new() },
        set(b"/init/x", b"1"),
        Request::Get {
            key: b"/init/x".to_vec(),
        },
        wait(b"/k"),
        Request::ListKeys,
        Request::RankOnly,
        Request::Tagged {
            tag: 1,
            inner: Box::new(Request::WaitGet {
                key: b"/k".to_vec(),
            }),
        },
    ] {
        let mut s = open(&mut c);
        call(&mut c, &mut s, validate()).unwrap();
        let e = call(&mut c, &mut s, req).unwrap_err();
        assert!(matches!(e, End::NotAuthenticated(_)), "{e}");
    }
    assert_eq!(c.usage().keys, 0);
    assert_eq!(c.usage().waits, 0);
}

#[test]
fn a_wrong_proof_is_answered_0_and_ends_the_connection() {
    let mut c = core(Some(SECRET));
    let mut s = open(&mut c);
    call(&mut c, &mut s, validate()).unwrap();
    let mut out = Vec::new();
    let mut fx = Effects::default();
    let proof = auth::proof(b"another-secret-of-16", &NONCE);
    assert_eq!(
        c.apply(&mut s, Request::AuthChallenge, &mut out, &mut fx),
        Ok(())
    );
    out.clear();
    let e = c.apply(&mut s, Request::AuthProof { proof }, &mut out, &mut fx);
    assert_eq!((e, out), (Err(End::AuthFailed), vec![0]));
    // A proof without a challenge.
    let mut s = open(&mut c);
    call(&mut c, &mut s, validate()).unwrap();
    let proof = auth::proof(SECRET, &NONCE);
    assert_eq!(
        call(&mut c, &mut s, Request::AuthProof { proof }),
        Err(End::AuthOutOfOrder)
    );
}

#[test]
fn without_a_secret_validate_admits_as_torch_does() {
    let mut c = core(None);
    let mut s = open(&mut c);
    assert_eq!(
        call(&mut c, &mut s, set(b"/k", b"v")),
        Err(End::NotAuthenticated("opcode 1".into()))
    );
    let mut s = open(&mut c);
    call(&mut c, &mut s, validate()).unwrap();
    assert_eq!(s.role(), Role::Agent);
    call(&mut c, &mut s, set(b"/vigil/k", b"v")).unwrap();
    assert_eq!(c.get_raw(b"/vigil/k"), Some(&b"v"[..]));
}

#[test]
fn a_ranks_connection_uses_torchs_operations_on_its_own_keys_only() {
    let mut c = core(Some(SECRET));
    let mut a = agent(&mut c);
    call(&mut c, &mut a, set(b"/vigil/alive/0", b"1")).unwrap();
    let mut r = agent(&mut c);
    call(&mut c, &mut r, Request::RankOnly).unwrap();
    assert_eq!(r.role(), Role::Rank);
    call(&mut c, &mut r, set(b"/init/x", b"1")).unwrap();
    call(&mut c, &mut r, validate()).unwrap();
    let listed = call(&mut c, &mut r, Request::ListKeys).unwrap();
    assert!(!listed.windows(6).any(|w| w == b"/vigil"));
    assert_eq!(
        call(&mut c, &mut r, Request::GetNumKeys).unwrap(),
        1i64.to_le_bytes()
    );
    assert_eq!(
        call(&mut c, &mut a, Request::GetNumKeys).unwrap(),
        2i64.to_le_bytes()
    );
    for req in [
        Request::Sweep {
            prefix: b"/".to_vec(),
        },
        Request::Renew {
            key: b"/x".to_vec(),
        },
        Request::Get {
            key: b"/vigil/alive/0".to_vec(),
        },
        Request::RankOnly,
        Request::Join {
            key: b"/a".to_vec(),
            value: Vec::new(),
            counter: b"/n".to_vec(),
        },
        Request::ClearExcept {
            prefix: b"/x".to_vec(),
        },
        Request::ClearPrefix {
            prefix: b"/x".to_vec(),
        },
    ] {
        let mut r = agent(&mut c);
        call(&mut c, &mut r, Request::RankOnly).unwrap();
        assert_eq!(call(&mut c, &mut r, req), Err(End::Unauthorized));
    }
}

#[test]
fn the_oldest_handshake_is_evicted_past_the_cap_and_an_admitted_one_never() {
    let mut c = core(Some(SECRET));
    c.set_limits(Limits {
        max_in_handshake: 2,
        ..Limits::default()
    });
    let a = agent(&mut c);
    let (s1, fx) = c.open(Instant::now(), NONCE);
    assert_eq!(fx.evict, None);
    let (_s2, fx) = c.open(Instant::now(), NONCE);
    assert_eq!(fx.evict, None);
    let (_s3, fx) = c.open(Instant::now(), NONCE);
    assert_eq!(fx.evict, Some(s1.id()));
    assert_ne!(fx.evict, Some(a.id()));
    assert_eq!(c.usage().in_handshake, 2);
    c.close(s1, true);
    assert_eq!(c.usage().in_handshake, 2);
}

#[test]
fn the_handshake_has_a_deadline_a_byte_budget_and_a_request_budget() {
    let mut c = core(Some(SECRET));
    let t0 = Instant::now();
    let (mut s, _) = c.open(t0, NONCE);
    assert_eq!(c.deadline(&s), Some(t0 + gate::HANDSHAKE_TIMEOUT));
    assert_eq!(s.read_budget(), gate::HANDSHAKE_BYTES);
    call(&mut c, &mut s, validate()).unwrap();
    for _ in 1..gate::HANDSHAKE_REQUESTS {
        call(&mut c, &mut s, Request::Ping { nonce: 1 }).unwrap();
    }
    assert!(matches!(
        call(&mut c, &mut s, Request::Ping { nonce: 1 }),
        Err(End::HandshakeBudget(_))
    ));
    let a = agent(&mut c);
    assert_eq!(c.deadline(&a), None);
    assert_eq!(a.read_budget(), usize::MAX);
}

#[test]
fn a_write_wakes_the_wait_of_another_connection_and_cancel_after_release_answers_both() {
    let mut c = core(None);
    let mut w = agent(&mut c);
    let mut s = agent(&mut c);
    assert_eq!(call(&mut c, &mut w, wait(b"/k")).unwrap(), b"");
    assert!(w.parked());
    let mut fx = Effects::default();
    c.apply(&mut s, set(b"/k", b"v"), &mut Vec::new(), &mut fx)
        .unwrap();
    assert_eq!(fx.wakes.len(), 1);
    assert_eq!(fx.wakes[0].0, w.id());
    // The cancel comes before the wake-up reached the connection: both answers, in order.
    assert_eq!(
        call(&mut c, &mut w, Request::CancelWait).unwrap(),
        [WAIT_STOP_WAITING, WAIT_CANCELED]
    );
    let mut out = Vec::new();
    c.woken(&mut w, fx.wakes[0].1, &mut out);
    assert!(out.is_empty(), "a stale wake-up is ignored");
    assert_eq!(c.usage().parked_bytes, 0);
}

#[test]
fn parked_waits_count_against_the_total_and_a_closed_connection_gives_them_back() {
    let mut c = core(None);
    c.set_limits(Limits {
        max_total: 1 << 20,
        ..Limits::default()
    });
    let mut s = agent(&mut c);
    let key = vec![b'k'; 60 << 10];
    let mut parked = 0;
    let end = loop {
        let req = Request::Tagged {
            tag: parked,
            inner: Box::new(Request::WaitGet { key: key.clone() }),
        };
        match call(&mut c, &mut s, req) {
            Ok(_) => parked += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(end, End::Full(1 << 20));
    // 60 KiB keys, each held twice: 8 fit in 1 MiB.
    assert_eq!(parked, 8);
    assert!(c.usage().parked_bytes <= 1 << 20);
    c.close(s, true);
    assert_eq!((c.usage().parked_bytes, c.usage().waits), (0, 0));
}

#[test]
fn a_lease_is_deleted_and_reported_when_its_connection_ends() {
    let mut c = core(None);
    let mut a = agent(&mut c);
    let mut b = agent(&mut c);
    call(&mut c, &mut a, set(b"/vigil/lease/node/0", b"a")).unwrap();
    call(&mut c, &mut a, set(b"/vigil/lease/node/1", b"a")).unwrap();
    call(&mut c, &mut b, set(b"/vigil/lease/node/1", b"b")).unwrap();
    let fx = c.close(a, true);
    assert_eq!(
        fx.leases,
        vec![
            LeaseEvent::Lost {
                key: "node/0".into(),
                value: b"a".to_vec()
            },
            LeaseEvent::Released {
                key: "node/1".into()
            },
        ]
    );
    assert_eq!(c.get_raw(b"/vigil/lease/node/1"), Some(&b"b"[..]));
    // The server's shutdown settles nothing.
    assert!(c.close(b, false).leases.is_empty());
    assert!(c.get_raw(b"/vigil/lease/node/1").is_some());
}

#[test]
fn clear_except_and_clear_prefix_delete_keys_and_queues_and_answer_the_count() {
    let mut c = core(Some(SECRET));
    let mut a = agent(&mut c);
    for k in [
        &b"/vigil/a"[..],
        b"/vigil/lease/n",
        b"/init/x",
        b"/pg/1",
        b"/pg/2",
    ] {
        call(&mut c, &mut a, set(k, b"v")).unwrap();
    }
    let push = Request::QueuePush {
        key: b"/q".to_vec(),
        value: b"e".to_vec(),
    };
    call(&mut c, &mut a, push).unwrap();
    let clear = |prefix: &[u8]| Request::ClearPrefix {
        prefix: prefix.to_vec(),
    };
    assert_eq!(
        call(&mut c, &mut a, clear(b"/pg/")).unwrap(),
        2i64.to_le_bytes()
    );
    assert_eq!(
        call(&mut c, &mut a, clear(b"/pg/")).unwrap(),
        0i64.to_le_bytes()
    );
    let except = Request::ClearExcept {
        prefix: b"/vigil/".to_vec(),
    };
    // /init/x and the queue /q go; vigil's keys stay, the lease with its owner.
    assert_eq!(call(&mut c, &mut a, except).unwrap(), 2i64.to_le_bytes());
    assert_eq!(
        c.keys_raw(),
        vec![b"/vigil/a".to_vec(), b"/vigil/lease/n".to_vec()]
    );
    assert_eq!(c.usage().queues, 0);
    assert_eq!(c.stored, recount(&c));
    // Tagged, as the agents send it.
    let tagged = Request::Tagged {
        tag: 9,
        inner: Box::new(clear(b"/vigil/a")),
    };
    let out = call(&mut c, &mut a, tagged).unwrap();
    assert_eq!(&out[..4], &9u32.to_le_bytes());
    assert_eq!(&out[12..], &1i64.to_le_bytes());
    // Before the proof: refused like any other operation.
    let mut stranger = open(&mut c);
    call(&mut c, &mut stranger, validate()).unwrap();
    assert!(matches!(
        call(&mut c, &mut stranger, clear(b"/")),
        Err(End::NotAuthenticated(_))
    ));
    assert!(c.get_raw(b"/vigil/lease/n").is_some());
}

fn pop(c: &mut Core, s: &mut Session, key: &[u8]) -> Option<Vec<u8>> {
    let out = call(c, s, Request::QueuePop { key: key.to_vec() }).unwrap();
    let n = i64::from_le_bytes(out[..8].try_into().unwrap());
    (n > 0).then(|| out[16..].to_vec())
}

#[test]
fn lost_leases_go_to_the_lease_queue_only_when_asked() {
    // Off by default: the agent-hosted store is unchanged.
    let mut c = core(None);
    let mut a = agent(&mut c);
    call(&mut c, &mut a, set(b"/vigil/lease/node/0", b"x")).unwrap();
    c.close(a, true);
    assert_eq!(c.usage().queues, 0);

    let mut c = core(None);
    c.set_lease_queue(true);
    let mut watcher = agent(&mut c);
    // A tagged WAIT on the queue parks until an event comes.
    let w = Request::Tagged {
        tag: 3,
        inner: Box::new(wait(LEASE_QUEUE)),
    };
    assert!(call(&mut c, &mut watcher, w).unwrap().is_empty());
    let mut a = agent(&mut c);
    let mut b = agent(&mut c);
    call(&mut c, &mut a, set(b"/vigil/lease/node/0", b"host \"a\"")).unwrap();
    call(&mut c, &mut b, set(b"/vigil/lease/node/1", b"b")).unwrap();
    call(&mut c, &mut b, set(b"/vigil/lease/node/2", b"gone")).unwrap();
    call(
        &mut c,
        &mut b,
        Request::DeleteKey {
            key: b"/vigil/lease/node/2".to_vec(),
        },
    )
    .unwrap();
    let fx = c.close(a, true);
    assert_eq!(fx.wakes.len(), 1);
    assert_eq!(fx.wakes[0].0, watcher.id());
    let mut out = Vec::new();
    c.woken(&mut watcher, fx.wakes[0].1, &mut out);
    assert_eq!(&out[12..], [WAIT_STOP_WAITING]);
    let fx = c.close(b, true);
    assert!(fx.wakes.is_empty());
    assert_eq!(c.stored, recount(&c));
    // In order, Released events not queued.
    let mut p = agent(&mut c);
    assert_eq!(
        pop(&mut c, &mut p, LEASE_QUEUE).unwrap(),
        br#"{"lost": "node/0", "value": "host \"a\""}"#.to_vec()
    );
    assert_eq!(
        pop(&mut c, &mut p, LEASE_QUEUE).unwrap(),
        br#"{"lost": "node/1", "value": "b"}"#.to_vec()
    );
    assert_eq!(pop(&mut c, &mut p, LEASE_QUEUE), None);
    assert_eq!(c.stored, recount(&c));
}

/// With the lease queue on, a lost lease is also recorded at `/vigil/lease_lost/<name>`: a
/// WAIT_GET parked there (the agents on their coordinator's lease) is answered with its last value.
#[test]
fn a_lost_lease_is_recorded_where_a_wait_can_park_on_it() {
    let mut c = core(None);
    c.set_lease_queue(true);
    let mut watcher = agent(&mut c);
    let w = Request::Tagged {
        tag: 9,
        inner: Box::new(Request::WaitGet {
            key: b"/vigil/lease_lost/coord".to_vec(),
        }),
    };
    assert!(call(&mut c, &mut watcher, w).unwrap().is_empty());
    let mut coord = agent(&mut c);
    call(&mut c, &mut coord, set(b"/vigil/lease/coord", b"0")).unwrap();
    let fx = c.close(coord, true);
    assert_eq!(fx.wakes.len(), 1);
    assert_eq!(fx.wakes[0].0, watcher.id());
    let mut out = Vec::new();
    c.woken(&mut watcher, fx.wakes[0].1, &mut out);
    // Frame: tag, length, then the value as GET answers it (u64 length + bytes).
    assert_eq!(&out[12..], [&1u64.to_le_bytes()[..], b"0"].concat());
    assert_eq!(c.get_raw(b"/vigil/lease_lost/coord"), Some(&b"0"[..]));
    assert_eq!(c.get_raw(b"/vigil/lease/coord"), None);
    // Off (the agent-hosted store): nothing is recorded.
    let mut c = core(None);
    let mut coord = agent(&mut c);
    call(&mut c, &mut coord, set(b"/vigil/lease/coord", b"0")).unwrap();
    c.close(coord, true);
    assert_eq!(c.get_raw(b"/vigil/lease_lost/coord"), None);
}

#[test]
fn the_lease_queue_keeps_the_newest_events_within_its_bound_and_the_total() {
    let mut c = core(None);
    c.set_lease_queue(true);
    for i in 0..LEASE_QUEUE_MAX + 5 {
        let mut a = agent(&mut c);
        call(
            &mut c,
            &mut a,
            set(format!("/vigil/lease/n/{i}").as_bytes(), b"v"),
        )
        .unwrap();
        c.close(a, true);
    }
    assert_eq!(c.queues[LEASE_QUEUE].len(), LEASE_QUEUE_MAX);
    assert_eq!(c.stored, recount(&c));
    let mut p = agent(&mut c);
    let first = pop(&mut c, &mut p, LEASE_QUEUE).unwrap();
    assert_eq!(first, lease_event_json("n/5", b"v"));

    // A store too full for one more event drops it, and stays within its total.
    let mut c = Core::new(Limits {
        max_total: 400,
        ..Limits::default()
    });
    c.set_lease_queue(true);
    let mut a = agent_open(&mut c);
    call(&mut c, &mut a, set(b"/vigil/lease/big", &[b'x'; 200])).unwrap();
    call(&mut c, &mut a, set(b"/k", &[b'y'; 40])).unwrap();
    c.close(a, true);
    assert_eq!(c.usage().queues, 0);
    assert!(c.stored <= 400);
    assert_eq!(c.stored, recount(&c));
}

/// An agent on a store without a secret.
fn agent_open(c: &mut Core) -> Session {
    let mut s = open(c);
    call(c, &mut s, validate()).unwrap();
    s
}

#[test]
fn a_sweep_names_the_counters_not_renewed_since_the_last_one() {
    let mut c = core(None);
    let mut a = agent(&mut c);
    let mut fx = Effects::default();
    for k in [&b"/vigil/alive/0"[..], b"/vigil/alive/1"] {
        c.apply(
            &mut a,
            Request::Renew { key: k.to_vec() },
            &mut Vec::new(),
            &mut fx,
        )
        .unwrap();
    }
    assert!(c.sweep(b"/vigil/alive/").is_empty());
    c.apply(
        &mut a,
        Request::Renew {
            key: b"/vigil/alive/0".to_vec(),
        },
        &mut Vec::new(),
        &mut fx,
    )
    .unwrap();
    assert_eq!(c.sweep(b"/vigil/alive/"), vec![b"/vigil/alive/1".to_vec()]);
}

/// One request of a random workload: small keys, so that requests meet.
fn request() -> impl Strategy<Value = Request> {
    let key = prop::sample::select(vec![
        b"/a".to_vec(),
        b"/b".to_vec(),
        b"/vigil/lease/x".to_vec(),
        b"/vigil/c".to_vec(),
        LEASE_QUEUE.to_vec(),
    ]);
    let value = prop::collection::vec(any::<u8>(), 0..16);
    prop_oneof![
        (key.clone(), value.clone()).prop_map(|(key, value)| Request::Set { key, value }),
        key.clone().prop_map(|key| Request::Get { key }),
        key.clone().prop_map(|key| Request::DeleteKey { key }),
        (key.clone(), -3i64..3).prop_map(|(key, delta)| Request::Add { key, delta }),
        (key.clone(), value.clone()).prop_map(|(key, value)| Request::Append { key, value }),
        (key.clone(), value.clone()).prop_map(|(key, value)| Request::QueuePush { key, value }),
        key.clone().prop_map(|key| Request::QueuePop { key }),
        key.clone().prop_map(|k| Request::Wait { keys: vec![k] }),
        Just(Request::CancelWait),
        (0u32..4, key.clone()).prop_map(|(tag, key)| Request::Tagged {
            tag,
            inner: Box::new(Request::WaitGet { key })
        }),
        (0u32..4).prop_map(|tag| Request::Tagged {
            tag,
            inner: Box::new(Request::CancelWait)
        }),
        key.clone().prop_map(|prefix| Request::Sweep { prefix }),
        key.clone()
            .prop_map(|prefix| Request::ClearExcept { prefix }),
        key.clone()
            .prop_map(|prefix| Request::ClearPrefix { prefix }),
        Just(Request::ListKeys),
        Just(Request::RankOnly),
        Just(Request::AuthChallenge),
        Just(validate()),
    ]
}

/// Stored bytes as the core should count them.
fn recount(c: &Core) -> usize {
    let kv: usize = c.kv.iter().map(|(k, v)| kv::entry_size(k, v)).sum();
    let q: usize = c
        .queues
        .iter()
        .map(|(k, q)| q.iter().map(|v| kv::entry_size(k, v)).sum::<usize>())
        .sum();
    kv + q
}

proptest! {
    /// Whatever connections send, in any order: nothing from a connection that did not prove
    /// the secret changes the key space, the accounting stays exact, and once every connection
    /// ends nothing is parked or charged.
    #[test]
    fn any_workload_keeps_the_books_and_strangers_change_nothing(
        script in prop::collection::vec((0usize..4, request()), 0..80),
    ) {
        let mut c = core(Some(SECRET));
        c.set_lease_queue(true);
        let mut sessions: Vec<Option<Session>> = vec![
            Some(agent(&mut c)),
            Some(agent(&mut c)),
            Some(open(&mut c)),
            Some(open(&mut c)),
        ];
        for (who, req) in script {
            let Some(s) = sessions[who].as_mut() else { continue };
            let stranger = s.role() == Role::Handshake;
            let before = (c.keys_raw(), c.usage().queues);
            let mut out = Vec::new();
            let mut fx = Effects::default();
            let r = c.apply(s, req, &mut out, &mut fx);
            if stranger {
                prop_assert_eq!(&before, &(c.keys_raw(), c.usage().queues));
                prop_assert!(fx.wakes.is_empty());
            }
            for (conn, id) in fx.wakes {
                if let Some(w) = sessions.iter_mut().flatten().find(|w| w.id() == conn) {
                    c.woken(w, id, &mut Vec::new());
                }
            }
            if r.is_err() {
                let s = sessions[who].take().unwrap();
                c.close(s, true);
            }
            prop_assert_eq!(c.stored, recount(&c));
        }
        for s in sessions.into_iter().flatten() {
            c.close(s, true);
        }
        let u = c.usage();
        prop_assert_eq!((u.waits, u.parked_bytes, u.buffered_bytes, u.in_handshake), (0, 0, 0, 0));
    }
}

#[test]
fn prefix_counts_and_entries_see_only_their_prefix() {
    let mut c = Core::default();
    for (k, v) in [
        (&b"/vigil/lease/1"[..], &b"a"[..]),
        (b"/vigil/lease/0", b"b"),
        (b"/vigil/lease_lost/2", b"c"),
        (b"/init/x", b"d"),
    ] {
        c.set_raw(k, v);
    }
    assert_eq!(c.count_prefix(b"/vigil/lease/"), 2);
    assert_eq!(c.count_prefix(b"/vigil/lease"), 3);
    assert_eq!(c.count_prefix(b"/nothing/"), 0);
    assert_eq!(
        c.entries_prefix(b"/vigil/lease/"),
        vec![
            (b"/vigil/lease/0".to_vec(), b"b".to_vec()),
            (b"/vigil/lease/1".to_vec(), b"a".to_vec())
        ]
    );
}
