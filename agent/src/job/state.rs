//! State a job keeps between its runs, and whose it is.
//!
//! A job has an *identity* when something outside vigil names it: `--rdzv-id`, a Slurm job id
//! (the same across requeues), an NGC job id. Only such a job has a state directory,
//! `<log-dir or $TMPDIR>/vigil-job-<id>/`, and only from there is anything loaded. A run without
//! an identity keeps what it learns in its own run directory and loads nothing, so one job never
//! inherits another's state (the defect of NVRx's shared default file).
//!
//! Every saved file says who wrote it: the job identity, the program and the job's shape. A file
//! whose writer differs from the job reading it is ignored with a note that names the difference,
//! even when the user pointed at it with `--timeouts-file`.
//!
//! What is decided here is pure (`Provenance::mismatch`, `decode`); reading and writing files is
//! the thin edge at the bottom.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::supervise::monitor::Timeouts;
use crate::values::file_safe;

/// Bumped when the file's meaning changes; an unknown version is ignored, never guessed at.
pub const FORMAT: u32 = 1;

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

/// `<base>/vigil-job-<id>/`: the state directory of a job with an identity.
pub fn job_state_dir(base: &Path, job_id: &str) -> PathBuf {
    base.join(format!("vigil-job-{}", file_safe(job_id)))
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
    /// `--timeouts-file` wins; else the job's state directory; else the run directory.
    pub fn resolve(flag: Option<&Path>, job_id: Option<&str>, base: &Path) -> TimeoutsPlace {
        let file = flag
            .map(Path::to_path_buf)
            .or_else(|| job_id.map(|id| job_state_dir(base, id).join("timeouts.json")));
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
        let base = Path::new("/l");
        let none = TimeoutsPlace::resolve(None, None, base);
        assert_eq!(none.load, None);
        assert_eq!(
            none.save_path(Path::new("/r")),
            PathBuf::from("/r/timeouts.json")
        );
        let slurm = TimeoutsPlace::resolve(None, Some("12/3"), base);
        assert_eq!(
            slurm.load,
            Some(PathBuf::from("/l/vigil-job-12_3/timeouts.json"))
        );
        let flag = TimeoutsPlace::resolve(Some(Path::new("/x/t.json")), Some("1"), base);
        assert_eq!(flag.load, Some(PathBuf::from("/x/t.json")));
        assert_eq!(flag.save_path(Path::new("/r")), PathBuf::from("/x/t.json"));
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
