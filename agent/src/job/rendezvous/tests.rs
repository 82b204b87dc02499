//! The rendezvous over the real store and real TCP, two agents in one process: what an agent
//! holds on the store across attempts.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use vigil_store::KeySpace;

use super::{run, CoordConfig, FromCoord, HeadSide};
use crate::supervise::{Event, JobEnd, JobRequest};

const T: Duration = Duration::from_secs(30);

fn coord(node_rank: u32, store: std::net::SocketAddr) -> CoordConfig {
    CoordConfig {
        nnodes: 2,
        active: 2,
        topology: None,
        segment: None,
        node_rank,
        nproc: 1,
        store,
        join_timeout: T,
        join_note_every: T,
        last_call: T,
        peer_timeout: T,
        host: format!("test{node_rank}"),
        max_restarts: 3,
        secret: None,
        job: None,
        outside: false,
        in_process: false,
    }
}

/// Runs `f` as the agent runs its coordination: a current-thread runtime with a `LocalSet`.
fn on_agent_runtime(f: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, f);
}

struct Agent {
    tx: mpsc::UnboundedSender<JobRequest>,
    rx: mpsc::UnboundedReceiver<FromCoord>,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    fn spawn(cfg: CoordConfig, head: Option<HeadSide>) -> Agent {
        let (tx, req_rx) = mpsc::unbounded_channel();
        let (ev_tx, rx) = mpsc::unbounded_channel();
        let task = tokio::task::spawn_local(run(cfg, head, req_rx, ev_tx));
        Agent { tx, rx, task }
    }

    fn join(&self, attempt: u32) {
        self.tx
            .send(JobRequest::Join {
                attempt,
                calculated: None,
            })
            .unwrap();
    }

    /// The next message that is not for node rank 0's console alone.
    async fn next(&mut self) -> FromCoord {
        loop {
            let m = tokio::time::timeout(T, self.rx.recv())
                .await
                .expect("the coordinator answers")
                .expect("the coordinator runs");
            if !matches!(
                m,
                FromCoord::Hosts { .. } | FromCoord::Note(_) | FromCoord::Promoted { .. }
            ) {
                return m;
            }
        }
    }
}

async fn until(keys: &KeySpace, what: &str, f: impl Fn(vigil_store::StoreStats) -> bool) {
    let deadline = Instant::now() + T;
    while !f(keys.stats()) {
        assert!(
            Instant::now() < deadline,
            "{what}: the store has {:?}",
            keys.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Each agent holds one connection to the store, the same one through a failed attempt and the
/// next (before: a control, a waiter and a liveness connection each, plus one per attempt for the
/// stop waiter); the waits of the attempt left behind are cancelled, not left parked. Parked
/// now, per agent: attempt 1's end, its stop trigger and its next hang verdict's request;
/// attempt 0's are gone.
#[test]
fn an_agent_holds_one_connection_to_the_store_across_attempts() {
    holds_one_connection_across_attempts(false, 6);
}

/// With in-process restarts on (issue 32), each agent also parks on attempt 1's next in-process
/// generation; with them off, it does not (`an_agent_holds_one_connection_...` above).
#[test]
fn with_in_process_restarts_an_agent_also_parks_on_the_next_generation() {
    holds_one_connection_across_attempts(true, 8);
}

/// Two agents join attempt 0, fail it and join attempt 1; then the store holds `parked` waits and
/// still two connections.
fn holds_one_connection_across_attempts(in_process: bool, parked: usize) {
    on_agent_runtime(async {
        let (addr, keys, leases) =
            crate::run::host_store("127.0.0.1:0".parse().unwrap(), T, None).expect("store up");
        let head = HeadSide::Local {
            keys: keys.clone(),
            leases,
        };
        let cfg = |node_rank| CoordConfig {
            in_process,
            ..coord(node_rank, addr)
        };
        let mut agents = [Agent::spawn(cfg(0), Some(head)), Agent::spawn(cfg(1), None)];
        for a in &agents {
            a.join(0);
        }
        for a in agents.iter_mut() {
            let m = a.next().await;
            assert!(
                matches!(m, FromCoord::Event(Event::Joined { attempt: 0, .. })),
                "{m:?}"
            );
        }
        assert_eq!(keys.stats().connections, 2, "attempt 0");
        agents[1]
            .tx
            .send(JobRequest::ReportEnd {
                attempt: 0,
                end: JobEnd::Failed {
                    node: 1,
                    reason: "test".into(),
                },
            })
            .unwrap();
        for a in agents.iter_mut() {
            let m = a.next().await;
            assert!(
                matches!(m, FromCoord::Event(Event::AttemptEnded { attempt: 0, .. })),
                "{m:?}"
            );
            a.join(1);
        }
        for a in agents.iter_mut() {
            let m = a.next().await;
            assert!(
                matches!(m, FromCoord::Event(Event::Joined { attempt: 1, .. })),
                "{m:?}"
            );
        }
        // Every waiter the join spawned has sent its wait once each agent's next request went
        // through the store: sharing the attempt's timeouts (whose own wait ends once all
        // shared).
        for a in &agents {
            a.tx.send(JobRequest::ShareTimeouts {
                attempt: 1,
                round: 0,
                timeouts: Default::default(),
            })
            .unwrap();
        }
        for a in agents.iter_mut() {
            let m = a.next().await;
            assert!(
                matches!(m, FromCoord::Event(Event::JobTimeouts { attempt: 1, .. })),
                "{m:?}"
            );
        }
        until(&keys, &format!("{parked} waits parked"), |s| {
            s.pending_waits == parked
        })
        .await;
        let s = keys.stats();
        assert_eq!(s.connections, 2, "attempt 1: {s:?}");
        assert_eq!(s.dropped_for_protocol_errors, 0, "{s:?}");
        for a in &agents {
            a.tx.send(JobRequest::Leave {
                poison: None,
                highest_step: None,
            })
            .unwrap();
        }
        for a in agents {
            tokio::time::timeout(T, a.task)
                .await
                .expect("each agent leaves")
                .unwrap();
        }
    });
}

/// FAKE of a node rank 0 of vigil before PROTOCOL 3 (its store knows no tagged request and
/// drops a connection that sends one), on a real socket: answers a connection's plain requests
/// with `job` as the job's shape, and records whether a tagged request arrived.
async fn old_store_fake(listener: tokio::net::TcpListener, job: Vec<u8>) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use vigil_store::protocol::{parse_request, put_bytes, Parsed, Request};
    let (mut s, _) = listener.accept().await.unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return false;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Parsed::Complete(req, used)) = parse_request(&buf) {
            buf.drain(..used);
            let mut out = Vec::new();
            match req {
                Request::Validate { .. } => {}
                Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
                Request::AuthChallenge => {
                    out.push(0);
                    out.extend_from_slice(&[7; 32]);
                }
                Request::Wait { .. } => out.push(0),
                Request::Get { .. } => put_bytes(&mut out, &job),
                // What an old store does with a request it does not know: hang up.
                _ => return true,
            }
            s.write_all(&out).await.unwrap();
        }
    }
}

#[test]
fn a_new_agent_is_refused_by_an_old_node_rank_0_in_one_line_not_lost() {
    on_agent_runtime(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = coord(1, listener.local_addr().unwrap());
        let old = super::wire::JobShape {
            protocol: 2,
            ..cfg.shape()
        };
        let fake = tokio::task::spawn_local(old_store_fake(listener, super::wire::to_json(&old)));
        let mut a = Agent::spawn(cfg, None);
        match a.next().await {
            FromCoord::Event(Event::CoordinationLost { reason, requeue }) => {
                assert!(!requeue, "{reason}");
                assert!(reason.contains("protocol 2"), "{reason}");
                assert!(!reason.contains('\n'), "{reason}");
            }
            m => panic!("{m:?}"),
        }
        a.tx.send(JobRequest::Leave {
            poison: None,
            highest_step: None,
        })
        .ok();
        a.task.await.unwrap();
        assert!(
            !fake.await.unwrap(),
            "a tagged request reached the old store"
        );
    });
}

/// Field finding 35: while a rendezvous waits, node rank 0 says which node ranks have not joined
/// and what it knows of them: node 1's agent took its node rank (its owner record) and froze
/// before joining, node 2's drew a c10d ticket and no more, node 3's never reached the store.
#[test]
fn node_rank_0_names_who_a_rendezvous_waits_for_and_their_hosts() {
    on_agent_runtime(async {
        let (addr, keys, leases) =
            crate::run::host_store("127.0.0.1:0".parse().unwrap(), T, None).expect("store up");
        let head = HeadSide::Local {
            keys: keys.clone(),
            leases,
        };
        let shaped = |node_rank| CoordConfig {
            nnodes: 4,
            active: 4,
            join_note_every: Duration::from_millis(20),
            ..coord(node_rank, addr)
        };
        let mut head = Agent::spawn(shaped(0), Some(head));
        head.join(0);
        // Node 1 connects and claims its node rank, and never joins (frozen).
        let frozen = Agent::spawn(shaped(1), None);
        keys.set_raw(b"/vigil/node_of/node-c.x-77-00ff", b"2");
        let want = format!(
            "attempt 0 has waited {{}}s for node rank(s) 1 (host test1, pid {}: its agent took the node rank and has not joined), 2 (host node-c.x, pid 77: its agent took the node rank and has not joined) and 3 (not started, or not reached the store); 1 of 4 joined (--join-timeout 30s)",
            std::process::id()
        );
        let (before, after) = want.split_once("{}").unwrap();
        let note = loop {
            let m = tokio::time::timeout(T, head.rx.recv())
                .await
                .expect("node rank 0 says who it waits for")
                .expect("the coordinator runs");
            match m {
                // The first notes may come before node 1's claim.
                FromCoord::Note(n) if n.starts_with(before) && n.ends_with(after) => break n,
                FromCoord::Note(n) => assert!(n.starts_with("attempt 0 has waited"), "{n}"),
                m => panic!("{m:?}"),
            }
        };
        let secs = &note[before.len()..note.len() - after.len()];
        assert!(secs.parse::<u64>().is_ok(), "{note}");
        for a in [&head, &frozen] {
            a.tx.send(JobRequest::Leave {
                poison: None,
                highest_step: None,
            })
            .unwrap();
        }
        for a in [head, frozen] {
            tokio::time::timeout(T, a.task)
                .await
                .expect("each agent leaves")
                .unwrap();
        }
    });
}
