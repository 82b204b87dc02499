//! NVRx's per-cycle info files (`--ft-cycle-info-dir`): node rank 0, NVRx's rendezvous host,
//! writes `cycle_info.<job>.<attempt>.<cycle>` when a cycle starts and points the link
//! `cycle_info.<job>.current` at it; the cycle's end time is written when it ends. Every rank
//! gets the link's path in `NVRX_CURRENT_CYCLE_INFO`. The content is NVRx 0.7's `NVRxCycleInfo`
//! as its launcher writes it (protobuf JSON, indent 2, proto field names, every field, the
//! `uint64` generation as a string, as protobuf's JSON mapping has it).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where and under which names the files go, fixed for the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleInfoPlan {
    /// Absolute.
    pub dir: PathBuf,
    /// `SLURM_ARRAY_JOB_ID`, else `SLURM_JOB_ID`, else empty (as NVRx).
    pub job_id: String,
    /// `SLURM_RESTART_CNT`, else 0.
    pub attempt_index: u32,
}

impl CycleInfoPlan {
    /// From the flag's directory (relative to `cwd`) and the agent's environment.
    pub fn new(dir: &Path, cwd: &Path, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let nonempty = |k: &str| env(k).filter(|v| !v.is_empty());
        CycleInfoPlan {
            dir: cwd.join(dir),
            job_id: nonempty("SLURM_ARRAY_JOB_ID")
                .or_else(|| nonempty("SLURM_JOB_ID"))
                .unwrap_or_default(),
            attempt_index: env("SLURM_RESTART_CNT")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    /// `NVRX_CURRENT_CYCLE_INFO`: the `.current` link.
    pub fn current_link(&self) -> PathBuf {
        self.dir.join(format!("cycle_info.{}.current", self.job_id))
    }

    fn file_name(&self, attempt: u32) -> String {
        format!(
            "cycle_info.{}.{}.{}",
            self.job_id, self.attempt_index, attempt
        )
    }
}

/// One cycle's record, field for field NVRx's `NVRxCycleInfo` (in its field-number order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CycleInfo {
    pub job_id: String,
    pub attempt_index: u32,
    pub cycle_number: u32,
    pub cycle_start_time: String,
    pub cycle_end_time: String,
    pub cycle_log_file: String,
    pub active_nodes: String,
    pub standby_nodes: String,
    #[serde(serialize_with = "as_string")]
    pub generation: u64,
    pub active_ranks: String,
}

fn as_string<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

impl CycleInfo {
    /// The file's text, as protobuf's `MessageToJson(indent=2)` writes it (no final newline;
    /// non-ASCII escaped, as its `ensure_ascii`).
    pub fn render(&self) -> String {
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        out
    }
}

/// ISO 8601 UTC with microseconds and `Z`, as NVRx's `utc_iso_now()`.
pub fn utc_iso(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// NVRx's `hostnames_to_slurm_nodelist` for the nodes vigil names: short names (before the
/// first `.`), `prefix[01-03,07]` when every name is a prefix and a number, else sorted and
/// comma-separated.
pub fn nodelist(hosts: &[String]) -> String {
    let short: Vec<&str> = hosts
        .iter()
        .filter(|h| !h.is_empty())
        .map(|h| h.split('.').next().unwrap_or("").trim())
        .collect();
    if short.is_empty() {
        return String::new();
    }
    let parsed: Option<Vec<(&str, &str)>> = short.iter().map(|n| split_number(n)).collect();
    let Some(parsed) = parsed else {
        let mut v: Vec<&str> = short.clone();
        v.sort_unstable();
        v.dedup();
        return v.join(",");
    };
    let mut prefixes: Vec<&str> = parsed.iter().map(|(p, _)| *p).collect();
    prefixes.sort_unstable();
    prefixes.dedup();
    let mut parts = Vec::new();
    for p in prefixes {
        let mut nums: Vec<(u64, &str)> = parsed
            .iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, s)| (s.parse().unwrap_or(0), *s))
            .collect();
        nums.sort_unstable();
        nums.dedup_by_key(|(n, _)| *n);
        if nums.len() == 1 {
            parts.push(format!("{p}{}", nums[0].1));
            continue;
        }
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < nums.len() {
            let mut j = i;
            while j + 1 < nums.len() && nums[j + 1].0 == nums[j].0 + 1 {
                j += 1;
            }
            ranges.push(if i == j {
                nums[i].1.to_string()
            } else {
                format!("{}-{}", nums[i].1, nums[j].1)
            });
            i = j + 1;
        }
        parts.push(format!("{p}[{}]", ranges.join(",")));
    }
    parts.join(",")
}

/// `node007` -> (`node`, `007`); none without a trailing number.
fn split_number(name: &str) -> Option<(&str, &str)> {
    let at = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    (at < name.len()).then(|| name.split_at(at))
}

/// NVRx's `ranks_to_range_str`: `[0,1,2,5]` -> `0-2,5`.
pub fn ranks(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The active nodes' group ranks in the order of their hosts' names (numbers by value), as
/// NVRx lists them; `hosts[i]` runs group rank `i`.
pub fn ranks_by_host(hosts: &[String]) -> String {
    let key = |h: &String| {
        let short = h.split('.').next().unwrap_or("").to_string();
        match split_number(&short) {
            Some((p, n)) => (p.to_string(), n.parse::<u64>().unwrap_or(0), short.clone()),
            None => (short.clone(), 0, short.clone()),
        }
    };
    let mut order: Vec<u32> = (0..hosts.len() as u32).collect();
    order.sort_by_key(|i| key(&hosts[*i as usize]));
    ranks(&order)
}

/// Writes the files of one run (node rank 0).
#[derive(Debug)]
pub struct CycleInfoWriter {
    plan: CycleInfoPlan,
    active_nodes: String,
    standby_nodes: String,
    active_ranks: String,
    /// The cycle whose end is not written yet.
    open: Option<CycleInfo>,
}

impl CycleInfoWriter {
    pub fn new(plan: CycleInfoPlan, active_nodes: String, active_ranks: String) -> Self {
        CycleInfoWriter {
            plan,
            active_nodes,
            standby_nodes: String::new(),
            active_ranks,
            open: None,
        }
    }

    /// The next cycle's nodes as the rendezvous joined them: `active[i]` runs group rank `i`.
    pub fn set_nodes(&mut self, active: &[String], standby: &[String]) {
        self.active_nodes = nodelist(active);
        self.standby_nodes = nodelist(standby);
        self.active_ranks = ranks_by_host(active);
    }

    /// Cycle `cycle` starts at `now`: ends the one before if it is still open, writes the new
    /// file and moves the `.current` link to it.
    pub fn start(&mut self, attempt: u32, now: &str) -> std::io::Result<()> {
        let ended = self.end(now);
        let info = CycleInfo {
            job_id: self.plan.job_id.clone(),
            attempt_index: self.plan.attempt_index,
            cycle_number: attempt,
            cycle_start_time: now.to_string(),
            cycle_end_time: String::new(),
            cycle_log_file: String::new(),
            active_nodes: self.active_nodes.clone(),
            standby_nodes: self.standby_nodes.clone(),
            generation: 0,
            active_ranks: self.active_ranks.clone(),
        };
        self.open = Some(info.clone());
        fs::create_dir_all(&self.plan.dir)?;
        let name = self.plan.file_name(attempt);
        write_replace(&self.plan.dir.join(&name), &info.render())?;
        let link = self.plan.current_link();
        let tmp = tmp_of(&link);
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp)?;
        fs::rename(&tmp, &link)?;
        ended
    }

    /// The open cycle ends at `now`: its file gets the end time (generation + 1).
    pub fn end(&mut self, now: &str) -> std::io::Result<()> {
        let Some(mut info) = self.open.take() else {
            return Ok(());
        };
        info.cycle_end_time = now.to_string();
        info.generation += 1;
        let path = self.plan.dir.join(self.plan.file_name(info.cycle_number));
        write_replace(&path, &info.render())
    }
}

fn tmp_of(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Written whole or not at all (temp file + rename), as NVRx's updates.
fn write_replace(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = tmp_of(path);
    let mut f = fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.flush()?;
    drop(f);
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_nodes_of_a_attempt_come_from_the_rendezvous_in_nvrxs_forms() {
        let hosts: Vec<String> = ["node10.cluster", "node9", "node11"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        // Group ranks 0, 1, 2 run on node10, node9, node11: by name, 1 (node9) comes first.
        assert_eq!(ranks_by_host(&hosts), "1,0,2");
        assert_eq!(ranks_by_host(&hosts[..0]), "");
        let dir = std::env::temp_dir().join(format!("vigil-cycle-info-{}", std::process::id()));
        let plan = CycleInfoPlan {
            dir: dir.clone(),
            job_id: "7".into(),
            attempt_index: 0,
        };
        let mut w = CycleInfoWriter::new(plan, String::new(), "0-2".into());
        w.set_nodes(&hosts, &["node12".to_string()]);
        w.start(0, "2026-11-26T15:00:00Z").unwrap();
        let text = std::fs::read_to_string(dir.join("cycle_info.7.0.0")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text.contains(r#""active_nodes": "node[9-11]""#), "{text}");
        assert!(text.contains(r#""standby_nodes": "node12""#), "{text}");
        assert!(text.contains(r#""active_ranks": "1,0,2""#), "{text}");
    }
    use super::*;

    #[test]
    fn the_file_is_nvrx_protobuf_json_field_for_field() {
        let info = CycleInfo {
            job_id: "4242".into(),
            attempt_index: 1,
            cycle_number: 3,
            cycle_start_time: "2025-02-05T14:30:00.123456Z".into(),
            cycle_end_time: String::new(),
            cycle_log_file: String::new(),
            active_nodes: "node[001-002]".into(),
            standby_nodes: String::new(),
            generation: 0,
            active_ranks: "0-1".into(),
        };
        let want = r#"{
  "job_id": "4242",
  "attempt_index": 1,
  "cycle_number": 3,
  "cycle_start_time": "2025-02-05T14:30:00.123456Z",
  "cycle_end_time": "",
  "cycle_log_file": "",
  "active_nodes": "node[001-002]",
  "standby_nodes": "",
  "generation": "0",
  "active_ranks": "0-1"
}"#;
        assert_eq!(info.render(), want);
    }

    #[test]
    fn non_ascii_is_escaped_as_python_json_does() {
        let mut info = CycleInfo {
            job_id: "é".into(),
            attempt_index: 0,
            cycle_number: 0,
            cycle_start_time: String::new(),
            cycle_end_time: String::new(),
            cycle_log_file: String::new(),
            active_nodes: String::new(),
            standby_nodes: String::new(),
            generation: 7,
            active_ranks: String::new(),
        };
        assert!(info.render().contains(r#""job_id": "\u00e9""#));
        info.job_id = "😀".into();
        assert!(info.render().contains(r#"\ud83d\ude00"#));
        assert!(info.render().contains(r#""generation": "7""#));
    }

    #[test]
    fn nodelists_and_ranks_as_nvrx_compresses_them() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            nodelist(&h(&["node002.c", "node001", "node005"])),
            "node[001-002,005]"
        );
        assert_eq!(nodelist(&h(&["node7"])), "node7");
        assert_eq!(nodelist(&h(&["beta", "alpha", "beta"])), "alpha,beta");
        assert_eq!(nodelist(&[]), "");
        assert_eq!(ranks(&[0, 1, 2, 5, 6]), "0-2,5-6");
        assert_eq!(ranks(&[4]), "4");
        assert_eq!(ranks(&[]), "");
    }

    #[test]
    fn the_plan_takes_the_array_job_first_and_the_restart_count() {
        let env = |k: &str| match k {
            "SLURM_ARRAY_JOB_ID" => Some("77".to_string()),
            "SLURM_JOB_ID" => Some("78".to_string()),
            "SLURM_RESTART_CNT" => Some("2".to_string()),
            _ => None,
        };
        let p = CycleInfoPlan::new(Path::new("ci"), Path::new("/w"), &env);
        assert_eq!(p.dir, Path::new("/w/ci"));
        assert_eq!((p.job_id.as_str(), p.attempt_index), ("77", 2));
        assert_eq!(p.current_link(), Path::new("/w/ci/cycle_info.77.current"));
        let none = |_: &str| None;
        let p = CycleInfoPlan::new(Path::new("/abs"), Path::new("/w"), &none);
        assert_eq!(p.current_link(), Path::new("/abs/cycle_info..current"));
    }

    #[test]
    fn start_and_end_write_the_files_and_move_the_link() {
        let dir = std::env::temp_dir().join(format!("vigil-ci-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let plan = CycleInfoPlan {
            dir: dir.clone(),
            job_id: "9".into(),
            attempt_index: 0,
        };
        let mut w = CycleInfoWriter::new(plan, "n1".into(), "0".into());
        w.start(0, "T0").unwrap();
        let link = dir.join("cycle_info.9.current");
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("cycle_info.9.0.0"));
        w.start(1, "T1").unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("cycle_info.9.0.1"));
        let first = fs::read_to_string(dir.join("cycle_info.9.0.0")).unwrap();
        assert!(first.contains(r#""cycle_end_time": "T1""#), "{first}");
        assert!(first.contains(r#""generation": "1""#), "{first}");
        w.end("T2").unwrap();
        w.end("T3").unwrap();
        let second = fs::read_to_string(&link).unwrap();
        assert!(second.contains(r#""cycle_end_time": "T2""#), "{second}");
        assert!(second.contains(r#""cycle_number": 1"#), "{second}");
        let _ = fs::remove_dir_all(&dir);
    }
}
