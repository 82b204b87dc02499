//! The open alerts, kept between passes in one small JSON file (default
//! `$VIGIL_HOME/watch/alerts.json`) so that a problem is told once, however often cron runs
//! `vigil watch --once`, and its end is told once too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One open alert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Open {
    pub text: String,
    /// When it was sent (Unix seconds).
    pub since: f64,
}

/// Open alerts by job directory, then by problem key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Alerts {
    #[serde(default)]
    pub jobs: BTreeMap<String, BTreeMap<String, Open>>,
}

impl Alerts {
    /// The file's alerts; none when it is missing or unreadable (then every problem is told
    /// again, which is better than telling none).
    pub fn load(path: &Path) -> Alerts {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    /// Writes the file whole: a new temporary file beside it (a random name, created
    /// exclusively, so a link planted in a shared directory is never written through), renamed
    /// over it.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                d
            }
            None => Path::new("."),
        };
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".alerts.")
            .suffix(".tmp")
            .tempfile_in(dir)?;
        tmp.write_all((text + "\n").as_bytes())?;
        tmp.persist(path).map(|_| ()).map_err(|e| e.error)
    }
}

/// `$VIGIL_HOME/watch/alerts.json` (`$VIGIL_HOME` defaults to `~/.vigil`).
pub fn default_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    env("VIGIL_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".vigil")))
        .map(|h| h.join("watch").join("alerts.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_survive_a_save_and_a_load_and_a_missing_file_is_none() {
        let d = std::env::temp_dir().join(format!("vigil-watch-state-{}", std::process::id()));
        let p = d.join("w/alerts.json");
        assert_eq!(Alerts::load(&p), Alerts::default());
        let mut a = Alerts::default();
        a.jobs.entry("/j".into()).or_default().insert(
            "requeue_loop".into(),
            Open {
                text: "t".into(),
                since: 1.0,
            },
        );
        a.save(&p).unwrap();
        assert_eq!(Alerts::load(&p), a);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn saving_never_writes_through_a_planted_link() {
        let d = std::env::temp_dir().join(format!("vigil-watch-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "mine").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("alerts.json.tmp")).unwrap();
        let p = d.join("alerts.json");
        Alerts::default().save(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        assert_eq!(Alerts::load(&p), Alerts::default());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_default_file_is_under_vigil_home() {
        let env = |k: &str| (k == "HOME").then(|| "/h".to_string());
        assert_eq!(
            default_path(&env),
            Some(PathBuf::from("/h/.vigil/watch/alerts.json"))
        );
    }
}
