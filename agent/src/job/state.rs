//! State a job keeps between its runs, and whose it is.
//!
//! A job has an *identity* when something outside vigil names it: `--rdzv-id`, a Slurm job id
//! (the same across requeues), an NGC job id. Only such a job has a state directory,
//! `<base>/vigil-job-<key>/` ([`Identity::key`]), and only from there is anything loaded. A run
//! without an identity keeps what it learns in its own run directory and loads nothing, so one job
//! never inherits another's state (the defect of NVRx's shared default file).
//!
//! Under Slurm the id alone does not name one job: ids start again at 1 when a controller's state
//! is new, and clusters share home directories. The key adds the cluster's name, and a job's
//! first allocation (`SLURM_RESTART_COUNT` unset or 0) loads nothing: whatever already sits in
//! its state directory was written by another job with the same id, and node rank 0 sets it
//! aside ([`set_aside`]).
//!
//! Every saved file says who wrote it: the job identity, the program and the job's shape. A file
//! whose writer differs from the job reading it is ignored with a note that names the difference,
//! even when the user pointed at it with `--timeouts-file`.
//!
//! What is decided here is pure (`Provenance::mismatch`, `decode`, `Identity::resolve`); reading
//! and writing files is the thin edge at the bottom.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::supervise::monitor::Timeouts;
use crate::values::file_safe;

/// Bumped when the file's meaning changes; an unknown version is ignored, never guessed at.
pub const FORMAT: u32 = 1;
/// The calculated timeouts' name in a state directory.
pub const TIMEOUTS_FILE: &str = "timeouts.json";

/// Who wrote a state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// The job identity, `None` for a run without one.
    pub job_id: Option<String>,
    /// What the ranks run: the training script's absolute path, `-m module`, or the command.
    pub program: String,
    pub nnodes: u32,
    /// Node rank 0's ranks per node.
    pub nproc_per_node: u32,
}

impl Provenance {
    /// Why state written by `self` must not be used by the job `reader`, if it must not.
    pub fn mismatch(&self, reader: &Provenance) -> Option<String> {
        let id = |i: &Option<String>| i.clone().unwrap_or_else(|| "a run without a job id".into());
        if self.job_id != reader.job_id {
            return Some(format!(
                "it was written by job {}, this is job {}",
                id(&self.job_id),
                id(&reader.job_id)
            ));
        }
        if self.program != reader.program {
            return Some(format!(
                "it was written for {}, this job runs {}",
                self.program, reader.program
            ));
        }
        if (self.nnodes, self.nproc_per_node) != (reader.nnodes, reader.nproc_per_node) {
            return Some(format!(
                "it was written by a job of {} node(s) x {} rank(s), this one is {} x {}",
                self.nnodes, self.nproc_per_node, reader.nnodes, reader.nproc_per_node
            ));
        }
        None
    }
}

/// The calculated-timeouts file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeoutsFile {
    pub vigil_state: u32,
    pub written_by: Provenance,
    /// RFC 3339, for people.
    pub written_at: String,
    pub timeouts: Timeouts,
}

/// What loading found.
#[derive(Debug, PartialEq)]
pub enum Loaded {
    Use(Timeouts),
    /// Ignored, and why (one line for the console).
    Ignore(String),
}

/// Decides whether `text`, a timeouts file's contents, applies to the job `reader`.
pub fn decode(text: &str, reader: &Provenance) -> Loaded {
    let v: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Loaded::Ignore(format!("it is not JSON ({e})")),
    };
    match v.get("vigil_state").and_then(|n| n.as_u64()) {
        Some(n) if n == u64::from(FORMAT) => {}
        Some(n) => return Loaded::Ignore(format!("it has format {n}; this vigil reads {FORMAT}")),
        None => {
            return Loaded::Ignore(
                "it does not say which job wrote it (an older vigil or a hand-written file)".into(),
            )
        }
    }
    let file: TimeoutsFile = match serde_json::from_value(v) {
        Ok(f) => f,
        Err(e) => return Loaded::Ignore(format!("it is malformed ({e})")),
    };
    match file.written_by.mismatch(reader) {
        Some(why) => Loaded::Ignore(why),
        None => Loaded::Use(file.timeouts),
    }
}

/// `<base>/vigil-job-<key>/`: the state directory of a job with an identity.
pub fn job_state_dir(base: &Path, key: &str) -> PathBuf {
    base.join(format!("{STATE_DIR_PREFIX}{}", file_safe(key)))
}

/// Every job state directory's name starts so.
pub const STATE_DIR_PREFIX: &str = "vigil-job-";

/// Whose state: what names the job, and whether this is its first allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `--rdzv-id`, `SLURM_JOB_ID` or NGC's job id.
    pub job_id: String,
    /// `SLURM_CLUSTER_NAME`, when the id is Slurm's.
    pub cluster: Option<String>,
    /// The id is Slurm's and `SLURM_RESTART_COUNT` is unset or 0: no earlier allocation of this
    /// job exists, so state kept under its key belongs to another job.
    pub first_allocation: bool,
}

impl Identity {
    /// The identity of a job named `job_id` (as `job::nodes` found it), from Slurm's variables.
    /// The id is Slurm's when it equals `SLURM_JOB_ID` (`--rdzv-id $SLURM_JOB_ID` included).
    pub fn resolve(job_id: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Option<Identity> {
        let job_id = job_id?.to_string();
        let slurm = env("SLURM_JOB_ID").is_some_and(|s| s.trim() == job_id);
        let nonempty = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        Some(Identity {
            cluster: slurm.then(|| nonempty("SLURM_CLUSTER_NAME")).flatten(),
            // An unreadable count is not taken for a first allocation: nothing is set aside.
            first_allocation: slurm
                && nonempty("SLURM_RESTART_COUNT").is_none_or(|c| c.parse::<u64>() == Ok(0)),
            job_id,
        })
    }

    /// The name state is kept under: `<cluster>-<id>` under Slurm, else the id.
    pub fn key(&self) -> String {
        match &self.cluster {
            Some(c) => format!("{c}-{}", self.job_id),
            None => self.job_id.clone(),
        }
    }
}

/// Where calculated timeouts are loaded from (if anywhere) and saved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutsPlace {
    /// `None`: a run without an identity and without `--timeouts-file` loads nothing.
    pub load: Option<PathBuf>,
    /// `None`: save into the run directory (known only once it exists).
    pub save: Option<PathBuf>,
}

impl TimeoutsPlace {
    /// `--timeouts-file` wins; else the state directory of a job with an identity; else the run
    /// directory.
    pub fn resolve(flag: Option<&Path>, state_dir: Option<&Path>) -> TimeoutsPlace {
        let file = flag
            .map(Path::to_path_buf)
            .or_else(|| state_dir.map(|d| d.join(TIMEOUTS_FILE)));
        TimeoutsPlace {
            load: file.clone(),
            save: file,
        }
    }

    pub fn save_path(&self, run_dir: &Path) -> PathBuf {
        self.save
            .clone()
            .unwrap_or_else(|| run_dir.join("timeouts.json"))
    }
}

/// The most a timeouts file may hold (20,000 sections fit many times over).
pub const TIMEOUTS_LIMIT: u64 = 16 << 20;

/// Reads the timeouts a run of the same job saved; anything else is ignored with a note.
pub fn load_timeouts(path: &Path, reader: &Provenance, note: &dyn Fn(&str)) -> Option<Timeouts> {
    let text = match vigil_bounded::read_string(path, TIMEOUTS_LIMIT) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return None,
        Err(e) => {
            note(&format!(
                "cannot read the timeouts file {}: {}; starting from the configured timeouts",
                path.display(),
                e.reason()
            ));
            return None;
        }
    };
    match decode(&text, reader) {
        Loaded::Use(t) => Some(t),
        Loaded::Ignore(why) => {
            note(&format!(
                "ignoring the timeouts file {}: {why}; starting from the configured timeouts (delete the file or pass another --timeouts-file)",
                path.display()
            ));
            None
        }
    }
}

/// Writes atomically (a temporary file renamed over the old one), creating the directory.
pub fn save_timeouts(path: &Path, by: &Provenance, t: &Timeouts) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = TimeoutsFile {
        vigil_state: FORMAT,
        written_by: by.clone(),
        written_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        timeouts: t.clone(),
    };
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&file)?)?;
    std::fs::rename(&tmp, path)
}

/// A state directory that cannot keep the job's state; refused before any rank starts.
#[derive(Debug, thiserror::Error)]
#[error("the job's state directory {} {why}: without it vigil cannot count requeues or progress across allocations; give --state-dir a writable directory that every node sees", dir.display())]
pub struct Unwritable {
    pub dir: PathBuf,
    pub why: String,
}

/// Creates `dir` if needed and proves a file can be written and synced there (a probe named by
/// `tag`, unique per agent, then removed): read-only, a file in the way, a full disk all fail.
pub fn check_writable(dir: &Path, tag: &str) -> Result<(), Unwritable> {
    let fail = |why: String| Unwritable {
        dir: dir.to_path_buf(),
        why,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(fail("is not a directory".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot be created ({e})")))?;
    let probe = dir.join(format!(".vigil-probe-{}", file_safe(tag)));
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&probe)?;
        f.write_all(b"vigil checks that the job's state can be written here\n")?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| fail(format!("cannot be written ({e})")))
}

/// Moves the state files `names` found in `dir` into `dir/set-aside-<stamp>/`, where another job
/// left them; returns that directory when something was moved. Nothing is deleted.
pub fn set_aside(dir: &Path, names: &[&str], stamp: &str) -> std::io::Result<Option<PathBuf>> {
    let found: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| dir.join(n).symlink_metadata().is_ok())
        .collect();
    if found.is_empty() {
        return Ok(None);
    }
    let to = dir.join(format!("set-aside-{}", file_safe(stamp)));
    std::fs::create_dir_all(&to)?;
    for n in found {
        std::fs::rename(dir.join(n), to.join(n))?;
    }
    Ok(Some(to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn prov(id: Option<&str>) -> Provenance {
        Provenance {
            job_id: id.map(str::to_string),
            program: "/w/train.py".into(),
            nnodes: 2,
            nproc_per_node: 4,
        }
    }

    fn timeouts() -> Timeouts {
        Timeouts {
            heartbeat: Some(Duration::from_secs(7)),
            ..Default::default()
        }
    }

    fn encoded(by: &Provenance) -> String {
        serde_json::to_string(&TimeoutsFile {
            vigil_state: FORMAT,
            written_by: by.clone(),
            written_at: "2026-11-23T00:00:00Z".into(),
            timeouts: timeouts(),
        })
        .unwrap()
    }

    #[test]
    fn an_absurd_hand_edited_value_is_ignored_not_a_panic() {
        let p = prov(Some("77"));
        let mut v: serde_json::Value = serde_json::from_str(&encoded(&p)).unwrap();
        v["timeouts"]["heartbeat"] = serde_json::json!(1e30);
        v["timeouts"]["sections"] = serde_json::json!({"step": 1e300});
        match decode(&v.to_string(), &p) {
            Loaded::Ignore(why) => assert!(why.contains("more than a year"), "{why}"),
            other => panic!("loaded {other:?}"),
        }
    }

    #[test]
    fn the_same_job_uses_what_it_saved() {
        let p = prov(Some("77"));
        assert_eq!(decode(&encoded(&p), &p), Loaded::Use(timeouts()));
    }

    #[test]
    fn another_job_script_or_shape_is_ignored_with_the_reason() {
        let mine = prov(Some("77"));
        let cases = [
            (prov(Some("78")), "job 78"),
            (prov(None), "a run without a job id"),
            (
                Provenance {
                    program: "/w/other.py".into(),
                    ..mine.clone()
                },
                "/w/other.py",
            ),
            (
                Provenance {
                    nproc_per_node: 8,
                    ..mine.clone()
                },
                "2 node(s) x 8",
            ),
        ];
        for (writer, says) in cases {
            match decode(&encoded(&writer), &mine) {
                Loaded::Ignore(why) => assert!(why.contains(says), "{why:?} lacks {says:?}"),
                other => panic!("{writer:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn files_that_do_not_say_who_wrote_them_are_ignored() {
        let p = prov(Some("1"));
        let bare = serde_json::to_string(&timeouts()).unwrap();
        for (text, says) in [
            (bare.as_str(), "does not say which job"),
            ("{", "not JSON"),
            (r#"{"vigil_state": 99}"#, "format 99"),
            (r#"{"vigil_state": 1, "timeouts": 3}"#, "malformed"),
        ] {
            match decode(text, &p) {
                Loaded::Ignore(why) => assert!(why.contains(says), "{why:?} lacks {says:?}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_a_job_with_an_identity_has_a_place_to_load_from() {
        let none = TimeoutsPlace::resolve(None, None);
        assert_eq!(none.load, None);
        assert_eq!(
            none.save_path(Path::new("/r")),
            PathBuf::from("/r/timeouts.json")
        );
        let job = job_state_dir(Path::new("/l"), "12/3");
        assert_eq!(job, PathBuf::from("/l/vigil-job-12_3"));
        let slurm = TimeoutsPlace::resolve(None, Some(&job));
        assert_eq!(
            slurm.load,
            Some(PathBuf::from("/l/vigil-job-12_3/timeouts.json"))
        );
        let flag = TimeoutsPlace::resolve(Some(Path::new("/x/t.json")), Some(&job));
        assert_eq!(flag.load, Some(PathBuf::from("/x/t.json")));
        assert_eq!(flag.save_path(Path::new("/r")), PathBuf::from("/x/t.json"));
    }

    fn env_of<'a>(
        pairs: &'a [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> + 'a {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_slurm_id_is_keyed_by_its_cluster_and_knows_its_first_allocation() {
        let first = env_of(&[("SLURM_JOB_ID", "1"), ("SLURM_CLUSTER_NAME", "alpha")]);
        let id = Identity::resolve(Some("1"), &first).unwrap();
        assert_eq!(id.key(), "alpha-1");
        assert!(id.first_allocation);
        for count in ["0", " 0 "] {
            let pairs = [
                ("SLURM_JOB_ID", "1"),
                ("SLURM_CLUSTER_NAME", "alpha"),
                ("SLURM_RESTART_COUNT", count),
            ];
            assert!(
                Identity::resolve(Some("1"), &env_of(&pairs))
                    .unwrap()
                    .first_allocation
            );
        }
        // A requeued job, or a count that does not read: not a first allocation.
        for count in ["1", "x"] {
            let pairs = [("SLURM_JOB_ID", "1"), ("SLURM_RESTART_COUNT", count)];
            let id = Identity::resolve(Some("1"), &env_of(&pairs)).unwrap();
            assert!(!id.first_allocation, "{count}");
            assert_eq!(id.key(), "1", "no cluster name: the id alone");
        }
        // --rdzv-id, NGC: the user's identity, no cluster, nothing set aside.
        let id = Identity::resolve(Some("run-7"), &first).unwrap();
        assert_eq!((id.key(), id.first_allocation), ("run-7".into(), false));
        assert_eq!(Identity::resolve(None, &first), None);
    }

    #[test]
    fn a_state_dir_that_cannot_be_written_is_named_with_the_fix() {
        let base = std::env::temp_dir().join(format!("vigil-state-w-{}", std::process::id()));
        let ok = base.join("a").join("b");
        check_writable(&ok, "t").unwrap();
        assert_eq!(
            std::fs::read_dir(&ok).unwrap().count(),
            0,
            "the probe is removed"
        );
        let file = base.join("f");
        std::fs::write(&file, "x").unwrap();
        for (dir, says) in [
            (file.clone(), "is not a directory"),
            (file.join("sub"), "cannot be created"),
        ] {
            let e = check_writable(&dir, "t").unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("give --state-dir"), "{e}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn another_jobs_state_is_set_aside_whole() {
        let dir = std::env::temp_dir().join(format!("vigil-state-a-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(set_aside(&dir, &["ledger.jsonl"], "s1").unwrap(), None);
        std::fs::write(dir.join("ledger.jsonl"), "old\n").unwrap();
        std::fs::write(dir.join("timeouts.json"), "{}").unwrap();
        std::fs::write(dir.join("keep.txt"), "mine").unwrap();
        let to = set_aside(
            &dir,
            &["ledger.jsonl", "timeouts.json"],
            "2026-01-01T000000Z",
        )
        .unwrap()
        .unwrap();
        assert_eq!(to, dir.join("set-aside-2026-01-01T000000Z"));
        assert_eq!(
            std::fs::read_to_string(to.join("ledger.jsonl")).unwrap(),
            "old\n"
        );
        assert!(to.join("timeouts.json").is_file());
        assert!(!dir.join("ledger.jsonl").exists() && !dir.join("timeouts.json").exists());
        assert!(dir.join("keep.txt").is_file(), "only the named files move");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn saved_files_round_trip_and_leave_no_temporary() {
        let dir = std::env::temp_dir().join(format!("vigil-state-test-{}", std::process::id()));
        let path = dir.join("sub").join("timeouts.json");
        let p = prov(Some("5"));
        save_timeouts(&path, &p, &timeouts()).unwrap();
        assert_eq!(
            load_timeouts(&path, &p, &|n| panic!("{n}")),
            Some(timeouts())
        );
        assert!(!path.with_extension("json.tmp").exists());
        let notes = std::cell::RefCell::new(Vec::new());
        assert_eq!(
            load_timeouts(&path, &prov(Some("6")), &|n| notes
                .borrow_mut()
                .push(n.to_string())),
            None
        );
        assert_eq!(notes.borrow().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
