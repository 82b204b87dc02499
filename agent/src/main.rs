use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use vigil::cli::config::{self, Host};
use vigil::cli::{Cli, Command, RunArgs};
use vigil::exit;
use vigil::run;
use vigil::values::ConfigError;

/// Invoked as `ft_launcher` (a symlink), the binary is `vigil run`; `vigil run` takes
/// ft_launcher's flags (and `--ft-cfg-path` YAML), rewritten to vigil's before parsing. A `--` is
/// put before the training script, so that nothing after it is read as vigil's flag (torchrun
/// passes everything after the script untouched, but for a `--` right after it).
fn args() -> Result<Vec<String>, ConfigError> {
    let mut args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if invoked_as_ft_launcher() {
        args.insert(1, "run".into());
        // As ft_launcher, vigil prints NVRx's restarter state lines (docs/ft_launcher.md).
        args.insert(2, "--nvrx-restarter-log".into());
    }
    if args.get(1).map(String::as_str) != Some("run") {
        return Ok(args);
    }
    let (words, notes) =
        vigil::cli::argv::run_words(&args[2..], &vigil::cli::argv::read_config_file)?;
    for note in &notes {
        eprintln!("[vigil] {note}");
    }
    args.truncate(2);
    args.extend(words);
    Ok(args)
}

/// Whether the binary runs under the name `ft_launcher` (a symlink, or the `ft_launcher` binary).
fn invoked_as_ft_launcher() -> bool {
    std::env::args_os().next().is_some_and(|a| {
        std::path::Path::new(&a)
            .file_name()
            .is_some_and(|f| f == "ft_launcher")
    })
}

/// As `ft_launcher`, `--help` and `--version` before the script answer in ft_launcher's names
/// (its flags, the NVRx release vigil follows), not `vigil run`'s. `None` when not asked.
fn ft_launcher_info(args: &[String]) -> Option<i32> {
    use vigil::cli::ftcompat::help;
    if !invoked_as_ft_launcher() {
        return None;
    }
    let text = match help::asked(args.get(2..).unwrap_or_default())? {
        help::Asked::Version => help::version_text(vigil::cli::version_text()),
        help::Asked::Help => {
            let mut cmd = Cli::command();
            let run = cmd.find_subcommand_mut("run")?;
            help::help_text(&run.render_long_help().to_string())
        }
    };
    // A closed stdout (`| head`) is the reader's choice, not an error.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
    Some(exit::SUCCESS)
}

/// torchrun's `--print-completion SHELL` (shtab's): like torchrun, it prints the completion
/// script and exits before a training script is required. `None` when it is not given.
fn print_completion(args: &[String]) -> Option<i32> {
    let ours = args.split(|a| a == "--").next().unwrap_or_default();
    let value = ours.iter().find_map(|a| {
        let (name, value) = a.split_once('=').unwrap_or((a, ""));
        (name == "--print-completion" || name == "--print_completion").then_some(value)
    })?;
    let shell = match value {
        "bash" => clap_complete::Shell::Bash,
        "zsh" => clap_complete::Shell::Zsh,
        "tcsh" => {
            eprintln!("vigil: error: --print-completion tcsh: vigil writes completion scripts for bash and zsh only; give bash or zsh");
            return Some(exit::USAGE);
        }
        other => {
            eprintln!("vigil: error: --print-completion {other:?}: give the shell, bash or zsh");
            return Some(exit::USAGE);
        }
    };
    let mut text = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "vigil", &mut text);
    // A closed stdout (`| head`) is the reader's choice, not an error.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), &text);
    Some(exit::SUCCESS)
}

/// A clap error as one line: what is wrong with which flag and clap's tip, without the usage
/// block, pointing at `--help` for the rest.
fn one_line(e: &clap::Error, help: &str) -> String {
    let text = e.render().to_string();
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("For more information")
                && !l.starts_with("tip: to pass")
        })
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect();
    let run_help = help == "vigil run --help" || help == "ft_launcher --help";
    let hint = if e.kind() == clap::error::ErrorKind::UnknownArgument && run_help {
        "; the script's own flags go after the script"
    } else {
        ""
    };
    format!("{}{hint}; see `{help}`", parts.join(" "))
}

/// The soft open-file limit, which bounds how many ranks the agent can watch, after raising it
/// to the hard limit (node rank 0's store holds several descriptors per node).
fn nofile() -> u64 {
    vigil::run::raise_nofile()
}

fn run(a: RunArgs) -> i32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let env = |k: &str| std::env::var(k).ok();
    let gpus = || vigil::perf::gpu::gpu_count_with(a.nvml_lib.as_deref());
    let host = Host {
        cpus,
        nofile: nofile(),
        gpus: &gpus,
        env: &env,
        now: std::time::SystemTime::now(),
        cwd: std::env::current_dir().ok(),
    };
    let fail = |msg: &dyn std::fmt::Display| {
        eprintln!("vigil: error: {msg}");
        exit::USAGE
    };
    if let Some(p) = &a.timeouts_file {
        // Read (bounded) at start on node rank 0; a file that cannot be one is refused here.
        match vigil_bounded::read_bytes(p, vigil::job::state::TIMEOUTS_LIMIT) {
            Err(e) if !e.is_not_found() => {
                return fail(&format!(
                    "--timeouts-file {}: {}; give a regular file (vigil writes it) or leave the flag out",
                    p.display(),
                    e.reason()
                ))
            }
            _ => {}
        }
    }
    let cfg = match config::resolve(&a, &host) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let script_is_file = !a.module && !a.no_python;
    if (script_is_file || a.no_python) && std::path::Path::new(&a.training_script).is_dir() {
        return fail(&format!(
            "the training script {:?} is a directory; give the path of a file (or -m and a module name to run a package)",
            a.training_script
        ));
    }
    if let Err(e) = run::check_command(&cfg, script_is_file, &a.training_script) {
        return fail(&e);
    }
    if let Err(e) = run::prepare_state(&cfg) {
        return fail(&e);
    }
    if let Err(e) = run::check_cycle_info_dir(&cfg) {
        return fail(&e);
    }
    let run_dir = match run::make_run_dir(&cfg) {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    run::run(cfg, run_dir)
}

/// `vigil run`'s long options from its own parser, so that a recipe's `[vigil]` table is
/// checked against exactly the options this binary has.
fn run_options() -> Vec<vigil_recipes::RunOption> {
    Cli::command()
        .find_subcommand("run")
        .map(|run| {
            run.get_arguments()
                .filter_map(|a| {
                    Some(vigil_recipes::RunOption {
                        long: a.get_long()?.to_string(),
                        takes_value: a.get_action().takes_values(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

fn main() -> ExitCode {
    match parse_cli() {
        Ok(cli) => exit::code(command(cli.command)),
        Err(code) => code,
    }
}

/// The command line parsed; `Err`: what to exit with, the help or the error already printed.
fn parse_cli() -> Result<Cli, ExitCode> {
    let mut help = "vigil --help";
    let parsed = match args() {
        Ok(a) => {
            if let Some(code) = print_completion(&a).or_else(|| ft_launcher_info(&a)) {
                return Err(exit::code(code));
            }
            if a.get(1).is_some_and(|s| s == "run") {
                help = if invoked_as_ft_launcher() {
                    "ft_launcher --help"
                } else {
                    "vigil run --help"
                };
            }
            if a.get(1).is_some_and(|s| s == "launch") {
                help = "vigil launch --help";
            }
            Cli::try_parse_from(a)
        }
        Err(e) => {
            eprintln!("vigil: error: {e}");
            return Err(exit::code(exit::USAGE));
        }
    };
    parsed.map_err(|e| {
        if !e.use_stderr() {
            // --help, --version: clap's own text on stdout.
            let _ = e.print();
            ExitCode::SUCCESS
        } else if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            // `vigil` alone: the usage, as a usage error.
            let _ = e.print();
            exit::code(exit::USAGE)
        } else {
            eprintln!("vigil: error: {}", one_line(&e, help));
            exit::code(exit::USAGE)
        }
    })
}

/// A reading command's text on stdout, or its error as `vigil NAME: error: ...` (a usage error:
/// the target was not found or not readable).
fn print_or_usage<E: std::fmt::Display>(name: &str, r: Result<String, E>) -> i32 {
    match r {
        Ok(text) => {
            print!("{}", vigil_report::term_safe(&text));
            exit::SUCCESS
        }
        Err(e) => {
            let e = vigil_report::term_safe_line(&e.to_string());
            eprintln!("vigil {name}: error: {e}");
            exit::USAGE
        }
    }
}

/// Runs one command; its exit status.
fn command(cmd: Command) -> i32 {
    let env = |k: &str| std::env::var(k).ok();
    match cmd {
        Command::Run(a) => run(*a),
        Command::Watchdog => vigil::run::proc::watchdog_main(),
        Command::Store(a) => vigil::run::store_service::store_main(a),
        Command::Launch(a) => {
            let check = |l: &vigil_recipes::RunLine| {
                vigil::cli::argv::check_run_line(&l.words, l.nodes, l.gpus_per_node)
                    .map_err(|e| vigil_recipes::Error::new(e.to_string()))
            };
            vigil_recipes::cli::launch(&a, &run_options(), &check)
        }
        Command::Status(a) => vigil_recipes::cli::status(&a),
        Command::Logs(a) => vigil_recipes::cli::logs(&a),
        Command::Cancel(a) => vigil_recipes::cli::cancel(&a),
        Command::List => vigil_recipes::cli::list(),
        Command::Attach(a) => vigil_recipes::cli::attach(&a),
        Command::Health(h) => {
            let report = vigil::perf::health::run_checks(&h.options());
            if h.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.render());
            }
            if report.healthy() {
                exit::SUCCESS
            } else {
                exit::FAILURE
            }
        }
        Command::Ledger { target } => {
            let cwd = std::env::current_dir().unwrap_or_default();
            let r = vigil::allocation::ledger::ledger_command(target.as_deref(), &env, &cwd);
            print_or_usage("ledger", r)
        }
        Command::Watch(args) => vigil_watch::watch_command(&args, &env),
        Command::Report { target, output } => {
            let r = vigil_report::report_command(&target, output.as_deref(), &env);
            print_or_usage("report", r.map(|path| format!("{}\n", path.display())))
        }
        Command::Goodput { target, json } => {
            let r = vigil_report::goodput::goodput_command(&target, json, &env);
            print_or_usage("goodput", r)
        }
    }
}
