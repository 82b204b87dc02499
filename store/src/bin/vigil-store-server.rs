//! `vigil-store-server`: a standalone TCPStore-compatible server.
//!
//! Prints `listening on HOST:PORT` as its first stdout line, then serves until
//! SIGTERM, SIGINT or end of stdin (unless `--ignore-stdin`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use vigil_store::StoreServer;

const USAGE: &str =
    "usage: vigil-store-server [--host HOST] [--port PORT] [--threads N] [--max-total-bytes N] [--ignore-stdin]

  --host HOST      address to bind (default 0.0.0.0)
  --port PORT      port to bind, 0 picks a free one (default 29500)
  --threads N      worker threads; 1 runs everything on one thread (default 1)
  --max-total-bytes N  most bytes of keys, values and transfers held at once
                   (default 268435456); a request over it closes its connection
  --ignore-stdin   keep serving when stdin reaches end of file

With VIGIL_STORE_SECRET set (16 characters or more), only clients that prove
they hold it may use keys under /vigil/.
";

/// A command line this server cannot run with (exit status 2, with the usage).
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("{0} needs a value")]
    NoValue(&'static str),
    #[error("bad {flag}: {source}")]
    Bad {
        flag: &'static str,
        source: std::num::ParseIntError,
    },
    #[error("unknown argument {0:?}")]
    Unknown(String),
}

/// Why the server could not start or serve (exit status 1).
#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("{0} resolves to no address")]
    NoAddress(String),
    #[error(transparent)]
    Secret(#[from] vigil_store::auth::ShortSecret),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The exit status of a command line this server cannot run with, as vigil's own (the agent's
/// exit.rs `USAGE`).
const EXIT_USAGE: u8 = 2;

struct Args {
    host: String,
    port: u16,
    threads: usize,
    max_total: usize,
    ignore_stdin: bool,
}

fn parse_args() -> Result<Args, ArgError> {
    let mut a = Args {
        host: "0.0.0.0".into(),
        port: 29500,
        threads: 1,
        max_total: vigil_store::DEFAULT_MAX_TOTAL,
        ignore_stdin: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |flag: &'static str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or(ArgError::NoValue(flag))
        };
        let bad = |flag| move |source| ArgError::Bad { flag, source };
        match name.as_str() {
            "--host" => a.host = value("--host")?,
            "--port" => a.port = value("--port")?.parse().map_err(bad("--port"))?,
            "--threads" => a.threads = value("--threads")?.parse().map_err(bad("--threads"))?,
            "--max-total-bytes" => {
                a.max_total = value("--max-total-bytes")?
                    .parse()
                    .map_err(bad("--max-total-bytes"))?
            }
            "--ignore-stdin" => a.ignore_stdin = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(ArgError::Unknown(other.to_string())),
        }
    }
    Ok(a)
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, ServeError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|source| ServeError::Resolve {
            host: host.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| ServeError::NoAddress(host.to_string()))
}

async fn run(args: Args) -> Result<(), ServeError> {
    let addr = resolve(&args.host, args.port)?;
    let secret = match std::env::var_os("VIGIL_STORE_SECRET") {
        None => None,
        Some(s) => Some(
            vigil_store::auth::check_secret(std::os::unix::ffi::OsStrExt::as_bytes(s.as_os_str()))?
                .to_vec(),
        ),
    };
    let mut server = StoreServer::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    server.set_secret(secret);
    server.set_max_total(args.max_total);
    server.on_drop(std::sync::Arc::new(|peer, _, why| {
        if why == vigil_store::CLOSED_IN_HANDSHAKE {
            return;
        }
        eprintln!("vigil-store-server: closed the connection from {peer}: {why}");
    }));
    let local = server.local_addr()?;
    println!("listening on {local}");
    let handle = server.spawn();

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stdin_eof = async {
        if args.ignore_stdin {
            return std::future::pending::<()>().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = stdin_eof => {}
    }
    handle.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vigil-store-server: {e}\n{USAGE}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil-store-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(run(args));
    // The stdin watcher is a blocking read that never returns on a signal:
    // do not wait for it.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vigil-store-server: {e}");
            ExitCode::FAILURE
        }
    }
}
