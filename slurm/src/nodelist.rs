//! The variables that name a Slurm job's nodes, in the order vigil reads them: inside `srun` the
//! step's own list (the nodes the agents run on, which `SLURM_NODEID` indexes), then the job's,
//! then the name older Slurm versions used.

use crate::hostlist::{self, HostlistError};

/// The node-list variables, the first one set wins.
pub const NODELIST_VARS: [&str; 3] = [
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
];

/// The first node-list variable `env` gives, with its name. An empty value counts as given: pass
/// an `env` that filters empty values to skip them.
pub fn node_list(env: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    NODELIST_VARS.iter().find_map(|v| env(v).map(|l| (*v, l)))
}

/// Why the job's nodes could not be read from the environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeListError {
    #[error("SLURM_JOB_NODELIST is unset")]
    Unset,
    #[error("{var}={list:?} is not a Slurm hostlist: {source}")]
    NotAHostlist {
        var: &'static str,
        list: String,
        source: HostlistError,
    },
}

/// The job's nodes in node-rank order, and the variable that named them.
pub fn nodes(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(&'static str, Vec<String>), NodeListError> {
    let (var, list) = node_list(env).ok_or(NodeListError::Unset)?;
    match hostlist::expand(&list) {
        Ok(hosts) => Ok((var, hosts)),
        Err(source) => Err(NodeListError::NotAHostlist { var, list, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    }

    #[test]
    fn the_steps_list_comes_first_then_the_jobs_then_the_old_name() {
        let all = [
            ("SLURM_NODELIST", "old[1-2]"),
            ("SLURM_JOB_NODELIST", "job[1-3]"),
            ("SLURM_STEP_NODELIST", "step1"),
        ];
        assert_eq!(
            nodes(&env_of(&all)),
            Ok(("SLURM_STEP_NODELIST", vec!["step1".to_string()]))
        );
        assert_eq!(
            nodes(&env_of(&all[..2])).unwrap(),
            (
                "SLURM_JOB_NODELIST",
                vec!["job1".into(), "job2".into(), "job3".into()]
            )
        );
        assert_eq!(node_list(&env_of(&all[..1])).unwrap().0, "SLURM_NODELIST");
        assert_eq!(nodes(&env_of(&[])), Err(NodeListError::Unset));
    }

    #[test]
    fn an_empty_value_counts_unless_the_caller_skips_it() {
        let env = env_of(&[("SLURM_STEP_NODELIST", ""), ("SLURM_JOB_NODELIST", "n1")]);
        let e = nodes(&env).unwrap_err().to_string();
        assert!(
            e.starts_with("SLURM_STEP_NODELIST=\"\" is not a Slurm hostlist")
                && e.contains("no host"),
            "{e}"
        );
        let skip = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        assert_eq!(node_list(&skip), Some(("SLURM_JOB_NODELIST", "n1".into())));
    }
}
