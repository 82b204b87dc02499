//! The recipe: a TOML file whose keys are the same everywhere (issue 12), overridden by flags,
//! checked, and resolved against its cluster preset into a `Job` that rendering needs no more
//! than.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{err, Error, RunOption};

/// A recipe as written. Every field may be absent in the file and given as a flag.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub name: Option<String>,
    pub cluster: Option<String>,
    pub nodes: Option<u32>,
    pub nproc_per_node: Option<u32>,
    pub gpus_per_node: Option<u32>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub time: Option<String>,
    pub script: Option<String>,
    #[serde(
        default,
        deserialize_with = "scalar_list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub args: Vec<String>,
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    pub workdir: Option<PathBuf>,
    pub log_dir: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    #[serde(
        default,
        deserialize_with = "scalar_map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub env: EnvTable,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The vigil binary the job runs (default: the one running `vigil launch`).
    pub vigil_bin: Option<String>,
    /// NVIDIA Base Command only: the instance type (`dgxa100.80g.8.norm`).
    pub instance: Option<String>,
    /// A store outside the job (`vigil store --listen`), `HOST:PORT`: every agent is its client.
    pub store: Option<String>,
    /// The file holding that store's secret, read by the batch script at run time.
    pub store_secret_file: Option<PathBuf>,
    /// `vigil run`'s own options by their long names, `max_restarts = 3`.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub vigil: toml::Table,
}

/// A number or a boolean where text is meant (`OMP_NUM_THREADS = 4`, `args = ["--steps", 5]`)
/// is taken as its text.
fn scalar_text(v: toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A recipe's `[env]` table: each variable's value as text.
pub type EnvTable = BTreeMap<String, String>;

fn scalar_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<EnvTable, D::Error> {
    BTreeMap::<String, toml::Value>::deserialize(d)?
        .into_iter()
        .map(|(k, v)| {
            scalar_text(v).map(|t| (k.clone(), t)).ok_or_else(|| {
                serde::de::Error::custom(format!("env.{k} must be text, a number or a boolean"))
            })
        })
        .collect()
}

fn scalar_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Vec::<toml::Value>::deserialize(d)?
        .into_iter()
        .map(|v| {
            scalar_text(v)
                .ok_or_else(|| serde::de::Error::custom("args must be a list of texts or numbers"))
        })
        .collect()
}

/// The recipe's top-level keys, for "did you mean".
pub const KEYS: &[&str] = &[
    "name",
    "cluster",
    "nodes",
    "nproc_per_node",
    "gpus_per_node",
    "partition",
    "account",
    "time",
    "script",
    "args",
    "image",
    "mounts",
    "workdir",
    "log_dir",
    "cache_dir",
    "data_dir",
    "env",
    "secrets",
    "vigil_bin",
    "instance",
    "store",
    "store_secret_file",
    "vigil",
];

/// `vigil run` options that `vigil launch` sets itself: a recipe names them by its own keys.
const RENDERED: &[(&str, &str)] = &[
    ("nnodes", "give `nodes`"),
    ("nproc-per-node", "give `nproc_per_node`"),
    ("node-rank", "Slurm gives every node its rank"),
    ("master-addr", "vigil finds node rank 0 from Slurm"),
    ("rdzv-id", "the Slurm job id is the job's identity"),
    ("log-dir", "the experiment directory holds vigil's logs"),
    ("state-dir", "the experiment directory holds vigil's state"),
    ("print-completion", "it is not a run option"),
];

/// The key nearest to `key` among `known`, for "did you mean `...`?".
pub fn nearest<'a>(key: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), k))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parses a recipe file's text into its table (not yet checked), one line on error.
pub fn parse_table(text: &str, origin: &str) -> Result<toml::Table, Error> {
    text.parse::<toml::Table>().map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" (line {})", line_of(text, s.start)))
            .unwrap_or_default();
        Error(format!(
            "{origin}: not valid TOML{at}: {}",
            e.message().trim().replace('\n', " ")
        ))
    })
}

/// A flag's value as TOML: `3` is an integer, `["a", "b"]` a list, `true` a boolean; anything
/// that is not a TOML value (`debug`, `00:10:00`) is a string.
pub fn toml_value(text: &str) -> toml::Value {
    match format!("v = {text}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| text.into()),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

/// Sets a dotted key (`vigil.max_restarts`, `env.FOO`) in the table, creating tables on the way.
pub fn set_key(table: &mut toml::Table, dotted: &str, value: toml::Value) -> Result<(), Error> {
    let parts: Vec<&str> = dotted.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return err(format!(
            "--set {dotted}: give a key such as `partition` or `vigil.max_restarts`"
        ));
    }
    let (last, path) = parts.split_last().expect("split gives one part at least");
    let mut t = table;
    for p in path {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match entry {
            toml::Value::Table(inner) => inner,
            _ => {
                return err(format!(
                    "--set {dotted}: `{p}` is not a table in this recipe; set `{p}` itself"
                ))
            }
        };
    }
    t.insert(last.to_string(), value);
    Ok(())
}

/// The `vigil run` options a `[vigil]` table may name (dash spelling), given the agent's.
fn settable(run: &[RunOption]) -> Vec<&RunOption> {
    run.iter()
        .filter(|o| !RENDERED.iter().any(|(r, _)| *r == o.long) && o.long != "help")
        .collect()
}

/// Checks the keys of the table (top level and `[vigil]`) before deserializing, so that an
/// unknown key is named with the nearest known one.
pub fn check_keys(table: &toml::Table, origin: &Origin, run: &[RunOption]) -> Result<(), Error> {
    for key in table.keys() {
        if !KEYS.contains(&key.as_str()) {
            let near = nearest(key, KEYS.iter().copied()).unwrap_or("name");
            return err(format!(
                "{}: unknown key `{key}`; did you mean `{near}`? (docs/launch.md lists the keys)",
                origin.of(key)
            ));
        }
    }
    if let Some(v) = table.get("vigil") {
        let Some(vt) = v.as_table() else {
            return err(format!(
                "{}: `vigil` must be a table of vigil run's options, e.g. [vigil] max_restarts = 3",
                origin.of("vigil")
            ));
        };
        let ok = settable(run);
        for (key, value) in vt {
            let origin = origin.of(&format!("vigil.{key}"));
            let dash = key.replace('_', "-");
            if let Some((_, why)) = RENDERED.iter().find(|(r, _)| *r == dash) {
                return err(format!(
                    "{origin}: `vigil.{key}` is set by vigil launch itself: {why}"
                ));
            }
            let Some(opt) = ok.iter().find(|o| o.long == dash) else {
                let names: Vec<String> = ok.iter().map(|o| o.long.replace('-', "_")).collect();
                let near = nearest(key, names.iter().map(String::as_str)).unwrap_or("max_restarts");
                return err(format!(
                    "{origin}: unknown key `vigil.{key}`: not an option of vigil run; did you mean `vigil.{near}`?"
                ));
            };
            let fine = match value {
                toml::Value::Boolean(_) => !opt.takes_value,
                toml::Value::String(_) | toml::Value::Integer(_) | toml::Value::Float(_) => {
                    opt.takes_value
                }
                _ => false,
            };
            if !fine {
                let want = if opt.takes_value {
                    "a number or a string"
                } else {
                    "true or false"
                };
                return err(format!(
                    "{origin}: `vigil.{key}` takes {want} (it is vigil run's --{})",
                    opt.long
                ));
            }
        }
    }
    Ok(())
}

/// Deserializes a checked table; serde's message made one line.
pub fn from_table(table: toml::Table, origin: &Origin) -> Result<Recipe, Error> {
    // serde's message names no key: the key a flag gave that fails alone is the flag's.
    let alone_fails = |k: &str| {
        table.get(k).is_some_and(|v| {
            let one = toml::Table::from_iter([(k.to_string(), v.clone())]);
            Recipe::deserialize(toml::Value::Table(one)).is_err()
        })
    };
    let by_flag = origin
        .flag_keys()
        .map(|k| k.split('.').next().unwrap_or(k))
        .find(|k| alone_fails(k))
        .map(|k| origin.of(k).to_string());
    Recipe::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        Error(format!(
            "{}: {}",
            by_flag.unwrap_or_else(|| origin.to_string()),
            e.message().trim().replace('\n', " ")
        ))
    })
}

/// A time limit (Slurm's `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, or `4h`,
/// `90m`, `1d`, `1h30m` as `vigil run --time-limit` takes) in seconds; `None` when not one or zero.
pub fn slurm_time_secs(t: &str) -> Option<u64> {
    crate::slurm::parse_duration(t.trim())
        .ok()
        .map(|d| d.as_secs())
        .filter(|s| *s > 0)
}

/// Where each value of the recipe table came from: the file, or the flag that set it, so that
/// an error names what the user typed (`-t/--time`, `--set vigil.max_restarts`), not the file.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    file: String,
    flags: Vec<(String, String)>,
}

impl Origin {
    pub fn file(name: &str) -> Origin {
        Origin {
            file: name.to_string(),
            flags: Vec::new(),
        }
    }

    /// Records that `flag` set the (dotted) `key`; a later flag for the same key wins.
    pub fn set(&mut self, key: &str, flag: String) {
        self.flags.retain(|(k, _)| k != key);
        self.flags.push((key.to_string(), flag));
    }

    /// The (dotted) keys that flags set.
    pub fn flag_keys(&self) -> impl Iterator<Item = &str> {
        self.flags.iter().map(|(k, _)| k.as_str())
    }

    /// Who gave `key` (dotted): the flag that set it or one of its tables, else the file.
    pub fn of(&self, key: &str) -> &str {
        let mut k = key;
        loop {
            if let Some((_, f)) = self.flags.iter().find(|(fk, _)| fk == k) {
                return f;
            }
            match k.rsplit_once('.') {
                Some((parent, _)) => k = parent,
                None => return &self.file,
            }
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.file)
    }
}

fn is_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn is_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphanumeric())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && s.len() <= 100
}

/// A container image that names a file (rather than a registry reference such as
/// `nvcr.io#nvidia/nemo:24.05`).
pub fn image_is_file(image: &str) -> bool {
    image.starts_with('/')
        || image.starts_with("./")
        || image.starts_with("../")
        || image.ends_with(".sqsh")
        || image.ends_with(".squashfs")
}

mod resolve;
pub use resolve::*;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn run_opts() -> Vec<RunOption> {
        [
            ("max-restarts", true),
            ("max-requeues", true),
            ("stop-lead", true),
            ("module", false),
            ("log-dir", true),
            ("nproc-per-node", true),
            ("master-port", true),
            ("rdzv-conf", true),
            ("rdzv-endpoint", true),
        ]
        .iter()
        .map(|(l, v)| RunOption {
            long: l.to_string(),
            takes_value: *v,
        })
        .collect()
    }

    fn load(text: &str) -> Result<Recipe, Error> {
        let t = parse_table(text, "r.toml")?;
        check_keys(&t, &Origin::file("r.toml"), &run_opts())?;
        from_table(t, &Origin::file("r.toml"))
    }

    #[test]
    fn unknown_key_names_the_nearest() {
        let e = load("name = \"x\"\nnproc_per_nod = 2\n").unwrap_err();
        assert_eq!(
            e.0,
            "r.toml: unknown key `nproc_per_nod`; did you mean `nproc_per_node`? (docs/launch.md lists the keys)"
        );
        let e = load("[vigil]\nmax_restart = 2\n").unwrap_err();
        assert!(e.0.contains("did you mean `vigil.max_restarts`?"), "{e}");
        let e = load("[vigil]\nlog_dir = \"x\"\n").unwrap_err();
        assert!(e.0.contains("set by vigil launch itself"), "{e}");
        let e = load("[vigil]\nmodule = 3\n").unwrap_err();
        assert!(e.0.contains("takes true or false"), "{e}");
    }

    #[test]
    fn bad_toml_and_bad_types_are_one_line() {
        let e = load("name = \n").unwrap_err();
        assert!(e.0.starts_with("r.toml: not valid TOML (line 1)"), "{e}");
        assert!(!e.0.contains('\n'));
        let e = load("nodes = \"two\"\n").unwrap_err();
        assert!(e.0.starts_with("r.toml: ") && !e.0.contains('\n'), "{e}");
    }

    #[test]
    fn set_overrides_and_values() {
        let mut t = parse_table("name = \"a\"\n[vigil]\nmax_restarts = 1\n", "r").unwrap();
        set_key(&mut t, "vigil.max_restarts", toml_value("3")).unwrap();
        set_key(&mut t, "partition", toml_value("debug")).unwrap();
        set_key(&mut t, "args", toml_value("[\"--steps\", \"5\"]")).unwrap();
        set_key(&mut t, "time", toml_value("00:10:00")).unwrap();
        set_key(&mut t, "env.OMP_NUM_THREADS", toml_value("4")).unwrap();
        set_key(&mut t, "env.X", toml_value("a b")).unwrap();
        let r = from_table(t, &Origin::file("r")).unwrap();
        assert_eq!(r.vigil["max_restarts"].as_integer(), Some(3));
        assert_eq!(r.partition.as_deref(), Some("debug"));
        assert_eq!(r.args, ["--steps", "5"]);
        assert_eq!(r.time.as_deref(), Some("00:10:00"));
        assert_eq!(r.env["OMP_NUM_THREADS"], "4");
        assert_eq!(r.env["X"], "a b");
        let r = from_table(
            parse_table("args = [\"--steps\", 5, 0.5, true]\n", "r").unwrap(),
            &Origin::file("r"),
        )
        .unwrap();
        assert_eq!(r.args, ["--steps", "5", "0.5", "true"]);
        let e = from_table(
            parse_table("env = { A = [1] }\n", "r").unwrap(),
            &Origin::file("r"),
        )
        .unwrap_err();
        assert!(e.0.contains("env.A must be text"), "{e}");
        let mut t = toml::Table::new();
        assert!(set_key(&mut t, "a..b", toml_value("1")).is_err());
        set_key(&mut t, "name", toml_value("x")).unwrap();
        assert!(set_key(&mut t, "name.x", toml_value("1")).is_err());
    }

    #[test]
    fn slurm_times() {
        assert_eq!(slurm_time_secs("04:00:00"), Some(14400));
        assert_eq!(slurm_time_secs("90"), Some(5400));
        assert_eq!(slurm_time_secs("1:30"), Some(90));
        assert_eq!(slurm_time_secs("1-2"), Some(93600));
        assert_eq!(slurm_time_secs("1-0:0:10"), Some(86410));
        assert_eq!(slurm_time_secs("4h"), Some(14400));
        assert_eq!(slurm_time_secs("1h30m"), Some(5400));
        assert_eq!(slurm_time_secs("1d"), Some(86400));
        for bad in ["", "0", "0s", "soon", "a:b", "1-", "1:2:3:4", "-5"] {
            assert_eq!(slurm_time_secs(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_time_in_units_is_rendered_in_slurm_form() {
        let j = job("name = \"a\"\nscript = \"t\"\nnproc_per_node = 1\ntime = \"4h\"\n").unwrap();
        assert_eq!(j.time.as_deref(), Some("04:00:00"));
        let j = job("name = \"a\"\nscript = \"t\"\nnproc_per_node = 1\ntime = \"1d\"\n").unwrap();
        assert_eq!(j.time.as_deref(), Some("1-00:00:00"));
    }

    #[test]
    fn an_error_names_the_flag_that_gave_the_value() {
        let mut t = parse_table(
            "name = \"a\"\nscript = \"t\"\nnproc_per_node = 1\n",
            "my.toml",
        )
        .unwrap();
        let mut o = Origin::file("my.toml");
        t.insert("time".into(), toml::Value::String("soon".into()));
        o.set("time", "-t/--time".into());
        set_key(&mut t, "vigil.max_restart", toml_value("3")).unwrap();
        o.set("vigil.max_restart", "--set vigil.max_restart".into());
        let e = check_keys(&t, &o, &run_opts()).unwrap_err();
        assert!(
            e.0.starts_with("--set vigil.max_restart: unknown key"),
            "{e}"
        );
        t.get_mut("vigil").unwrap().as_table_mut().unwrap().clear();
        let r = from_table(t, &o).unwrap();
        let e = resolve(&r, &o, Path::new("/w"), "/bin/vigil", false).unwrap_err();
        assert!(e.0.starts_with("-t/--time: time = \"soon\""), "{e}");
        assert_eq!(o.of("env.X"), "my.toml");
        let mut t = parse_table("name = \"a\"\n", "my.toml").unwrap();
        set_key(&mut t, "nodes", toml_value("abc")).unwrap();
        o.set("nodes", "--set nodes".into());
        let e = from_table(t, &o).unwrap_err();
        assert!(e.0.starts_with("--set nodes: invalid type"), "{e}");
    }

    fn job(text: &str) -> Result<Job, Error> {
        resolve(
            &load(text)?,
            &Origin::file("r.toml"),
            Path::new("/w"),
            "/bin/vigil",
            false,
        )
    }

    #[test]
    fn a_store_is_host_port_with_its_secret_file() {
        let base = "name = \"a\"\nscript = \"t.py\"\nnproc_per_node = 1\n";
        let with = |extra: &str| job(&format!("{base}{extra}"));
        let j = with("store = \"login1:29400\"\nstore_secret_file = \"s/secret\"\n").unwrap();
        let st = j.store.unwrap();
        assert_eq!((st.host.as_str(), st.port), ("login1", 29400));
        assert_eq!(st.secret_file, Path::new("/w/s/secret"));
        let j = with("store = \"[fd00::1]:1\"\nstore_secret_file = \"/s\"\n").unwrap();
        assert_eq!(j.store.unwrap().host, "fd00::1");
        for (bad, want) in [
            ("login1", "has no port"),
            ("login1:0", "is not 1-65535"),
            ("login1:65536", "is not 1-65535"),
            ("login1:+80", "is not 1-65535"),
            ("login1:", "is not 1-65535"),
            (":29400", "is not a host name"),
            ("a b:29400", "is not a host name"),
            ("a;b:29400", "is not a host name"),
            ("fd00::1:29400", "is not a host name"),
            ("login1\\n:29400", "control character"),
        ] {
            let e = with(&format!("store = \"{bad}\"\nstore_secret_file = \"/s\"\n")).unwrap_err();
            assert!(
                e.0.starts_with("r.toml: store") && e.0.contains(want),
                "{bad}: {e}"
            );
        }
        let e = with("store = \"h:1\"\n").unwrap_err();
        assert!(e.0.contains("store needs store_secret_file"), "{e}");
        let e = with("store_secret_file = \"/s\"\n").unwrap_err();
        assert!(e.0.contains("add store = "), "{e}");
        let store = "store = \"h:1\"\nstore_secret_file = \"/s\"\n";
        let e = with(&format!("{store}[vigil]\nmaster_addr = \"x\"\n")).unwrap_err();
        assert!(e.0.contains("set by vigil launch itself"), "{e}");
        let e = with(&format!("{store}[vigil]\nmaster_port = 5\n")).unwrap_err();
        assert!(e.0.contains("`vigil.master_port` and `store`"), "{e}");
        let e = with(&format!("{store}[vigil]\nrdzv_endpoint = \"x:1\"\n")).unwrap_err();
        assert!(e.0.contains("`vigil.rdzv_endpoint` and `store`"), "{e}");
        let e = with(&format!("{store}[vigil]\nrdzv_conf = \"is_host=true\"\n")).unwrap_err();
        assert!(e.0.contains("remove is_host from vigil.rdzv_conf"), "{e}");
        let j = with(&format!(
            "{store}[vigil]\nrdzv_conf = \"join_timeout=9\"\nmax_restarts = 2\n"
        ))
        .unwrap();
        assert_eq!(j.vigil_args, ["--max-restarts", "2"]);
        assert_eq!(j.store.unwrap().args[5], "join_timeout=9,is_host=false");
    }

    #[test]
    fn an_unreadable_store_secret_file_is_refused() {
        let j = job("name = \"a\"\nscript = \"t.py\"\nnproc_per_node = 1\nstore = \"h:1\"\nstore_secret_file = \"/s\"\n").unwrap();
        let yes = |_: &Path| true;
        let f = Facts {
            partitions: None,
            exists: &yes,
            env: None,
            readable: &|_| Err("No such file or directory (os error 2)".into()),
        };
        let e = check(&j, &f).unwrap_err().0;
        assert!(
            e.starts_with("store_secret_file /s cannot be read (No such file"),
            "{e}"
        );
    }

    #[test]
    fn completeness() {
        assert!(job("script = \"t.py\"\nnproc_per_node = 1\n")
            .unwrap_err()
            .0
            .contains("no `name`"));
        assert!(job("name = \"a\"\nnproc_per_node = 1\n")
            .unwrap_err()
            .0
            .contains("no `script`"));
        assert!(job("name = \"a\"\nscript = \"t.py\"\n")
            .unwrap_err()
            .0
            .contains("no `nproc_per_node`"));
        assert!(job("name = \"a b\"\nscript = \"t\"\nnproc_per_node = 1\n").is_err());
        assert!(
            job("name = \"a\"\nscript = \"t\"\nnproc_per_node = 1\ntime = \"soon\"\n")
                .unwrap_err()
                .0
                .contains("HH:MM:SS")
        );
        let e = job("name = \"a\"\nscript = \"t\"\ncluster = \"hcc-a3\"\n").unwrap_err();
        assert!(e.0.contains("did you mean `hcc-a3m`?"), "{e}");
        let e = job("name = \"a\"\nscript = \"t\"\nnproc_per_node = 1\nsecrets = [\"HF_TOKEN\"]\nenv = { HF_TOKEN = \"x\" }\n").unwrap_err();
        assert!(e.0.contains("both a secret and in `env`"), "{e}");
    }

    #[test]
    fn control_characters_in_anything_rendered_are_refused() {
        let base = "name = \"a\"\nscript = \"t.py\"\nnproc_per_node = 1\n";
        for (extra, what) in [
            ("workdir = \"/w\\ntouch x #\"\n", "workdir"),
            ("args = [\"a\\tb\"]\n", "args entry"),
            ("env = { X = \"\\u001b]0;t\\u0007\" }\n", "env.X"),
            ("log_dir = \"/l\\r\"\n", "log_dir"),
            ("mounts = [\"/a:/b\\n\"]\nimage = \"i\"\n", "mount"),
            ("[vigil]\nstop_lead = \"x\\ny\"\n", "[vigil] value"),
        ] {
            let e = job(&format!("{base}{extra}")).unwrap_err().0;
            assert!(
                e.contains(what) && e.contains("control character") && !e.contains('\n'),
                "{extra}: {e}"
            );
        }
        let ok = job(&format!("{base}env = {{ X = \"a b $Y\" }}\n")).unwrap();
        assert_eq!(ok.env.last().unwrap().1, "a b $Y");
    }

    #[test]
    fn log_and_cache_dirs_need_not_exist_before_launch() {
        let j = job("name = \"a\"\nscript = \"t.py\"\nnproc_per_node = 1\nlog_dir = \"l\"\ncache_dir = \"c\"\ndata_dir = \"d\"\n").unwrap();
        let exists = |p: &Path| !matches!(p.to_str(), Some("/w/l" | "/w/c" | "/w/d"));
        let f = Facts {
            partitions: None,
            exists: &exists,
            env: None,
            readable: &|_| Ok(()),
        };
        let e = check(&j, &f).unwrap_err().0;
        assert!(e.starts_with("data_dir /w/d does not exist"), "{e}");
    }

    #[test]
    fn preset_gives_gpus_env_and_mounts_and_recipe_wins() {
        let j = job("name = \"a\"\nscript = \"t.py\"\ncluster = \"hcc-a3u\"\nimage = \"/i.sqsh\"\nenv = { NCCL_IB_TC = \"1\", X = \"y\" }\nmounts = [\"/d:/data:ro\"]\n[vigil]\nmax_restarts = 3\nmodule = true\n").unwrap();
        assert_eq!((j.nproc_per_node, j.gpus_per_node, j.nodes), (8, 8, 1));
        assert_eq!(
            j.env
                .iter()
                .filter(|(k, _)| k == "NCCL_IB_TC")
                .collect::<Vec<_>>(),
            [&("NCCL_IB_TC".to_string(), "1".to_string())]
        );
        assert_eq!(j.env.last().unwrap().0, "X");
        let m: Vec<String> = j.mounts.iter().map(Mount::render).collect();
        assert_eq!(m, ["/usr/local/gib:/usr/local/gib", "/w:/w", "/d:/data:ro"]);
        assert_eq!(j.vigil_args, ["--max-restarts", "3", "--module"]);
        assert_eq!(j.vigil_bin, "/bin/vigil");
    }

    #[test]
    fn checks_before_submitting() {
        let j = job("name = \"a\"\nscript = \"t.py\"\nnproc_per_node = 1\npartition = \"gpu\"\nsecrets = [\"HF_TOKEN\"]\n").unwrap();
        let yes = |_: &Path| true;
        let no_env = |_: &str| None;
        let f = Facts {
            partitions: Some(vec!["debug".into(), "low".into()]),
            exists: &yes,
            env: None,
            readable: &|_| Ok(()),
        };
        assert_eq!(check(&j, &f).unwrap_err().0, "partition `gpu` does not exist here; sinfo lists: debug, low; give one of them with --partition or `partition = ...` (nothing was submitted)");
        let f = Facts {
            partitions: Some(vec!["gpu".into()]),
            exists: &yes,
            env: Some(&no_env),
            readable: &|_| Ok(()),
        };
        assert!(check(&j, &f)
            .unwrap_err()
            .0
            .starts_with("secret HF_TOKEN is not set"));
        let no = |p: &Path| p != Path::new("/w/t.py");
        let f = Facts {
            partitions: None,
            exists: &no,
            env: None,
            readable: &|_| Ok(()),
        };
        assert!(check(&j, &f)
            .unwrap_err()
            .0
            .starts_with("script /w/t.py does not exist"));
    }

    proptest::proptest! {
        #[test]
        fn any_flag_value_round_trips_as_a_string_or_a_value(s in "[ -~]{0,20}") {
            let v = toml_value(&s);
            if let toml::Value::String(got) = &v {
                // Either the text itself or a TOML string literal's content.
                proptest::prop_assert!(got == &s || s.contains('"') || s.contains('\''));
            }
        }
    }
}
