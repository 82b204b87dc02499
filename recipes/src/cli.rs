//! The commands: `vigil launch`, `status`, `logs`, `cancel`, `list`, `attach`. The agent's
//! parser embeds these argument structs and calls the functions here; each returns the exit
//! status after printing its result, or its error as one line.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use clap::Args;

use crate::experiment::{self, Meta};
use crate::recipe::Origin;
use crate::recipe::{self, Facts};
use crate::render::{self, Target};
use crate::{err, slurm, Error, RunCheck, RunOption};

#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// The recipe, a TOML file (docs/launch.md). Every key can also be given with --set or the
    /// flags below, which win over the file.
    #[arg(value_name = "RECIPE")]
    pub recipe: Option<PathBuf>,
    /// Print the rendered script (or the ngc line) and submit nothing.
    #[arg(long = "dry-run", alias = "dry_run")]
    pub dry_run: bool,
    /// An allocation that waits, with an attach.sh in the experiment directory (vigil attach).
    #[arg(long)]
    pub interactive: bool,
    /// Where the job runs: `slurm` (sbatch) or `bcp` (NVIDIA Base Command; with --dry-run).
    #[arg(long, default_value = "slurm", value_parser = ["slurm", "bcp"])]
    pub executor: String,
    /// Any recipe key, `KEY=VALUE` with a TOML value or plain text: `--set vigil.max_restarts=3`,
    /// `--set env.FOO=bar`, `--set 'args=["--steps", "5"]'`. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The recipe's `name`.
    #[arg(long)]
    pub name: Option<String>,
    /// The recipe's `nodes`.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// The recipe's `nproc_per_node`.
    #[arg(long = "nproc-per-node", alias = "nproc_per_node")]
    pub nproc_per_node: Option<u32>,
    /// The recipe's `partition`.
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    /// The recipe's `account`.
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    /// The recipe's `time`: Slurm's HH:MM:SS (D-HH:MM:SS) or 4h, 90m, 1d, 1h30m.
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// The recipe's `image` (a .sqsh path or a registry reference).
    #[arg(short = 'i', long)]
    pub image: Option<String>,
    /// The recipe's `cluster` preset: hcc-a3m, hcc-a3u, hcc-a4, hcc-a3h.
    #[arg(long)]
    pub cluster: Option<String>,
    /// The recipe's `script`.
    #[arg(short = 's', long)]
    pub script: Option<String>,
    /// The recipe's `store`: HOST:PORT of a store outside the job (`vigil store --listen`).
    #[arg(long, value_name = "HOST:PORT")]
    pub store: Option<String>,
    /// The training script's arguments, after `--` (they replace the recipe's `args`).
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ExperimentArg {
    /// An experiment id (`name_YYYYMMDD-HHMMSS`), a name (its latest launch) or an experiment
    /// directory; for status and logs also a log, run or state directory of a plain `vigil run`
    /// (docs/usage.md, "Naming a job"); default: the latest launch.
    #[arg(value_name = "EXPERIMENT")]
    pub experiment: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub which: ExperimentArg,
    /// Keep printing as the log grows, until the job ends (Ctrl-C stops).
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Global rank N's own output (its latest attempt) instead of the job's log: its stdout on
    /// stdout, its stderr on stderr.
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// The bytes as written. Without it, terminal control characters (escape sequences, carriage
    /// returns) are printed as text such as `\x1b`, so a log cannot drive the terminal.
    #[arg(long)]
    pub raw: bool,
}

#[derive(Debug, Clone, Args)]
pub struct AttachArgs {
    /// The interactive experiment (id, name or directory).
    #[arg(value_name = "EXPERIMENT")]
    pub experiment: String,
    /// A command to run in the allocation instead of a shell, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The status of every command here that cannot do what was asked (agent/src/exit.rs `USAGE`,
/// which checks that the two agree).
pub const EXIT_USAGE: i32 = 2;

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// The error as one line; names and paths in it may come from records, so nothing in it may
/// drive the terminal.
fn fail(cmd: &str, e: Error) -> i32 {
    eprintln!(
        "vigil {cmd}: error: {}",
        vigil_report::term_safe_line(&e.to_string())
    );
    EXIT_USAGE
}

/// The recipe table: the file, then --set, then the named flags.
fn recipe_table(a: &LaunchArgs) -> Result<(toml::Table, Origin), Error> {
    let (mut table, mut origin) = match &a.recipe {
        Some(p) => {
            let origin = p.display().to_string();
            // Its name is written into the script's header.
            if origin.chars().any(char::is_control) {
                return err(format!(
                    "the recipe's file name {origin:?} holds a control character; rename the file (a newline would end the script's comment line and run the rest)"
                ));
            }
            let text = vigil_bounded::read_string(p, vigil_bounded::CONFIG_LIMIT).map_err(|e| {
                Error(format!(
                    "cannot read the recipe {origin}: {}; give the path of a .toml file",
                    e.reason()
                ))
            })?;
            (recipe::parse_table(&text, &origin)?, Origin::file(&origin))
        }
        None => (toml::Table::new(), Origin::file("the flags")),
    };
    for s in &a.set {
        let Some((k, v)) = s.split_once('=') else {
            return err(format!(
                "--set {s:?}: give KEY=VALUE, e.g. --set vigil.max_restarts=3"
            ));
        };
        recipe::set_key(&mut table, k.trim(), recipe::toml_value(v))?;
        origin.set(k.trim(), format!("--set {}", k.trim()));
    }
    let s = |v: &Option<String>| v.clone().map(toml::Value::String);
    let n = |v: Option<u32>| v.map(|n| toml::Value::Integer(n.into()));
    for (k, flag, v) in [
        ("name", "--name", s(&a.name)),
        ("nodes", "--nodes", n(a.nodes)),
        ("nproc_per_node", "--nproc-per-node", n(a.nproc_per_node)),
        ("partition", "-p/--partition", s(&a.partition)),
        ("account", "-A/--account", s(&a.account)),
        ("time", "-t/--time", s(&a.time)),
        ("image", "-i/--image", s(&a.image)),
        ("cluster", "--cluster", s(&a.cluster)),
        ("script", "-s/--script", s(&a.script)),
        ("store", "--store", s(&a.store)),
    ] {
        if let Some(v) = v {
            table.insert(k.into(), v);
            origin.set(k, flag.into());
        }
    }
    if !a.args.is_empty() {
        origin.set("args", "the arguments after --".into());
        table.insert(
            "args".into(),
            toml::Value::Array(a.args.iter().cloned().map(toml::Value::String).collect()),
        );
    }
    Ok((table, origin))
}

fn this_vigil() -> String {
    std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "vigil".into())
}

/// NeMo-Run's status block (seeds/000), so users read it as they are used to.
pub fn status_block(m: &Meta, state: &str) -> String {
    let on = m.partition.as_deref().unwrap_or("the default partition");
    format!(
        "Experiment Status for {}\n\nTask 0: {}\n- Status: {state}\n- Executor: SlurmExecutor on {on}\n- Job id: {}\n- Local Directory: {}\n",
        m.id,
        m.name,
        m.job_id.as_deref().unwrap_or("-"),
        m.dir.display()
    )
}

pub fn launch(a: &LaunchArgs, run: &[RunOption], check_run: RunCheck) -> i32 {
    match launch_inner(a, run, check_run) {
        Ok(()) => 0,
        Err(e) => fail("launch", e),
    }
}

/// `--executor bcp`: prints the ngc command line (NVIDIA Base Command has no batch script).
fn launch_bcp(
    a: &LaunchArgs,
    job: &recipe::Job,
    origin: &Origin,
    check_run: RunCheck,
) -> Result<(), Error> {
    if a.interactive {
        return err("--interactive is for Slurm; drop --executor bcp");
    }
    if job.store.is_some() {
        return err(format!(
            "{}: `store` (a store outside the job) is for Slurm jobs; remove it for --executor bcp",
            origin.of("store")
        ));
    }
    let line = render::bcp(job)?;
    check_vigil_line(&render::bcp_run_line(job), origin, check_run)?;
    if !a.dry_run {
        return err("--executor bcp prints the ngc command line only: add --dry-run and run the printed command with the ngc CLI");
    }
    print!("{line}");
    Ok(())
}

/// Whether `p` is a regular file this process can open (`store_secret_file`: the job reads it).
fn readable_file(p: &Path) -> Result<(), String> {
    match std::fs::File::open(p) {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => Ok(()),
        Ok(_) => Err("not a regular file".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn launch_inner(a: &LaunchArgs, run: &[RunOption], check_run: RunCheck) -> Result<(), Error> {
    let (table, origin) = recipe_table(a)?;
    recipe::check_keys(&table, &origin, run)?;
    let r = recipe::from_table(table, &origin)?;
    let cwd = std::env::current_dir().map_err(|e| Error(format!("no current directory: {e}")))?;
    let job = recipe::resolve(&r, &origin, &cwd, &this_vigil(), a.interactive)?;
    let exists = |p: &Path| p.exists();
    if a.executor == "bcp" {
        return launch_bcp(a, &job, &origin, check_run);
    }
    let home = experiment::home(&env, &cwd)?;
    recipe::plain("VIGIL_HOME", "the experiment home", &home.to_string_lossy())?;
    if let Some(w) = render::unseen_vigil(&job, &home.join("experiments")) {
        eprintln!("vigil launch: warning: {w}");
    }
    if !a.interactive {
        let planned = home.join("experiments").join(&job.name).join("check");
        check_vigil_line(&render::slurm_run_line(&job, &planned), &origin, check_run)?;
    }
    if a.dry_run {
        recipe::check(
            &job,
            &Facts {
                partitions: None,
                exists: &exists,
                env: None,
                readable: &readable_file,
            },
        )?;
        let id = format!("{}_{}", job.name, experiment::stamp(SystemTime::now()));
        let dir = home.join("experiments").join(&job.name).join(&id);
        let t = Target {
            id: &id,
            dir: &dir,
            recipe: a.recipe.as_ref().and_then(|p| p.to_str()),
        };
        if a.interactive {
            print!("{}", render::sbatch_interactive(&job, &t));
        } else {
            print!("{}", render::sbatch(&job, &t));
        }
        return Ok(());
    }
    let partitions = match &job.partition {
        Some(_) => Some(slurm::partitions()?),
        None => None,
    };
    let env_fn: &dyn Fn(&str) -> Option<String> = &env;
    recipe::check(
        &job,
        &Facts {
            partitions,
            exists: &exists,
            env: Some(env_fn),
            readable: &readable_file,
        },
    )?;
    for (key, d) in &job.dirs {
        if matches!(*key, "log_dir" | "cache_dir") && !d.is_dir() {
            std::fs::create_dir_all(d).map_err(|e| {
                Error(format!(
                    "cannot create {key} {}: {e}; create it or fix `{key}` (nothing was submitted)",
                    d.display()
                ))
            })?;
            eprintln!("vigil launch: created {key} {}", d.display());
        }
    }
    let (id, dir) = experiment::create(&home, &job.name, SystemTime::now())?;
    let result = submit(a, &r, &job, &id, &dir);
    if result.is_err() {
        // Nothing runs: no experiment to list. The directory is ours, just made.
        let _ = std::fs::remove_dir_all(&dir);
    }
    let m = result?;
    let state = slurm::state(m.job_id.as_deref().unwrap_or(""))
        .ok()
        .flatten()
        .unwrap_or_else(|| "SUBMITTED".into());
    print!("{}", status_block(&m, &state));
    if m.interactive {
        println!(
            "- Attach: bash {}/attach.sh   (or vigil attach {})",
            dir.display(),
            id
        );
    }
    Ok(())
}

/// The rendered `vigil run` line through the agent's own parser and checks, as the job's agents
/// will take it: a bad `[vigil]` value is refused before anything is submitted.
fn check_vigil_line(
    line: &crate::RunLine,
    origin: &Origin,
    check_run: RunCheck,
) -> Result<(), Error> {
    check_run(line).map_err(|e| {
        // The option clap names (`'--max-restarts <..>'`), when a flag gave it, is the flag's.
        let who = origin
            .flag_keys()
            .filter_map(|k| k.strip_prefix("vigil."))
            .find(|k| e.0.contains(&format!("'--{} ", k.replace('_', "-"))))
            .map(|k| origin.of(&format!("vigil.{k}")).to_string())
            .unwrap_or_else(|| origin.to_string());
        Error(format!(
            "{who}: vigil run would refuse this job: {e} (fix the `[vigil]` table or --set vigil.KEY=...; nothing was submitted)"
        ))
    })
}

fn submit(
    a: &LaunchArgs,
    r: &recipe::Recipe,
    job: &recipe::Job,
    id: &str,
    dir: &Path,
) -> Result<Meta, Error> {
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text)
            .map(|_| p.clone())
            .map_err(|e| Error(format!("cannot write {}: {e}", p.display())))
    };
    let t = Target {
        id,
        dir,
        recipe: a.recipe.as_ref().and_then(|p| p.to_str()),
    };
    let recipe_text =
        toml::to_string(r).map_err(|e| Error(format!("cannot write the recipe: {e}")))?;
    write(
        "recipe.toml",
        &format!("# The recipe as launched (file and flags together).\n{recipe_text}"),
    )?;
    let script = if a.interactive {
        render::sbatch_interactive(job, &t)
    } else {
        render::sbatch(job, &t)
    };
    let path = write("sbatch.sh", &script)?;
    let mut m = Meta {
        id: id.into(),
        name: job.name.clone(),
        job_id: None,
        partition: job.partition.clone(),
        interactive: a.interactive,
        created: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        dir: dir.into(),
    };
    let job_id = slurm::submit(&path)?;
    m.job_id = Some(job_id.clone());
    experiment::write_meta(&m)?;
    if a.interactive {
        let p = write("attach.sh", &render::attach_sh(job, &t, &job_id))?;
        set_executable(&p);
    }
    Ok(m)
}

fn set_executable(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
}

fn home() -> Result<PathBuf, Error> {
    let cwd = std::env::current_dir().map_err(|e| Error(format!("no current directory: {e}")))?;
    experiment::home(&env, &cwd)
}

fn find(q: Option<&str>) -> Result<Meta, Error> {
    experiment::find(&home()?, q)
}

fn job_id(m: &Meta) -> Result<&str, Error> {
    m.job_id.as_deref().ok_or_else(|| {
        Error(format!(
            "experiment {} has no Slurm job (sbatch never answered)",
            m.id
        ))
    })
}

/// A directory of vigil's records with no Slurm job to ask: vigil's own view only, as
/// `vigil report` reads the records.
fn print_records(dir: &Path) {
    let mut out = format!("Records in {}\n", dir.display());
    for line in vigil_view(dir) {
        out.push_str(&line);
        out.push('\n');
    }
    print!("{}", vigil_report::term_safe(&out));
}

pub fn status(a: &ExperimentArg) -> i32 {
    let run = || -> Result<(), Error> {
        let m = match named(a.experiment.as_deref())? {
            Named::Experiment(m) => m,
            Named::Records(dir) => {
                print_records(&dir);
                return Ok(());
            }
        };
        let id = job_id(&m)?;
        let info = slurm::show_job(id)?;
        let state = match &info {
            Some(f) => f
                .get("JobState")
                .cloned()
                .unwrap_or_else(|| "UNKNOWN".into()),
            None => format!("UNKNOWN (Slurm no longer knows job {id}; vigil's records below)"),
        };
        let mut out = status_block(&m, &state);
        if let Some(f) = &info {
            for (label, key) in [
                ("Nodes", "NodeList"),
                ("Run time", "RunTime"),
                ("Time limit", "TimeLimit"),
                ("Requeues", "Restarts"),
                ("Exit code", "ExitCode"),
                ("Reason", "Reason"),
            ] {
                let ended = f.get("JobState").is_some_and(|s| slurm::is_terminal(s));
                if key == "ExitCode" && !ended {
                    continue;
                }
                match f.get(key).map(String::as_str) {
                    None | Some("None") | Some("(null)") | Some("") => {}
                    Some(v) => out.push_str(&format!("- {label}: {v}\n")),
                }
            }
        }
        if m.interactive {
            out.push_str(&format!("- Attach: bash {}/attach.sh\n", m.dir.display()));
        }
        for line in vigil_view(&m.dir) {
            out.push_str(&line);
            out.push('\n');
        }
        // Records and Slurm's answers are data: nothing in them may drive the terminal.
        print!("{}", vigil_report::term_safe(&out));
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => fail("status", e),
    }
}

/// vigil's own view of the experiment (allocations, restarts, requeues, steps, last failure),
/// from the records under its directory; before the job wrote any, says so.
fn vigil_view(exp_dir: &Path) -> Vec<String> {
    match vigil_report::History::load(exp_dir) {
        Ok(h) => h.status_lines(),
        Err(e) => vec![format!("- vigil: no records yet ({e})")],
    }
}

/// Rank `rank`'s latest attempt: its stdout.log and stderr.log, from the event logs below `dir`
/// (an experiment, a log, run or state directory: vigil_report::target, shared with report).
fn rank_logs(dir: &Path, rank: u32) -> Result<(PathBuf, PathBuf), Error> {
    match vigil_report::target::rank_dir(dir, rank) {
        Some(d) => Ok((d.join("stdout.log"), d.join("stderr.log"))),
        None => err(format!(
            "no rank {rank} in {}: no event log below it records that rank starting (not started yet, fewer ranks, or not a vigil log directory)",
            dir.display()
        )),
    }
}

/// What `vigil status`/`logs` TARGET names: a launched experiment (its directory, id or name),
/// or a directory of vigil's records that no experiment made (`vigil run --log-dir`, a run or a
/// state directory), read as `vigil report` reads it.
enum Named {
    Experiment(Meta),
    Records(PathBuf),
}

fn named(q: Option<&str>) -> Result<Named, Error> {
    if let Some(q) = q {
        let p = Path::new(q);
        if p.is_dir() && !p.join(experiment::META).is_file() {
            return Ok(Named::Records(p.to_path_buf()));
        }
    }
    find(q).map(Named::Experiment)
}

/// Terminal control bytes written as text (`\x1b`), for a log copied to a terminal: C0 controls
/// but newline and tab, DEL, and the C1 controls as UTF-8 writes them (0xC2 0x80..0x9F). `c2`
/// carries a 0xC2 that ended the previous chunk.
fn escape_bytes(buf: &[u8], c2: &mut bool, out: &mut Vec<u8>) {
    for &b in buf {
        if std::mem::take(c2) {
            if (0x80..=0x9f).contains(&b) {
                out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
                continue;
            }
            out.push(0xc2);
        }
        match b {
            0xc2 => *c2 = true,
            b'\n' | b'\t' => out.push(b),
            0..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            _ => out.push(b),
        }
    }
}

/// Copies what was added to the file since `pos` to `out`, streaming (a log may be larger than
/// memory; a FIFO or device is not read), control bytes escaped unless `raw`; returns the bytes
/// copied.
fn pump(path: &Path, pos: &mut u64, out: &mut dyn Write, raw: bool) -> u64 {
    use std::io::Read;
    let Ok(mut f) = vigil_bounded::open_regular(path) else {
        return 0;
    };
    if f.seek(SeekFrom::Start(*pos)).is_err() {
        return 0;
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut escaped = Vec::new();
    let mut c2 = false;
    let mut total = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        total += n as u64;
        let chunk = &buf[..n];
        let ok = if raw {
            out.write_all(chunk)
        } else {
            escaped.clear();
            escape_bytes(chunk, &mut c2, &mut escaped);
            out.write_all(&escaped)
        };
        if ok.is_err() {
            break;
        }
    }
    if c2 {
        let _ = out.write_all(&[0xc2]);
    }
    let _ = out.flush();
    *pos += total;
    total
}

/// `vigil logs --rank N DIR` for a directory no experiment made: there is no job log and no
/// Slurm job to watch, so -f follows the rank's files until Ctrl-C.
fn dir_logs(a: &LogsArgs, dir: &Path) -> Result<(), Error> {
    let Some(rank) = a.rank else {
        return err(format!(
            "{} is not a launched experiment, so it has no job log: give --rank N for one rank's output",
            dir.display()
        ));
    };
    let (o, e) = rank_logs(dir, rank)?;
    let files = [(o, false), (e, true)];
    let mut pos = [0u64; 2];
    let mut out = std::io::stdout();
    let mut errs = std::io::stderr();
    loop {
        for ((p, to_err), at) in files.iter().zip(pos.iter_mut()) {
            let sink: &mut dyn Write = if *to_err { &mut errs } else { &mut out };
            pump(p, at, sink, a.raw);
        }
        if !a.follow {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn logs(a: &LogsArgs) -> i32 {
    let run = || -> Result<(), Error> {
        let m = match named(a.which.experiment.as_deref())? {
            Named::Experiment(m) => m,
            Named::Records(dir) => return dir_logs(a, &dir),
        };
        let id = job_id(&m)?.to_string();
        let files: Vec<(PathBuf, bool)> = match a.rank {
            Some(r) => {
                let (o, e) = rank_logs(&m.dir, r)?;
                vec![(o, false), (e, true)]
            }
            None => vec![(m.dir.join(format!("{id}.log")), false)],
        };
        if !a.follow && !files.iter().any(|(p, _)| p.exists()) {
            let state = slurm::state(&id).ok().flatten().unwrap_or_default();
            return err(format!(
                "{} does not exist yet (job {id} {}); vigil logs -f waits for it",
                files[0].0.display(),
                if state.is_empty() {
                    "is not known to Slurm"
                } else {
                    &state
                }
            ));
        }
        let mut pos = vec![0u64; files.len()];
        let mut out = std::io::stdout();
        let mut errs = std::io::stderr();
        let mut copy = |pos: &mut [u64]| -> u64 {
            files
                .iter()
                .zip(pos.iter_mut())
                .map(|((p, to_err), at)| {
                    let sink: &mut dyn Write = if *to_err { &mut errs } else { &mut out };
                    pump(p, at, sink, a.raw)
                })
                .sum()
        };
        copy(&mut pos);
        if !a.follow {
            return Ok(());
        }
        // slurmctld has no notification interface: look at the files every half second and at
        // the job's state every few seconds; stop once it ended and nothing more came.
        let mut checked = Instant::now() - Duration::from_secs(10);
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let n = copy(&mut pos);
            if n == 0 && checked.elapsed() >= Duration::from_secs(2) {
                checked = Instant::now();
                let ended = match slurm::state(&id)? {
                    Some(s) => slurm::is_terminal(&s),
                    None => true,
                };
                if ended && copy(&mut pos) == 0 {
                    return Ok(());
                }
            }
        }
    };
    match run() {
        Ok(()) => 0,
        Err(e) => fail("logs", e),
    }
}

pub fn cancel(a: &ExperimentArg) -> i32 {
    let run = || -> Result<(), Error> {
        let m = match named(a.experiment.as_deref())? {
            Named::Experiment(m) => m,
            Named::Records(dir) => {
                print_records(&dir);
                return Ok(());
            }
        };
        let id = job_id(&m)?;
        match slurm::state(id)? {
            Some(s) if slurm::is_terminal(&s) => {
                println!("job {id} (experiment {}) already ended: {s}", m.id);
            }
            None => println!(
                "job {id} (experiment {}) is no longer known to Slurm: nothing to cancel",
                m.id
            ),
            Some(_) => {
                slurm::cancel(id)?;
                println!("cancelled job {id} (experiment {})", m.id);
            }
        }
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => fail("cancel", e),
    }
}

pub fn list() -> i32 {
    let run = || -> Result<(), Error> {
        let all = experiment::all(&home()?);
        if all.is_empty() {
            println!("no experiments yet; start one with vigil launch RECIPE");
            return Ok(());
        }
        // Without Slurm here the list still shows what was launched.
        let states = slurm::states().unwrap_or_default();
        let rows: Vec<[String; 4]> = all
            .iter()
            .map(|m| {
                let job = m.job_id.clone().unwrap_or_else(|| "-".into());
                let state = states.get(&job).cloned().unwrap_or_else(|| "-".into());
                [m.id.clone(), job, state, m.dir.display().to_string()]
            })
            .collect();
        print!(
            "{}",
            vigil_report::term_safe(&table(&["EXPERIMENT", "JOB", "STATE", "DIRECTORY"], &rows))
        );
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => fail("list", e),
    }
}

fn table(head: &[&str; 4], rows: &[[String; 4]]) -> String {
    let mut w = head.map(str::len);
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: [&str; 4]| {
        format!(
            "{:<a$}  {:<b$}  {:<c$}  {}\n",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            a = w[0],
            b = w[1],
            c = w[2]
        )
    };
    let mut s = line(*head);
    for r in rows {
        s.push_str(&line([&r[0], &r[1], &r[2], &r[3]]));
    }
    s
}

pub fn attach(a: &AttachArgs) -> i32 {
    let run = || -> Result<std::convert::Infallible, Error> {
        let m = find(Some(&a.experiment))?;
        if !m.interactive {
            return err(format!(
                "experiment {} is a batch job, not an interactive allocation; see vigil status/logs {}, or start one with vigil launch --interactive",
                m.id, m.id
            ));
        }
        let script = m.dir.join("attach.sh");
        use std::os::unix::process::CommandExt;
        let e = std::process::Command::new("bash")
            .arg(&script)
            .args(&a.command)
            .exec();
        err(format!("cannot run bash {}: {e}", script.display()))
    };
    match run() {
        Ok(never) => match never {},
        Err(e) => fail("attach", e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_block_reads_as_nemo_runs() {
        let m = Meta {
            id: "nemo-demo-run_20250721-184322".into(),
            name: "nemo-demo-run".into(),
            job_id: Some("75".into()),
            partition: Some("a3m".into()),
            interactive: false,
            created: 0.0,
            dir: "/h/experiments/nemo-demo-run/nemo-demo-run_20250721-184322".into(),
        };
        assert_eq!(
            status_block(&m, "RUNNING"),
            "Experiment Status for nemo-demo-run_20250721-184322\n\nTask 0: nemo-demo-run\n- Status: RUNNING\n- Executor: SlurmExecutor on a3m\n- Job id: 75\n- Local Directory: /h/experiments/nemo-demo-run/nemo-demo-run_20250721-184322\n"
        );
    }

    #[test]
    fn control_bytes_are_escaped_across_chunks() {
        let mut out = Vec::new();
        let mut c2 = false;
        escape_bytes(b"a\x1b[2Jb\r\n\t\xc2", &mut c2, &mut out);
        assert!(c2);
        escape_bytes(b"\x9bc\xc2\xa9", &mut c2, &mut out);
        assert_eq!(out, b"a\\x1b[2Jb\\x0d\n\t\\x9bc\xc2\xa9");
    }

    #[test]
    fn table_aligns() {
        let t = table(
            &["EXPERIMENT", "JOB", "STATE", "DIRECTORY"],
            &[["a_1".into(), "7".into(), "RUNNING".into(), "/d".into()]],
        );
        assert_eq!(
            t,
            "EXPERIMENT  JOB  STATE    DIRECTORY\na_1         7    RUNNING  /d\n"
        );
    }
}
