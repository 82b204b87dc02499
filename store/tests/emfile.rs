//! The accept loop out of file descriptors (EMFILE): it neither dies nor spins, and serves again
//! once descriptors are free. A test binary of its own, since it lowers the process's fd limit.

use std::time::Duration;

use tokio::time::Instant;
use vigil_store::{StoreClient, StoreServer};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    t(ru.ru_utime) + t(ru.ru_stime)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_loop_survives_emfile() {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let h = server.spawn();
    let addr = h.local_addr();
    let limit = (open_fds() + 40) as libc::rlim_t;
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: plain struct in, plain struct out.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl), 0);
        let low = libc::rlimit {
            rlim_cur: limit.min(rl.rlim_max),
            rlim_max: rl.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &low), 0);
    }
    // Another process (with the usual limit) holds 200 idle connections: the store accepts until
    // it is out of descriptors, the rest wait in its listen backlog.
    let script = format!(
        "for i in $(seq 200); do exec {{fd}}<>/dev/tcp/127.0.0.1/{}; done; echo held; read _",
        addr.port()
    );
    let mut holder = std::process::Command::new("bash");
    holder
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        holder.pre_exec(move || {
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
            Ok(())
        });
    }
    let mut holder = holder.spawn().expect("bash runs");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.stats().connections < 5 {
        assert!(Instant::now() < deadline, "the store accepted nothing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(h.stats().connections < 200, "the limit did not bite");
    // Out of descriptors with connections waiting, the loop backs off instead of spinning.
    let (c0, t0) = (cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let busy = cpu_time() - c0;
    assert!(
        busy < (Instant::now() - t0) / 2,
        "accept loop spun: {busy:?} of CPU in a second"
    );
    // The holder lets go: the store serves a new client again.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let mut c = StoreClient::connect(addr, Duration::from_secs(20))
        .await
        .expect("served again once descriptors are free");
    c.set("k", b"v").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"v");
    // SAFETY: restores the limit read above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
    h.shutdown().await;
}
