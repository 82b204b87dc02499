//! The real numbers bench/scale_sim.py is checked against: N agents running vigil's real
//! coordination code (`vigil::job::rendezvous::run`) over real TCP to the real store on loopback,
//! as in `--bench rendezvous` (the store on a thread of its own, every agent on this one thread),
//! and for each phase its wall time and the CPU time of the store's thread and of the agents'
//! thread (the scheduler's counts in /proc, so other load on the machine inflates the wall time
//! but not the CPU times).
//!
//!     cargo bench -p vigil --bench scale_check [-- 1024,2048]
//!
//! Phases: `join` is from every agent asking to join attempt 0 to the last one holding its
//! assignment; `failure` is from node N-1 reporting a failure to every agent holding its
//! assignment for attempt 1.

use std::time::{Duration, Instant};

mod common;

use common::{coord, raise_fd_limit, Agent};
use vigil::job::rendezvous::{FromCoord, HeadSide};
use vigil::supervise::{Event, JobEnd, JobRequest};

/// Nanoseconds on a CPU of this process's thread named `name`, or of this thread (`None`).
fn thread_cpu(name: Option<&str>) -> u64 {
    let read = |dir: &str| {
        std::fs::read_to_string(format!("{dir}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let Some(name) = name else {
        return read("/proc/thread-self");
    };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .map(|t| t.path().to_string_lossy().into_owned())
        .filter(|d| std::fs::read_to_string(format!("{d}/comm")).is_ok_and(|c| c.trim() == name))
        .map(|d| read(&d))
        .sum()
}

struct Mark {
    wall: Instant,
    store: u64,
    agents: u64,
}

impl Mark {
    fn now() -> Mark {
        Mark {
            wall: Instant::now(),
            store: thread_cpu(Some("vigil-store")),
            agents: thread_cpu(None),
        }
    }

    /// Wall ms, store CPU ms, agents' CPU ms since `self`.
    fn since(&self) -> (f64, f64, f64) {
        let m = Mark::now();
        (
            m.wall.duration_since(self.wall).as_secs_f64() * 1e3,
            (m.store - self.store) as f64 / 1e6,
            (m.agents - self.agents) as f64 / 1e6,
        )
    }
}

async fn one_round(n: u32) -> [(f64, f64, f64); 2] {
    let (addr, keys, leases) = vigil::run::host_store(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(30),
        None,
    )
    .expect("store up");
    let mut head = Some(HeadSide::Local { keys, leases });
    let mut probe = vigil_store::StoreClient::connect(addr, Duration::from_secs(30))
        .await
        .expect("probe connects");
    let mut agents = Vec::new();
    for node in 0..n {
        let cfg = coord(n, n, node, addr, Duration::from_secs(120));
        agents.push(Agent::spawn(
            cfg,
            if node == 0 { head.take() } else { None },
        ));
    }
    let owners: Vec<String> = (0..n).map(|i| format!("vigil/owner/{i}")).collect();
    let refs: Vec<&str> = owners.iter().map(String::as_str).collect();
    probe
        .wait(&refs, Duration::from_secs(300))
        .await
        .expect("every agent connects");
    let m = Mark::now();
    for a in &agents {
        a.tx.send(JobRequest::Join {
            attempt: 0,
            calculated: None,
        })
        .unwrap();
    }
    for a in agents.iter_mut() {
        a.joined(0).await;
    }
    let join = m.since();
    let m = Mark::now();
    agents[n as usize - 1]
        .tx
        .send(JobRequest::ReportEnd {
            attempt: 0,
            end: JobEnd::Failed {
                node: n - 1,
                reason: "bench".into(),
            },
        })
        .unwrap();
    for a in agents.iter_mut() {
        match a.rx.recv().await {
            Some(FromCoord::Event(Event::AttemptEnded { attempt: 0, .. })) => {}
            other => panic!("expected CycleEnded(0), got {other:?}"),
        }
        a.tx.send(JobRequest::Join {
            attempt: 1,
            calculated: None,
        })
        .unwrap();
    }
    for a in agents.iter_mut() {
        a.joined(1).await;
    }
    let failure = m.since();
    // Every agent leaves at once: node rank 0 waits for the others' leases to go.
    for a in &agents {
        let _ = a.tx.send(JobRequest::Leave {
            poison: None,
            highest_step: None,
        });
    }
    for a in agents {
        let _ = a.task.await;
    }
    [join, failure]
}

fn main() {
    raise_fd_limit();
    let sizes: Vec<u32> = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1024, 2048]);
    println!("| agents | phase | wall | store thread CPU | agents' thread CPU |");
    println!("|---|---|---|---|---|");
    for n in sizes {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        let phases = local.block_on(&rt, one_round(n));
        for (name, (w, s, a)) in ["join", "failure"].iter().zip(phases) {
            println!("| {n} | {name} | {w:.1} ms | {s:.1} ms | {a:.1} ms |");
        }
    }
}
