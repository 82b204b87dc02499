use std::process::ExitCode;

use clap::Parser;
use vigil::cli::{Cli, Command, RunArgs};
use vigil::config::{self, Host};
use vigil::runtime;

/// Invoked as `ft_launcher` (a symlink), the binary is `vigil run`.
fn args() -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = std::env::args_os().collect();
    let invoked_as = args.first().and_then(|a| {
        std::path::Path::new(a)
            .file_name()
            .map(|f| f.to_os_string())
    });
    if invoked_as.as_deref() == Some(std::ffi::OsStr::new("ft_launcher")) {
        args.insert(1, "run".into());
    }
    args
}

fn run(a: RunArgs) -> i32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let env = |k: &str| std::env::var(k).ok();
    let host = Host {
        cpus,
        gpus: &vigil::gpu::gpu_count,
        env: &env,
    };
    let fail = |msg: String| {
        eprintln!("vigil: error: {msg}");
        2
    };
    let cfg = match config::resolve(&a, &host) {
        Ok(c) => c,
        Err(e) => return fail(e.0),
    };
    let script_is_file = !a.module && !a.no_python;
    if let Err(e) = runtime::check_command(&cfg, script_is_file, &a.training_script) {
        return fail(e.0);
    }
    let run_dir = match runtime::make_run_dir(&cfg) {
        Ok(d) => d,
        Err(e) => return fail(e.0),
    };
    runtime::run(cfg, run_dir)
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(args());
    let code = match cli.command {
        Command::Run(a) => run(*a),
        Command::Watchdog => vigil::proc::watchdog_main(),
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
