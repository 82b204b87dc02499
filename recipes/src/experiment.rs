//! Experiment directories: `$VIGIL_HOME/experiments/<name>/<name>_<YYYYMMDD-HHMMSS>/` (UTC),
//! holding the recipe, the script, `<jobid>.log`, `experiment.json`, and vigil's `runs/` and
//! `state/` (so the run directories' event logs and the job's ledger live under it).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use vigil_report::records::ExperimentError;

use crate::{err, Error};

/// What `vigil status`, `logs`, `cancel`, `list` and `attach` need to find a launch again: the
/// record `experiment.json` holds, whose schema is the events crate's.
pub use vigil_events::experiment::Experiment as Meta;

pub const META: &str = vigil_events::experiment::FILE;

/// `$VIGIL_HOME`, else `~/.vigil`; a relative one is taken from `cwd`, since the job's script
/// names the experiment directory from wherever the job starts.
pub fn home(env: &dyn Fn(&str) -> Option<String>, cwd: &Path) -> Result<PathBuf, Error> {
    let h =
        if let Some(h) = env("VIGIL_HOME").filter(|h| !h.is_empty()) {
            PathBuf::from(h)
        } else {
            match env("HOME").filter(|h| !h.is_empty()) {
                Some(h) => Path::new(&h).join(".vigil"),
                None => return err(
                    "neither VIGIL_HOME nor HOME is set; set VIGIL_HOME to where experiments go",
                ),
            }
        };
    Ok(if h.is_absolute() { h } else { cwd.join(h) })
}

/// `YYYYMMDD-HHMMSS` in UTC.
pub fn stamp(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_seconds(t).to_string();
    // 2026-11-23T15:28:32Z
    let digits: String = s.chars().filter(|c| c.is_ascii_digit()).collect();
    format!("{}-{}", &digits[..8], &digits[8..14])
}

/// Creates a new experiment directory (a second launch in the same second gets `-2`, `-3`...).
pub fn create(home: &Path, name: &str, now: SystemTime) -> Result<(String, PathBuf), Error> {
    let parent = home.join("experiments").join(name);
    std::fs::create_dir_all(&parent).map_err(|e| {
        Error(format!(
            "cannot create {}: {e}; set VIGIL_HOME to a writable directory",
            parent.display()
        ))
    })?;
    let base = format!("{name}_{}", stamp(now));
    for n in 1..1000 {
        let id = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let dir = parent.join(&id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                for sub in ["runs", "state"] {
                    std::fs::create_dir(dir.join(sub)).map_err(|e| {
                        Error(format!("cannot create {}: {e}", dir.join(sub).display()))
                    })?;
                }
                return Ok((id, dir));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    err(format!(
        "{} holds 999 experiments of this second already",
        parent.display()
    ))
}

pub fn write_meta(m: &Meta) -> Result<(), Error> {
    let path = m.dir.join(META);
    let tmp = m.dir.join(".experiment.json.tmp");
    std::fs::write(&tmp, m.encode())
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| Error(format!("cannot write {}: {e}", path.display())))
}

/// The launch recorded in `dir`; an error unless the record names its id and name, as every
/// launch writes them.
pub fn read_meta(dir: &Path) -> Result<Meta, Error> {
    let m = vigil_report::records::read_experiment(dir).map_err(|e| match e {
        ExperimentError::Read(e) => Error(format!(
            "{} is not an experiment directory ({}: {})",
            dir.display(),
            META,
            e.reason()
        )),
        e @ ExperimentError::Parse { .. } => Error(e.to_string()),
    })?;
    if m.id.is_empty() || m.name.is_empty() {
        return err(format!(
            "{}: not vigil's experiment record: it has no id or name",
            dir.join(META).display()
        ));
    }
    Ok(m)
}

/// Every experiment under `home`, oldest first. Directories without a readable record are left
/// out.
pub fn all(home: &Path) -> Vec<Meta> {
    let mut v = Vec::new();
    let Ok(names) = std::fs::read_dir(home.join("experiments")) else {
        return v;
    };
    for n in names.flatten() {
        let Ok(runs) = std::fs::read_dir(n.path()) else {
            continue;
        };
        for r in runs.flatten() {
            if let Ok(m) = read_meta(&r.path()) {
                v.push(m);
            }
        }
    }
    v.sort_by(|a, b| a.created.total_cmp(&b.created).then(a.id.cmp(&b.id)));
    v
}

/// Pure choice among `all`: an id, a name (its latest launch) or, with no query, the latest.
pub fn choose(all: &[Meta], query: Option<&str>) -> Result<Meta, Error> {
    let Some(q) = query else {
        return all
            .last()
            .cloned()
            .ok_or_else(|| Error("no experiments yet; start one with vigil launch RECIPE".into()));
    };
    if let Some(m) = all.iter().find(|m| m.id == q) {
        return Ok(m.clone());
    }
    if let Some(m) = all.iter().rev().find(|m| m.name == q) {
        return Ok(m.clone());
    }
    let near = crate::recipe::nearest(q, all.iter().map(|m| m.id.as_str()))
        .map(|n| format!("; did you mean `{n}`?"))
        .unwrap_or_default();
    err(format!(
        "no experiment `{q}`{near} (vigil list shows them; an experiment directory's path works too)"
    ))
}

/// An experiment by directory path, id or name; the latest with none.
pub fn find(home: &Path, query: Option<&str>) -> Result<Meta, Error> {
    if let Some(q) = query {
        let p = Path::new(q);
        if p.join(META).is_file() {
            return read_meta(&std::fs::canonicalize(p).unwrap_or_else(|_| p.into()));
        }
    }
    choose(&all(home), query)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn home_is_absolute() {
        let cwd = Path::new("/c");
        let env = |k: &str| (k == "VIGIL_HOME").then(|| "rel".to_string());
        assert_eq!(home(&env, cwd).unwrap(), Path::new("/c/rel"));
        let env = |k: &str| (k == "HOME").then(|| "/h".to_string());
        assert_eq!(home(&env, cwd).unwrap(), Path::new("/h/.vigil"));
        assert!(home(&|_: &str| None, cwd).is_err());
    }

    #[test]
    fn stamps_are_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_753_123_402);
        assert_eq!(stamp(t), "20250721-184322");
    }

    fn meta(id: &str, name: &str, created: f64) -> Meta {
        Meta {
            id: id.into(),
            name: name.into(),
            job_id: None,
            partition: None,
            interactive: false,
            created,
            dir: PathBuf::new(),
        }
    }

    #[test]
    fn choosing() {
        let all = [
            meta("a_1", "a", 1.0),
            meta("b_2", "b", 2.0),
            meta("a_3", "a", 3.0),
        ];
        assert_eq!(choose(&all, None).unwrap().id, "a_3");
        assert_eq!(choose(&all, Some("a")).unwrap().id, "a_3");
        assert_eq!(choose(&all, Some("a_1")).unwrap().id, "a_1");
        let e = choose(&all, Some("b_3")).unwrap_err();
        assert!(e.0.contains("did you mean `b_2`?"), "{e}");
        assert!(choose(&[], None)
            .unwrap_err()
            .0
            .contains("no experiments yet"));
    }
}
