//! Who a rendezvous still waits for (field finding 35), pure: node rank 0 reads which members'
//! join records and node-rank claims are in its store ([`super::Coordinator`] does the reading)
//! and these say which node ranks have not joined, and what is known of their agents.
//!
//! While a rendezvous waits, node rank 0 says so every [`JOIN_NOTE_PERIOD`]
//! ([`join_wait_note`]), and a rendezvous that times out names the same nodes
//! ([`join_timeout_reason`]): a node whose agent took its node rank and then froze
//! (SIGSTOP, a debugger) is told apart from one that never reached the store.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How often node rank 0 says which node ranks a rendezvous still waits for.
pub const JOIN_NOTE_PERIOD: Duration = Duration::from_secs(30);

/// Hidden, for tests only: [`JOIN_NOTE_PERIOD`] in milliseconds.
pub const JOIN_NOTE_PERIOD_ENV: &str = "VIGIL_TEST_JOIN_NOTE_PERIOD_MS";

/// The period between notes: [`JOIN_NOTE_PERIOD`], unless `env` ([`JOIN_NOTE_PERIOD_ENV`] as
/// read) is a positive number of milliseconds.
pub fn join_note_period(env: Option<&str>) -> Duration {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| (1..=86_400_000).contains(ms))
        .map(Duration::from_millis)
        .unwrap_or(JOIN_NOTE_PERIOD)
}

/// The agent that took a node rank, as its claim in the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimant {
    pub host: String,
    pub pid: Option<u32>,
}

/// An owner record (`vigil/owner/<node>`, written by every agent but node rank 0's as it takes
/// its node rank, given or handed out): `host (pid N)`.
pub fn owner_record(v: &[u8]) -> Option<Claimant> {
    let s = std::str::from_utf8(v).ok()?.trim();
    if s.is_empty() {
        return None;
    }
    let pid = s
        .strip_suffix(')')
        .and_then(|r| r.rsplit_once(" (pid "))
        .and_then(|(host, pid)| Some((host, pid.parse().ok()?)));
    Some(match pid {
        Some((host, pid)) => Claimant {
            host: host.to_string(),
            pid: Some(pid),
        },
        None => Claimant {
            host: s.to_string(),
            pid: None,
        },
    })
}

/// A c10d ticket (`vigil/node_of/<identity>`, written before the owner record): the identity is
/// `<host>-<pid>-<random hex>` ([`super::identity`]; the host may hold `-` itself).
pub fn ticket_record(identity: &str) -> Option<Claimant> {
    let mut parts = identity.rsplitn(3, '-');
    let (_random, pid, host) = (parts.next()?, parts.next()?, parts.next()?);
    if host.is_empty() {
        return None;
    }
    Some(Claimant {
        host: host.to_string(),
        pid: pid.parse().ok(),
    })
}

/// Who took which node rank, from the records node rank 0 read: `owners`, each node's owner
/// record ([`owner_record`]), and `tickets`, each c10d ticket's identity and the node rank it was
/// handed ([`ticket_record`]; an agent writes its ticket first, so an agent that froze right
/// after drawing one has no owner record yet). An owner record wins over a ticket.
pub fn claims(owners: &[(u32, Vec<u8>)], tickets: &[(String, Vec<u8>)]) -> BTreeMap<u32, Claimant> {
    let mut out: BTreeMap<u32, Claimant> = tickets
        .iter()
        .filter_map(|(identity, rank)| {
            let rank = std::str::from_utf8(rank).ok()?.trim().parse().ok()?;
            Some((rank, ticket_record(identity)?))
        })
        .collect();
    for (node, v) in owners {
        if let Some(c) = owner_record(v) {
            out.insert(*node, c);
        }
    }
    out
}

/// A member that has not joined the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Absent {
    pub node: u32,
    /// Its agent, if one took the node rank (it reached the store); `None`: no agent did.
    pub claimant: Option<Claimant>,
}

/// The `members` without a join record (`joined`), in order, each with its claimant if `claims`
/// has one.
pub fn absent(
    members: &[u32],
    joined: &BTreeSet<u32>,
    claims: &BTreeMap<u32, Claimant>,
) -> Vec<Absent> {
    members
        .iter()
        .filter(|n| !joined.contains(n))
        .map(|n| Absent {
            node: *n,
            claimant: claims.get(n).cloned(),
        })
        .collect()
}

/// At most this many absent nodes are named one by one; the rest are counted.
pub const MAX_NAMED: usize = 8;

fn describe(a: &Absent) -> String {
    match &a.claimant {
        Some(Claimant { host, pid }) => {
            let pid = pid.map(|p| format!(", pid {p}")).unwrap_or_default();
            format!(
                "{} (host {host}{pid}: its agent took the node rank and has not joined)",
                a.node
            )
        }
        None => format!("{} (not started, or not reached the store)", a.node),
    }
}

/// `1 (...)`, `1 (...) and 2 (...)`, `1 (...), 2 (...) and 3 (...)`; past [`MAX_NAMED`], the
/// rest as `and N more`.
pub fn name_absent(absent: &[Absent]) -> String {
    let named: Vec<String> = absent.iter().take(MAX_NAMED).map(describe).collect();
    let more = absent.len().saturating_sub(MAX_NAMED);
    match (named.split_last(), more) {
        (None, _) => String::new(),
        (Some((last, [])), 0) => last.clone(),
        (Some((last, rest)), 0) => format!("{} and {last}", rest.join(", ")),
        (Some(_), more) => format!("{} and {more} more", named.join(", ")),
    }
}

/// What node rank 0 says while attempt `c`'s rendezvous has waited `waited` for the `absent` of
/// `expected` nodes.
pub fn join_wait_note(
    c: u32,
    waited: Duration,
    absent: &[Absent],
    expected: usize,
    join_timeout: Duration,
) -> String {
    format!(
        "attempt {c} has waited {:.0}s for node rank(s) {}; {} of {expected} joined (--join-timeout {:.0}s)",
        waited.as_secs_f64(),
        name_absent(absent),
        expected.saturating_sub(absent.len()),
        join_timeout.as_secs_f64(),
    )
}

/// Why a rendezvous did not complete within `--join-timeout`; `joined`: the count as read, if it
/// could be; `absent`: the node ranks that did not join, as node rank 0 read them (empty
/// elsewhere: only node rank 0 reads them).
pub fn join_timeout_reason(
    c: u32,
    joined: Option<String>,
    nnodes: u32,
    timeout: Duration,
    absent: &[Absent],
) -> String {
    let head = format!(
        "only {} of {nnodes} nodes joined attempt {c} within {:.0}s (--join-timeout)",
        joined.as_deref().unwrap_or("?"),
        timeout.as_secs_f64()
    );
    if absent.is_empty() {
        return format!("{head}; check that vigil started on every node with the same --nnodes");
    }
    let frozen = if absent.iter().any(|a| a.claimant.is_some()) {
        "; an agent that took its node rank and did not join is frozen (SIGSTOP, a debugger) or stuck: look at it on its host"
    } else {
        ""
    };
    format!(
        "{head}: node rank(s) {} did not{frozen}; check that vigil started on every node with the same --nnodes",
        name_absent(absent)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimant(host: &str, pid: u32) -> Claimant {
        Claimant {
            host: host.into(),
            pid: Some(pid),
        }
    }

    #[test]
    fn the_period_is_30s_unless_a_test_shortens_it() {
        assert_eq!(join_note_period(None), Duration::from_secs(30));
        assert_eq!(join_note_period(Some("250")), Duration::from_millis(250));
        for bad in ["", "0", "-5", "1.5", "soon", "86400001"] {
            assert_eq!(join_note_period(Some(bad)), JOIN_NOTE_PERIOD, "{bad}");
        }
    }

    #[test]
    fn claims_read_back_as_host_and_pid() {
        // What connect.rs writes (`owner`) and what noderank.rs names a ticket by (`identity`).
        assert_eq!(
            owner_record(b"node-b (pid 4242)"),
            Some(claimant("node-b", 4242))
        );
        assert_eq!(
            owner_record(b"odd host"),
            Some(Claimant {
                host: "odd host".into(),
                pid: None
            })
        );
        assert_eq!(owner_record(b""), None);
        assert_eq!(owner_record(&[0xff, 0xfe]), None);
        assert_eq!(
            ticket_record("node-b.cluster-4242-0011aabbccddeeff"),
            Some(claimant("node-b.cluster", 4242))
        );
        // No random part (no secret could be drawn): still the host and pid.
        assert_eq!(ticket_record("gpu7-99-"), Some(claimant("gpu7", 99)));
        assert_eq!(ticket_record("nohyphens"), None);
        let mine = crate::job::rendezvous::identity("node-c");
        assert_eq!(
            ticket_record(&mine),
            Some(claimant("node-c", std::process::id()))
        );
    }

    #[test]
    fn an_owner_record_wins_over_a_ticket_and_garbage_is_left_out() {
        let owners = vec![(1, b"node-b (pid 7)".to_vec()), (3, Vec::new())];
        let tickets = vec![
            ("node-z-9-00ff".to_string(), b"1".to_vec()),
            ("node-c-8-00ff".to_string(), b"2".to_vec()),
            ("node-d-6-00ff".to_string(), b"not a rank".to_vec()),
        ];
        let c = claims(&owners, &tickets);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[&1], claimant("node-b", 7));
        assert_eq!(c[&2], claimant("node-c", 8));
    }

    #[test]
    fn the_absent_are_the_members_without_a_join_record() {
        let joined: BTreeSet<u32> = [0, 3].into();
        let claims: BTreeMap<u32, Claimant> = [(1, claimant("node-b", 7)), (3, claimant("x", 1))]
            .into_iter()
            .collect();
        let a = absent(&[0, 1, 2, 3], &joined, &claims);
        assert_eq!(
            a,
            vec![
                Absent {
                    node: 1,
                    claimant: Some(claimant("node-b", 7))
                },
                Absent {
                    node: 2,
                    claimant: None
                },
            ]
        );
        // A node lost for good is no member: not waited for.
        assert_eq!(absent(&[0, 1, 3], &joined, &claims).len(), 1);
    }

    #[test]
    fn the_note_names_each_absent_node_and_its_host() {
        let a = vec![
            Absent {
                node: 1,
                claimant: Some(claimant("node-b", 4242)),
            },
            Absent {
                node: 2,
                claimant: None,
            },
        ];
        let note = join_wait_note(0, Duration::from_secs(30), &a, 3, Duration::from_secs(600));
        assert_eq!(
            note,
            "attempt 0 has waited 30s for node rank(s) 1 (host node-b, pid 4242: its agent took the node rank and has not joined) and 2 (not started, or not reached the store); 1 of 3 joined (--join-timeout 600s)"
        );
        assert!(!note.contains('\n'));
        assert_eq!(
            name_absent(&a[1..]),
            "2 (not started, or not reached the store)"
        );
        let three: Vec<Absent> = (1..4)
            .map(|node| Absent {
                node,
                claimant: None,
            })
            .collect();
        assert!(name_absent(&three).starts_with("1 (not started, or not reached the store), 2 ("));
        assert!(name_absent(&three).contains(") and 3 ("));
    }

    #[test]
    fn a_large_job_names_the_first_few_and_counts_the_rest() {
        let many: Vec<Absent> = (1..=5000)
            .map(|node| Absent {
                node,
                claimant: None,
            })
            .collect();
        let named = name_absent(&many);
        assert!(named.ends_with(" and 4992 more"), "{named}");
        assert!(named.contains("8 (not started"), "{named}");
        assert!(!named.contains("9 (not started"), "{named}");
        assert!(named.len() < 500);
    }

    #[test]
    fn a_timed_out_join_names_who_joined() {
        let why = join_timeout_reason(3, Some("2".into()), 4, Duration::from_secs(600), &[]);
        assert!(
            why.starts_with("only 2 of 4 nodes joined attempt 3 within 600s"),
            "{why}"
        );
        let why = join_timeout_reason(0, None, 2, Duration::from_secs(1), &[]);
        assert!(why.contains("only ? of 2"), "{why}");
    }

    /// Field finding 35: node rank 0's reason names the node ranks that did not join, and the
    /// host of an agent that took its node rank and froze.
    #[test]
    fn node_rank_0s_timed_out_join_names_who_did_not_join_and_their_hosts() {
        let absent = [
            Absent {
                node: 1,
                claimant: Some(Claimant {
                    host: "node-b".into(),
                    pid: Some(4242),
                }),
            },
            Absent {
                node: 2,
                claimant: None,
            },
        ];
        let why = join_timeout_reason(0, Some("1".into()), 3, Duration::from_secs(600), &absent);
        assert!(
            why.starts_with("only 1 of 3 nodes joined attempt 0 within 600s (--join-timeout): node rank(s) 1 (host node-b, pid 4242: its agent took the node rank and has not joined) and 2 (not started, or not reached the store) did not; "),
            "{why}"
        );
        assert!(why.contains("frozen (SIGSTOP"), "{why}");
        assert!(why.ends_with("with the same --nnodes"), "{why}");
        let why = join_timeout_reason(0, Some("2".into()), 3, Duration::from_secs(9), &absent[1..]);
        assert!(!why.contains("frozen"), "{why}");
        assert!(!why.contains('\n'));
    }
}
