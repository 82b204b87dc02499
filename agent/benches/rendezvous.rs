//! Rendezvous time against the number of agents: N simulated agents, each running vigil's real
//! coordination code (`vigil::job::rendezvous::run`) over real TCP connections to the real store, on
//! loopback. The store runs on a thread of its own, as in the agent; every simulated agent shares
//! one event loop, as they would share two cores. Prints a table.
//!
//!     cargo bench -p vigil --bench rendezvous [-- 1,16,128,512,1024]
//!
//! With `--workers W` it runs the multi-process harness instead (`bench/scale_harness.rs`): the
//! store and node rank 0 here, the other agents in W worker processes, TCP counters, descriptor
//! peaks and CPU recorded, a non-zero exit when the harness or the protocol lost something.
//!
//!     cargo bench -p vigil --bench rendezvous -- --workers 4 [--hold 150] [--node-timeout 30] 256,1024
//!
//! Columns: `connect` is every agent connecting and claiming its node rank; `join 0` is from all
//! agents asking to join attempt 0 to the last one holding its rank assignment; `restart` is from
//! one agent reporting a failure to every agent holding its assignment for attempt 1 (the verdict
//! reaching everyone, everyone rejoining, node rank 0 clearing the store and answering).

use std::time::{Duration, Instant};

mod common;
#[path = "../../bench/scale_harness.rs"]
mod scale;

use common::{coord, raise_fd_limit, Agent};
use vigil::job::rendezvous::{CoordConfig, FromCoord, HeadSide};
use vigil::supervise::{Event, JobEnd, JobRequest};

/// `spares` of the `n` agents wait as standbys; `promotion` (with spares) is from an active
/// agent's death (its connections drop, as at a SIGKILL) to every other agent holding its
/// assignment for attempt 1, a standby in the dead agent's slot.
async fn one_round(n: u32, spares: u32) -> (Duration, Duration, Duration) {
    // Hosted as the agent hosts it: a thread and runtime of its own.
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
    let t0 = Instant::now();
    let mut agents = Vec::new();
    for node in 0..n {
        let cfg = CoordConfig {
            join_timeout: Duration::from_secs(120),
            ..coord(n, n - spares, node, addr, Duration::from_secs(30))
        };
        agents.push(Agent::spawn(
            cfg,
            if node == 0 { head.take() } else { None },
        ));
    }
    // Every agent has connected and claimed its node rank (`vigil/owner/<n>`).
    let owners: Vec<String> = (0..n).map(|i| format!("vigil/owner/{i}")).collect();
    let refs: Vec<&str> = owners.iter().map(String::as_str).collect();
    probe
        .wait(&refs, Duration::from_secs(120))
        .await
        .expect("every agent connects");
    let connect_time = t0.elapsed();
    let t1 = Instant::now();
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
    let join0 = t1.elapsed();
    let t2 = Instant::now();
    if spares > 0 {
        // Node 1 dies: its coordination task and with it its connections are gone.
        let dead = agents.remove(1);
        dead.task.abort();
        let _ = dead.task.await;
    } else {
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
    }
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
    let restart = t2.elapsed();
    for a in agents {
        let _ = a.tx.send(JobRequest::Leave {
            poison: None,
            highest_step: None,
        });
        let _ = a.task.await;
    }
    (connect_time, join0, restart)
}

/// The value after `flag` on the command line.
fn flag<T: std::str::FromStr>(args: &[String], flag: &str) -> Option<T> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1)?.parse().ok()
}

/// A worker of the multi-process harness: `--scale-worker NNODES FIRST COUNT STORE TIMEOUT_S`.
fn scale_worker(args: &[String]) {
    let bad = || -> ! {
        eprintln!("--scale-worker NNODES FIRST COUNT STORE TIMEOUT_S");
        std::process::exit(2)
    };
    let [n, first, count, store, t] = args else {
        bad()
    };
    let (Ok(n), Ok(first), Ok(count), Ok(store), Ok(t)) = (
        n.parse(),
        first.parse(),
        count.parse(),
        store.parse(),
        t.parse::<f64>(),
    ) else {
        bad()
    };
    scale::worker(n, first, count, store, Duration::from_secs_f64(t));
}

fn scale_main(args: &[String], sizes: Vec<u32>, workers: u32) -> i32 {
    let hold = Duration::from_secs(flag(args, "--hold").unwrap_or(5));
    let timeout = Duration::from_secs(flag(args, "--node-timeout").unwrap_or(30));
    scale::header();
    let mut failed = None;
    for n in sizes.into_iter().filter(|n| *n >= 2) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        let row = local.block_on(&rt, scale::run(n, workers, hold, timeout));
        if let Some(why) = scale::print(&row) {
            failed.get_or_insert(why);
        }
    }
    match failed {
        Some(why) => {
            eprintln!("scale harness: {why}");
            1
        }
        None => 0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--scale-worker") {
        return scale_worker(&args[1..]);
    }
    raise_fd_limit();
    // Sizes: the first argument that is neither a flag nor a flag's value.
    let mut sizes_arg = None;
    let mut i = 0;
    while i < args.len() {
        if ["--workers", "--hold", "--node-timeout"].contains(&args[i].as_str()) {
            i += 2;
            continue;
        }
        if !args[i].starts_with('-') {
            sizes_arg = Some(args[i].clone());
            break;
        }
        i += 1;
    }
    let sizes: Vec<u32> = sizes_arg
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 128, 512, 1024]);
    if let Some(workers) = flag::<u32>(&args, "--workers") {
        std::process::exit(scale_main(&args, sizes, workers));
    }
    println!("| agents | standbys | connect + claim | join attempt 0 | failure (standbys: an active agent's death) to all rejoined (attempt 1) |");
    println!("|---|---|---|---|---|");
    for n in sizes {
        // Without standbys, and (from 2 agents) with 1/16 of them as standbys, at least one.
        let mut cases = vec![0];
        if n >= 3 {
            cases.push((n / 16).max(1));
        }
        for spares in cases {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let local = tokio::task::LocalSet::new();
            let (c, j, r) = local.block_on(&rt, one_round(n, spares));
            println!(
                "| {n} | {spares} | {:.1} ms | {:.1} ms | {:.1} ms |",
                c.as_secs_f64() * 1e3,
                j.as_secs_f64() * 1e3,
                r.as_secs_f64() * 1e3
            );
        }
    }
}
