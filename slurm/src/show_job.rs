//! `scontrol show job`: `Key=Value` words, in the one-line form (`-o`) or the multi-line one.

use std::collections::BTreeMap;

/// One job's fields by key.
pub type Fields = BTreeMap<String, String>;

/// The first job `scontrol show job` describes (a heterogeneous job prints one record per
/// component, separated by a blank line; pass `-o` output one line at a time). A word without
/// `=` belongs to the value before it (`Command=`, `Reason=`, `JobName=` may hold spaces; they
/// are joined with one space). A key given twice keeps its last value.
pub fn parse(text: &str) -> Fields {
    let mut fields = Fields::new();
    let mut key: Option<String> = None;
    let record = text
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty());
    for tok in record.flat_map(str::split_whitespace) {
        match tok.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                fields.insert(k.to_string(), v.to_string());
                key = Some(k.to_string());
            }
            _ => {
                if let Some(v) = key.as_ref().and_then(|k| fields.get_mut(k)) {
                    v.push(' ');
                    v.push_str(tok);
                }
            }
        }
    }
    fields
}

/// Whether a value is one of the words Slurm prints for "not set": empty, `(null)`, `None`.
pub fn unset(value: &str) -> bool {
    matches!(value, "" | "(null)" | "None")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MULTI: &str = "JobId=75 JobName=pre train
   JobState=RUNNING Reason=None Dependency=(null)
   RunTime=00:00:05 TimeLimit=UNLIMITED TimeMin=N/A
   ReqNodeList=(null) ExcNodeList=
   NodeList=n[1-2]
   ReqTRES=cpu=2,node=2 AllocNode:Sid=host:123
   Command=/x/train.sh --lr 0.1
   Power=

JobId=76 JobName=second
   JobState=PENDING
";

    #[test]
    fn values_with_spaces_are_kept() {
        let f = parse("JobId=7 JobName=a b=c Reason=None Command=/x/y z JobState=RUNNING");
        assert_eq!(f["JobId"], "7");
        assert_eq!(f["JobName"], "a");
        assert_eq!(f["b"], "c");
        assert_eq!(f["Command"], "/x/y z");
        assert_eq!(f["JobState"], "RUNNING");
        let f = parse(MULTI);
        assert_eq!(f["JobName"], "pre train");
        assert_eq!(f["Command"], "/x/train.sh --lr 0.1");
    }

    #[test]
    fn the_agents_fields_read_alone_in_the_multi_line_form() {
        let f = parse(MULTI);
        assert_eq!(f["JobId"], "75", "the first record only");
        assert_eq!(f["JobState"], "RUNNING");
        assert_eq!(f["TimeLimit"], "UNLIMITED");
        assert_eq!(f["RunTime"], "00:00:05");
        assert_eq!(f["NodeList"], "n[1-2]", "ReqNodeList is its own key");
        assert_eq!(f["ReqNodeList"], "(null)");
        assert_eq!(f["ReqTRES"], "cpu=2,node=2", "an `=` in a value stays");
        assert_eq!(f["AllocNode:Sid"], "host:123");
        assert_eq!(f.get("Partition"), None);
    }

    #[test]
    fn empty_and_null_values_are_unset() {
        let f = parse(MULTI);
        assert_eq!(f["ExcNodeList"], "");
        assert_eq!(f["Power"], "");
        for key in [
            "ExcNodeList",
            "Power",
            "Reason",
            "Dependency",
            "ReqNodeList",
        ] {
            assert!(unset(&f[key]), "{key}");
        }
        assert!(!unset(&f["NodeList"]));
        assert!(parse("").is_empty());
        assert!(parse("slurm_load_jobs error: Invalid job id specified").is_empty());
    }

    #[test]
    fn leading_blank_lines_and_a_repeated_key() {
        let f = parse("\n\nJobId=1 Reason=a JobState=X Reason=b c\n");
        assert_eq!(f["JobId"], "1");
        assert_eq!(f["Reason"], "b c");
    }

    proptest! {
        /// Values without `=` round-trip, with their inner spaces collapsed to one.
        #[test]
        fn fields_round_trip(pairs in proptest::collection::btree_map("[A-Z][a-zA-Z]{0,8}", "[a-z0-9/()\\[\\],.-]{0,6}( [a-z0-9/.-]{1,6}){0,2}", 1..12)) {
            let line = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
            let f = parse(&line);
            prop_assert_eq!(f.len(), pairs.len());
            for (k, v) in &pairs {
                prop_assert_eq!(&f[k], v);
            }
        }

        #[test]
        fn never_panics(s in "\\PC{0,60}") {
            let _ = parse(&s);
        }
    }
}
