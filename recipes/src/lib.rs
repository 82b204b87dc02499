//! `vigil launch` and its companions: a training recipe (TOML) becomes an sbatch script (or an
//! `ngc base-command job run` line), an experiment directory and a Slurm job; `vigil status`,
//! `logs`, `cancel`, `list` and `attach` find it again. Rendering and validation are pure
//! functions; the Slurm commands and the file system are reached only from `slurm` and
//! `experiment` and the command functions in `cli`.

pub mod cli;
pub mod experiment;
pub mod presets;
pub mod recipe;
pub mod render;
pub mod slurm;

/// A one-line error for the user: what is wrong and how to fix it. A message, not a kind: every
/// caller prints it (`vigil <command>: error: ...`, exit status `cli::EXIT_USAGE`) and none
/// branches on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Self {
        Error(msg.into())
    }
}

pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error(msg.into()))
}

/// One of `vigil run`'s long options, as the agent's own parser knows it, so that a recipe's
/// `[vigil]` table is checked against the options this binary really has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOption {
    /// The dash spelling without `--`, e.g. `max-restarts`.
    pub long: String,
    /// false for a switch (`--module`), true for an option that takes a value.
    pub takes_value: bool,
}

/// `vigil run`'s line as a job renders it, for the agent's own parser to check before anything
/// is submitted (`vigil launch` is below the agent, so the agent passes the check in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLine {
    /// The words after `vigil run`, Slurm's variables given the values node rank 0 will see.
    pub words: Vec<String>,
    pub nodes: u32,
    pub gpus_per_node: u32,
}

/// The agent's check of a [`RunLine`]: its error is one line naming the flag.
pub type RunCheck<'a> = &'a dyn Fn(&RunLine) -> Result<(), Error>;
