//! What the rendezvous benches share (`--bench rendezvous`, its multi-process harness
//! `bench/scale_harness.rs`, and `--bench scale_check`): the open-file limit, one simulated
//! agent's coordination config, and an agent running vigil's real coordination code.

#![allow(dead_code)] // each bench uses its part

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use vigil::job::rendezvous::{self, CoordConfig, FromCoord, HeadSide};
use vigil::supervise::{Event, JobRequest};

/// This process's soft open-file limit, after raising it to the hard one.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    lim.rlim_cur
}

/// Simulated node `node_rank` of an `nnodes`-node job (`active` of them with ranks, 8 each)
/// whose store is at `store`.
pub fn coord(
    nnodes: u32,
    active: u32,
    node_rank: u32,
    store: SocketAddr,
    peer_timeout: Duration,
) -> CoordConfig {
    CoordConfig {
        nnodes,
        active,
        topology: None,
        segment: None,
        node_rank,
        nproc: 8,
        store,
        join_timeout: Duration::from_secs(300),
        join_note_every: vigil::job::rendezvous::absent::JOIN_NOTE_PERIOD,
        last_call: Duration::from_secs(30),
        peer_timeout,
        host: format!("sim{node_rank}"),
        max_restarts: 3,
        secret: None,
        job: None,
        outside: false,
        in_process: false,
    }
}

/// One simulated agent: its coordination task, what it is asked and what it says.
pub struct Agent {
    pub tx: mpsc::UnboundedSender<JobRequest>,
    pub task: tokio::task::JoinHandle<()>,
    pub rx: mpsc::UnboundedReceiver<FromCoord>,
}

impl Agent {
    /// Starts `cfg`'s coordination on this thread's local task set (`head`: node rank 0's side
    /// of the store it hosts).
    pub fn spawn(cfg: CoordConfig, head: Option<HeadSide>) -> Agent {
        let (tx, req_rx) = mpsc::unbounded_channel();
        let (ev_tx, rx) = mpsc::unbounded_channel();
        let task = tokio::task::spawn_local(rendezvous::run(cfg, head, req_rx, ev_tx));
        Agent { tx, task, rx }
    }

    /// Until the agent holds its assignment (or its standby place) for `attempt`; what node rank 0
    /// alone is told on the way (promotions, the hosts, console notes) is passed over.
    pub async fn joined(&mut self, attempt: u32) {
        loop {
            match self.rx.recv().await {
                Some(FromCoord::Event(Event::Joined { attempt: c, .. }))
                | Some(FromCoord::Event(Event::Standby { attempt: c }))
                    if c == attempt =>
                {
                    return
                }
                Some(FromCoord::Promoted { .. } | FromCoord::Hosts { .. } | FromCoord::Note(_)) => {
                }
                other => panic!("expected Joined({attempt}), got {other:?}"),
            }
        }
    }
}
