//! An experiment's record, `experiment.json`: written by `vigil launch` into each experiment
//! directory once sbatch answered, read back by `vigil status`, `logs`, `cancel`, `list` and
//! `attach` (to find the launch again), by `vigil report` (the page's title) and by `vigil watch`
//! (the Slurm job to ask about).
//!
//! Reading is tolerant, as for the other records: a field the file lacks takes its default, so a
//! file holding only a `job_id` still names its Slurm job. What a launch must have (an id and a
//! name) is checked by the reader that needs it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub const FILE: &str = "experiment.json";

/// One launch, as `experiment.json` holds it (the fields in this order, pretty-printed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Experiment {
    /// `<name>_<YYYYMMDD-HHMMSS>`, the experiment directory's name.
    pub id: String,
    pub name: String,
    /// Unset until sbatch answered (and for a dry run).
    pub job_id: Option<String>,
    pub partition: Option<String>,
    pub interactive: bool,
    /// Unix seconds.
    pub created: f64,
    /// The experiment directory it was read from or is written to; not in the file.
    #[serde(skip)]
    pub dir: PathBuf,
}

impl Experiment {
    /// The file's text: pretty-printed JSON and a newline.
    pub fn encode(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serializes") + "\n"
    }

    /// The record in `text` (without its directory); an error when it is not a JSON object of
    /// these fields.
    pub fn decode(text: &str) -> Result<Experiment, serde_json::Error> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launched() -> Experiment {
        Experiment {
            id: "toy_20261123-153000".into(),
            name: "toy".into(),
            job_id: Some("75".into()),
            partition: None,
            interactive: true,
            created: 1_795_447_800.5,
            dir: PathBuf::from("/h/experiments/toy/toy_20261123-153000"),
        }
    }

    #[test]
    fn a_record_round_trips_without_its_directory() {
        let e = launched();
        let back = Experiment::decode(&e.encode()).unwrap();
        assert_eq!(
            back,
            Experiment {
                dir: PathBuf::new(),
                ..e
            }
        );
    }

    #[test]
    fn the_file_is_written_as_before() {
        assert_eq!(
            launched().encode(),
            "{\n  \"id\": \"toy_20261123-153000\",\n  \"name\": \"toy\",\n  \"job_id\": \"75\",\n  \"partition\": null,\n  \"interactive\": true,\n  \"created\": 1795447800.5\n}\n"
        );
    }

    #[test]
    fn missing_fields_take_their_defaults_and_unknown_ones_are_ignored() {
        let e = Experiment::decode(r#"{"job_id":"4242","newer":1}"#).unwrap();
        assert_eq!(e.job_id.as_deref(), Some("4242"));
        assert_eq!((e.id.as_str(), e.name.as_str()), ("", ""));
        assert!(Experiment::decode("[1]").is_err());
    }
}
