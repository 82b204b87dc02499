//! A checked recipe resolved against its cluster preset into a [`Job`]: names, ranks, time
//! limit, directories, environment, mounts, the store outside the job and vigil's own flags, and
//! the last checks on the facts of the machine it is submitted from.

use std::path::{Path, PathBuf};

use super::{image_is_file, is_identifier, is_name, nearest, slurm_time_secs, Origin, Recipe};
use crate::{err, presets, Error};

/// One mount `src:dst` or `src:dst:flags`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub src: String,
    pub dst: String,
    pub flags: Option<String>,
}

impl Mount {
    pub fn same(path: &Path) -> Mount {
        let p = path.display().to_string();
        Mount {
            src: p.clone(),
            dst: p,
            flags: None,
        }
    }

    pub fn parse(m: &str) -> Result<Mount, Error> {
        let parts: Vec<&str> = m.split(':').collect();
        match parts.as_slice() {
            [s, d] | [s, d, _] if !s.is_empty() && !d.is_empty() && !m.contains(',') => Ok(Mount {
                src: s.to_string(),
                dst: d.to_string(),
                flags: parts.get(2).map(|f| f.to_string()),
            }),
            _ => err(format!(
                "mount {m:?}: give `src:dst` or `src:dst:ro` (one per list entry, no commas)"
            )),
        }
    }

    pub fn render(&self) -> String {
        match &self.flags {
            Some(f) => format!("{}:{}:{f}", self.src, self.dst),
            None => format!("{}:{}", self.src, self.dst),
        }
    }
}

/// A complete, resolved recipe: what rendering and submitting use.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub name: String,
    pub cluster: Option<String>,
    pub nodes: u32,
    pub nproc_per_node: u32,
    pub gpus_per_node: u32,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub time: Option<String>,
    /// None only for an interactive allocation.
    pub script: Option<String>,
    pub args: Vec<String>,
    pub image: Option<String>,
    /// Every container mount: the preset's, the directories', then the recipe's own.
    pub mounts: Vec<Mount>,
    /// The recipe's own `mounts` (BCP workspaces).
    pub workspaces: Vec<Mount>,
    /// The job runs the vigil binary that launched it, so a container must see it.
    pub mount_vigil: bool,
    pub workdir: PathBuf,
    /// The recipe named its `workdir` (else it is where vigil launch ran).
    pub workdir_set: bool,
    pub dirs: Vec<(&'static str, PathBuf)>,
    /// The preset's environment overridden by the recipe's, in order.
    pub env: Vec<(String, String)>,
    pub secrets: Vec<String>,
    pub vigil_bin: String,
    pub instance: Option<String>,
    /// `vigil run` flags from `[vigil]`, rendered (`--max-restarts`, `3`).
    pub vigil_args: Vec<String>,
    /// The store outside the job, when the recipe names one.
    pub store: Option<Store>,
}

/// A store outside the job (`store`, `store_secret_file`).
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    pub host: String,
    pub port: u16,
    /// Absolute; the batch script reads it at run time, its content is never written.
    pub secret_file: PathBuf,
    /// `vigil run`'s words for it: `--master-addr HOST --master-port PORT --rdzv-conf ...`
    /// (is_host=false after the `[vigil]` table's own rdzv_conf, which `vigil_args` then lacks).
    pub args: Vec<String>,
}

/// Resolves a recipe against its preset: defaults, completeness and the checks that need no
/// I/O. `cwd` makes relative directories absolute; `vigil_bin` is the running binary's path.
/// The first problem found is the error, in the order of the checks below.
pub fn resolve(
    r: &Recipe,
    origin: &Origin,
    cwd: &Path,
    vigil_bin: &str,
    interactive: bool,
) -> Result<Job, Error> {
    let name = job_name(r, origin)?;
    let preset = preset_of(r, origin)?;
    let (nodes, gpus_per_node, nproc_per_node) = ranks(r, origin, preset)?;
    let time = time_limit(r, origin)?;
    let script = script(r, origin, interactive)?;
    check_one_names(r, origin)?;
    let workdir = r
        .workdir
        .as_deref()
        .map(|p| absolute(cwd, p))
        .unwrap_or_else(|| cwd.into());
    let dirs = job_dirs(r, cwd, &workdir);
    let env = job_env(r, origin, preset)?;
    let (mounts, workspaces) = job_mounts(r, origin, preset, &dirs, cwd)?;
    let store = store(r, origin, cwd)?;
    let mut vigil_args = vigil_args(r);
    if store.is_some() {
        // The store's --rdzv-conf carries the table's own settings.
        if let Some(i) = vigil_args.iter().position(|a| a == "--rdzv-conf") {
            vigil_args.drain(i..i + 2);
        }
    }
    let job = Job {
        name,
        cluster: r.cluster.clone(),
        nodes,
        nproc_per_node,
        gpus_per_node,
        partition: r.partition.clone(),
        account: r.account.clone(),
        time,
        script,
        args: r.args.clone(),
        image: r.image.clone(),
        mounts,
        workspaces,
        mount_vigil: r.vigil_bin.is_none(),
        workdir,
        workdir_set: r.workdir.is_some(),
        dirs,
        env,
        secrets: r.secrets.clone(),
        vigil_bin: r.vigil_bin.clone().unwrap_or_else(|| vigil_bin.to_string()),
        instance: r.instance.clone(),
        vigil_args,
        store,
    };
    no_control_characters(&job, origin)?;
    Ok(job)
}

fn job_name(r: &Recipe, origin: &Origin) -> Result<String, Error> {
    let name = r.name.clone().ok_or_else(|| {
        Error(format!(
            "{}: the recipe has no `name`; add name = \"my-run\" or give --name",
            origin.of("name")
        ))
    })?;
    if !is_name(&name) {
        return err(format!(
            "{}: name {name:?} must be letters, digits, `-`, `_` or `.` (starting with a letter or digit), at most 100", origin.of("name")
        ));
    }
    Ok(name)
}

fn preset_of(r: &Recipe, origin: &Origin) -> Result<Option<&'static presets::Preset>, Error> {
    let Some(c) = &r.cluster else {
        return Ok(None);
    };
    presets::find(c).map(Some).ok_or_else(|| {
        let near = nearest(c, presets::names()).unwrap_or("hcc-a3m");
        Error(format!(
            "{}: unknown cluster `{c}`; did you mean `{near}`? (presets: {})",
            origin.of("cluster"),
            presets::names().join(", ")
        ))
    })
}

/// Nodes, GPUs per node and ranks per node: the recipe's, else the preset's, else one rank per
/// GPU.
fn ranks(
    r: &Recipe,
    origin: &Origin,
    preset: Option<&presets::Preset>,
) -> Result<(u32, u32, u32), Error> {
    let nodes = r.nodes.unwrap_or(1);
    if nodes == 0 {
        return err(format!("{}: nodes = 0; give 1 or more", origin.of("nodes")));
    }
    let gpus_per_node = r
        .gpus_per_node
        .or(preset.map(|p| p.gpus_per_node))
        .unwrap_or(0);
    let nproc_per_node = match r.nproc_per_node {
        Some(0) => return err(format!("{}: nproc_per_node = 0; give 1 or more", origin.of("nproc_per_node"))),
        Some(n) => n,
        None if gpus_per_node > 0 => gpus_per_node,
        None => {
            return err(format!(
                "{origin}: the recipe has no `nproc_per_node` (ranks per node); add nproc_per_node = 8, name a `cluster` preset, or give --nproc-per-node"
            ))
        }
    };
    Ok((nodes, gpus_per_node, nproc_per_node))
}

/// `time` in Slurm's own form.
fn time_limit(r: &Recipe, origin: &Origin) -> Result<Option<String>, Error> {
    let Some(t) = &r.time else {
        return Ok(None);
    };
    match slurm_time_secs(t) {
        Some(secs) => Ok(Some(crate::slurm::slurm_time(secs))),
        None => err(format!(
            "{}: time = {t:?} is not a time limit; give HH:MM:SS (e.g. \"04:00:00\"), D-HH:MM:SS, or 4h, 90m, 1d, 1h30m as vigil run --time-limit takes",
            origin.of("time")
        )),
    }
}

/// The training script; an interactive job may have none.
fn script(r: &Recipe, origin: &Origin, interactive: bool) -> Result<Option<String>, Error> {
    match (&r.script, interactive) {
        (Some(s), _) if s.is_empty() => err(format!(
            "{}: script is empty; give the training script's path",
            origin.of("script")
        )),
        (Some(s), _) => Ok(Some(s.clone())),
        (None, true) => Ok(None),
        (None, false) => err(format!(
            "{}: the recipe has no `script`; add script = \"train.py\" or give --script",
            origin.of("script")
        )),
    }
}

/// `partition` and `account` each name one thing.
fn check_one_names(r: &Recipe, origin: &Origin) -> Result<(), Error> {
    for (what, v) in [("partition", &r.partition), ("account", &r.account)] {
        if let Some(v) = v {
            if v.is_empty() || v.contains(|c: char| c.is_whitespace() || c == ',') {
                return err(format!(
                    "{}: {what} = {v:?} must be one name (no spaces or commas)",
                    origin.of(what)
                ));
            }
        }
    }
    Ok(())
}

fn absolute(cwd: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

/// The job's directories by key, absolute, the working directory first.
fn job_dirs(r: &Recipe, cwd: &Path, workdir: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut dirs = vec![("workdir", workdir.to_path_buf())];
    for (key, d) in [
        ("log_dir", &r.log_dir),
        ("cache_dir", &r.cache_dir),
        ("data_dir", &r.data_dir),
    ] {
        if let Some(d) = d {
            dirs.push((key, absolute(cwd, d)));
        }
    }
    dirs
}

/// The preset's variables the recipe does not set, then the recipe's; the secrets are checked to
/// be names only, never also in `env`.
fn job_env(
    r: &Recipe,
    origin: &Origin,
    preset: Option<&presets::Preset>,
) -> Result<Vec<(String, String)>, Error> {
    let mut env: Vec<(String, String)> = preset
        .map(|p| {
            p.env
                .iter()
                .filter(|(k, _)| !r.env.contains_key(*k))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    for (k, v) in &r.env {
        if !is_identifier(k) {
            let origin = origin.of(&format!("env.{k}"));
            return err(format!(
                "{origin}: env key {k:?} is not a variable name (letters, digits, `_`)"
            ));
        }
        env.push((k.clone(), v.clone()));
    }
    for s in &r.secrets {
        let origin = origin.of("secrets");
        if !is_identifier(s) {
            return err(format!(
                "{origin}: secret {s:?} is not a variable name; secrets list the names of variables (\"HF_TOKEN\"), never their values"
            ));
        }
        if r.env.contains_key(s) {
            return err(format!(
                "{origin}: {s} is both a secret and in `env`; a secret's value must not be written in the recipe: remove env.{s} and export it before vigil launch"
            ));
        }
    }
    Ok(env)
}

/// A container job's mounts (the preset's, the job's directories, the recipe's `mounts` made
/// absolute) and the recipe's mounts as written (`workspaces`); no mounts without an image.
fn job_mounts(
    r: &Recipe,
    origin: &Origin,
    preset: Option<&presets::Preset>,
    dirs: &[(&str, PathBuf)],
    cwd: &Path,
) -> Result<(Vec<Mount>, Vec<Mount>), Error> {
    let mut mounts = Vec::new();
    let mut workspaces = Vec::new();
    if r.image.is_none() {
        if !r.mounts.is_empty() {
            return err(format!(
                "{}: `mounts` needs a container `image`; without one the job sees the host's files as they are", origin.of("mounts")
            ));
        }
        return Ok((mounts, workspaces));
    }
    if let Some(p) = preset {
        mounts.extend(p.mounts.iter().map(|m| Mount::same(Path::new(m))));
    }
    mounts.extend(dirs.iter().map(|(_, d)| Mount::same(d)));
    for m in &r.mounts {
        let mut m = Mount::parse(m).map_err(|e| Error(format!("{}: {e}", origin.of("mounts"))))?;
        workspaces.push(m.clone());
        if !Path::new(&m.src).is_absolute() {
            m.src = absolute(cwd, Path::new(&m.src)).display().to_string();
        }
        mounts.push(m);
    }
    Ok((mounts, workspaces))
}

/// `store = "HOST:PORT"` and its `store_secret_file`, checked; `[vigil]` may not also say where
/// the store is or whether this job hosts it.
fn store(r: &Recipe, origin: &Origin, cwd: &Path) -> Result<Option<Store>, Error> {
    let Some(value) = &r.store else {
        if r.store_secret_file.is_some() {
            return err(format!(
                "{}: store_secret_file is for a store outside the job; add store = \"HOST:PORT\" (the `vigil store --listen` service) or remove it",
                origin.of("store_secret_file")
            ));
        }
        return Ok(None);
    };
    let at = origin.of("store");
    plain(at, "store", value)?;
    let fix = "give store = \"HOST:PORT\", the address `vigil store --listen` serves on (e.g. \"login1:29400\")";
    let Some((host, port)) = value.rsplit_once(':') else {
        return err(format!("{at}: store = {value:?} has no port; {fix}"));
    };
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) if !v6.is_empty() && v6.chars().all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.')) => v6,
        _ if !host.is_empty()
            && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) => host,
        _ => return err(format!(
            "{at}: store = {value:?}: the host {host:?} is not a host name or address (letters, digits, `-`, `.`; an IPv6 address in brackets); {fix}"
        )),
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => {
            return err(format!(
                "{at}: store = {value:?}: the port {port:?} is not 1-65535; {fix}"
            ))
        }
    };
    let Some(file) = &r.store_secret_file else {
        return err(format!(
            "{at}: store needs store_secret_file = \"PATH\", the file holding the service's secret (its VIGIL_STORE_SECRET or --secret-file); the batch script reads it at run time"
        ));
    };
    let secret_file = absolute(cwd, file);
    plain(
        origin.of("store_secret_file"),
        "store_secret_file",
        &secret_file.to_string_lossy(),
    )?;
    for key in ["master_port", "rdzv_endpoint"] {
        if r.vigil.contains_key(key) {
            return err(format!(
                "{}: `vigil.{key}` and `store` both say where the store is; `store` sets --master-addr and --master-port: remove vigil.{key}",
                origin.of(&format!("vigil.{key}"))
            ));
        }
    }
    let mut conf = match r.vigil.get("rdzv_conf") {
        Some(toml::Value::String(c)) if !c.trim().is_empty() => {
            format!("{},", c.trim().trim_end_matches(','))
        }
        _ => String::new(),
    };
    if conf.split(',').any(|kv| {
        kv.trim()
            .split('=')
            .next()
            .is_some_and(|k| k.trim() == "is_host")
    }) {
        return err(format!(
            "{}: `store` sets is_host=false (no agent hosts the store); remove is_host from vigil.rdzv_conf",
            origin.of("vigil.rdzv_conf")
        ));
    }
    conf.push_str("is_host=false");
    Ok(Some(Store {
        host: host.to_string(),
        port,
        secret_file,
        args: vec![
            "--master-addr".into(),
            host.to_string(),
            "--master-port".into(),
            port.to_string(),
            "--rdzv-conf".into(),
            conf,
        ],
    }))
}

/// `[vigil]` as `vigil run` flags: `true` a switch, `false` left out, anything else its value.
fn vigil_args(r: &Recipe) -> Vec<String> {
    let mut args = Vec::new();
    for (k, v) in &r.vigil {
        let flag = format!("--{}", k.replace('_', "-"));
        match v {
            toml::Value::Boolean(true) => args.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => args.extend([flag, s.clone()]),
            other => args.extend([flag, other.to_string()]),
        }
    }
    args
}

/// Refuses a control character in `value`, which a rendered script would hold: a newline ends a
/// `#SBATCH` comment line and what follows runs as a command. `what` names the key.
pub fn plain(origin: &str, what: &str, value: &str) -> Result<(), Error> {
    match value.chars().find(|c| c.is_control()) {
        None => Ok(()),
        Some(c) => err(format!(
            "{origin}: {what} {value:?} holds a control character (U+{:04X}); a rendered batch script takes none (a newline would end a line and run the rest as a command): remove it",
            u32::from(c)
        )),
    }
}

/// [`plain`] over every text of the job that rendering writes into a script or a command line.
fn no_control_characters(job: &Job, origin: &Origin) -> Result<(), Error> {
    let one =
        |what: &str, v: &str| plain(origin.of(what.split(' ').next().unwrap_or(what)), what, v);
    let opt = |what: &str, v: &Option<String>| v.as_deref().map_or(Ok(()), |v| one(what, v));
    one("name", &job.name)?;
    opt("cluster", &job.cluster)?;
    opt("partition", &job.partition)?;
    opt("account", &job.account)?;
    opt("time", &job.time)?;
    opt("script", &job.script)?;
    opt("image", &job.image)?;
    opt("instance", &job.instance)?;
    one("vigil_bin", &job.vigil_bin)?;
    for a in &job.args {
        one("args entry", a)?;
    }
    for m in job.mounts.iter().chain(&job.workspaces) {
        one("mount", &m.render())?;
    }
    for (key, d) in &job.dirs {
        one(key, &d.to_string_lossy())?;
    }
    for (k, v) in &job.env {
        one("env key", k)?;
        one(&format!("env.{k}"), v)?;
    }
    for s in &job.secrets {
        one("secret", s)?;
    }
    for a in &job.vigil_args {
        one("[vigil] value", a)?;
    }
    Ok(())
}

/// An environment lookup (the submitting process's, or a test's).
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What the checks before submitting found out about the world.
pub struct Facts<'a> {
    /// `sinfo`'s partitions; None when the partition is not checked (dry run, BCP).
    pub partitions: Option<Vec<String>>,
    pub exists: &'a dyn Fn(&Path) -> bool,
    /// The submitting environment, for secrets; None when not checked (dry run).
    pub env: Option<EnvFn<'a>>,
    /// Whether a file can be opened for reading (`store_secret_file`), its error if not.
    pub readable: &'a dyn Fn(&Path) -> Result<(), String>,
}

/// The checks before anything is submitted: partition, image file, script, secrets, the
/// directories that must exist (`workdir`, `data_dir`; `log_dir` and `cache_dir` are created).
pub fn check(job: &Job, facts: &Facts) -> Result<(), Error> {
    if let (Some(p), Some(list)) = (&job.partition, &facts.partitions) {
        if !list.iter().any(|l| l == p) {
            return err(format!(
                "partition `{p}` does not exist here; sinfo lists: {}; give one of them with --partition or `partition = ...` (nothing was submitted)",
                list.join(", ")
            ));
        }
    }
    if let Some(img) = &job.image {
        if image_is_file(img) {
            let p = abs_in(&job.workdir, img);
            if !(facts.exists)(&p) {
                return err(format!(
                    "image {} does not exist; give the path of a .sqsh file, or a registry reference such as nvcr.io#nvidia/nemo:24.05",
                    p.display()
                ));
            }
        }
    }
    if let Some(s) = &job.script {
        let p = abs_in(&job.workdir, s);
        // In a container an absolute path may be the image's own (/opt/NeMo/...); a relative
        // one is under the work directory, which is mounted, so it must exist on the host.
        let must = job.image.is_none() || !Path::new(s).is_absolute();
        if must && !(facts.exists)(&p) {
            return err(format!(
                "script {} does not exist (relative paths are under the work directory {}); fix `script` or `workdir`",
                p.display(),
                job.workdir.display()
            ));
        }
    }
    if let Some(env) = facts.env {
        for s in &job.secrets {
            if env(s).is_none_or(|v| v.is_empty()) {
                return err(format!(
                    "secret {s} is not set in this environment; export {s}=... before vigil launch (its value passes to the job by name and is never written)"
                ));
            }
        }
    }
    if let Some(st) = &job.store {
        if let Err(e) = (facts.readable)(&st.secret_file) {
            return err(format!(
                "store_secret_file {} cannot be read ({e}); give the file holding the store service's secret (the job reads it at run time; its content is never written)",
                st.secret_file.display()
            ));
        }
    }
    for (key, d) in &job.dirs {
        // vigil launch creates these (docs/launch.md); the job's input must exist.
        if matches!(*key, "log_dir" | "cache_dir") {
            continue;
        }
        if !(facts.exists)(d) {
            return err(format!(
                "{key} {} does not exist; create it or fix `{key}`",
                d.display()
            ));
        }
    }
    Ok(())
}

fn abs_in(dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.into()
    } else {
        dir.join(p)
    }
}
