//! The `vigil` binary's exit statuses: defined once in the schema crate (`vigil_events::exit`),
//! because a record's outcome carries its status.

pub use vigil_events::exit::*;

#[cfg(test)]
mod tests {
    use super::{code, signaled, REQUEUE, USAGE};

    #[test]
    fn statuses_match_the_other_crates_and_the_shell() {
        // The recipes commands and the store server are below the agent and name their own
        // usage status; they must agree with this one.
        assert_eq!(vigil_recipes::cli::EXIT_USAGE, USAGE);
        assert_eq!(signaled(15), 143);
        assert_eq!(REQUEUE, 75);
        assert_eq!(code(300), std::process::ExitCode::from(255));
    }
}
