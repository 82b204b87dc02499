//! Slurm hostlists (`SLURM_JOB_NODELIST`): `node[001-004,7],gpu[1-2]-ib[0-1],login`, expanded
//! like `scontrol show hostnames`: several bracket groups multiply, zero-padded ranges keep the
//! width of their lower bound, and top-level commas separate host expressions.

/// Expansion stops here: a hostlist naming more hosts is surely a mistake.
pub const MAX_HOSTS: usize = 1 << 20;

/// A hostlist that cannot be expanded, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hostlist {list:?}: {why}")]
pub struct HostlistError {
    pub list: String,
    pub why: Why,
}

/// What is wrong with a hostlist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    #[error("range {0:?} is too large")]
    RangeTooLarge(String),
    #[error("range {0:?} runs backwards")]
    Backwards(String),
    #[error("range {0:?} names more than {MAX_HOSTS} hosts")]
    RangeTooLong(String),
    #[error("{0:?} inside brackets is not a number or a range")]
    NotANumber(String),
    #[error("a ']' has no matching '['")]
    Unopened,
    #[error("a '[' is never closed")]
    Unclosed,
    #[error("it names more than {MAX_HOSTS} hosts")]
    TooMany,
    #[error("it names no host")]
    Empty,
}

fn bracket_values(body: &str) -> Result<Vec<String>, Why> {
    let mut out = Vec::new();
    for item in body.split(',') {
        let item = item.trim();
        match item.split_once('-') {
            None if !item.is_empty() && item.bytes().all(|b| b.is_ascii_digit()) => {
                out.push(item.to_string())
            }
            Some((lo, hi))
                if !lo.is_empty()
                    && !hi.is_empty()
                    && lo.bytes().chain(hi.bytes()).all(|b| b.is_ascii_digit()) =>
            {
                let (a, b): (u64, u64) = (
                    lo.parse().map_err(|_| Why::RangeTooLarge(item.into()))?,
                    hi.parse().map_err(|_| Why::RangeTooLarge(item.into()))?,
                );
                if a > b {
                    return Err(Why::Backwards(item.into()));
                }
                if (b - a) as usize >= MAX_HOSTS {
                    return Err(Why::RangeTooLong(item.into()));
                }
                let width = lo.len();
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
            _ => return Err(Why::NotANumber(item.into())),
        }
    }
    Ok(out)
}

/// Expands one host expression without top-level commas, e.g. `gpu[1-2]-ib[0-1]`.
fn expand_one(expr: &str) -> Result<Vec<String>, Why> {
    let mut hosts = vec![String::new()];
    let mut rest = expr;
    while !rest.is_empty() {
        match rest.find('[') {
            None => {
                if rest.contains(']') {
                    return Err(Why::Unopened);
                }
                hosts.iter_mut().for_each(|h| h.push_str(rest));
                break;
            }
            Some(open) => {
                let (lit, tail) = rest.split_at(open);
                if lit.contains(']') {
                    return Err(Why::Unopened);
                }
                let close = tail.find(']').ok_or(Why::Unclosed)?;
                let vals = bracket_values(&tail[1..close])?;
                if hosts.len().saturating_mul(vals.len()) > MAX_HOSTS {
                    return Err(Why::TooMany);
                }
                hosts = hosts
                    .iter()
                    .flat_map(|h| vals.iter().map(move |v| format!("{h}{lit}{v}")))
                    .collect();
                rest = &tail[close + 1..];
            }
        }
    }
    Ok(hosts)
}

/// Expands a whole hostlist into host names, in order.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let fail = |why: Why| HostlistError {
        list: list.to_string(),
        why,
    };
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let bytes = list.as_bytes();
    for i in 0..=bytes.len() {
        let at_end = i == bytes.len();
        if !at_end {
            match bytes[i] {
                b'[' => depth += 1,
                b']' => depth = depth.checked_sub(1).ok_or_else(|| fail(Why::Unopened))?,
                _ => {}
            }
        }
        if at_end || (bytes[i] == b',' && depth == 0) {
            let expr = list[start..i].trim();
            if !expr.is_empty() {
                out.extend(expand_one(expr).map_err(fail)?);
                if out.len() > MAX_HOSTS {
                    return Err(fail(Why::TooMany));
                }
            }
            start = i + 1;
        }
    }
    if depth != 0 {
        return Err(fail(Why::Unclosed));
    }
    if out.is_empty() {
        return Err(fail(Why::Empty));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> Vec<String> {
        expand(s).unwrap()
    }

    #[test]
    fn slurm_forms() {
        assert_eq!(e("n1"), ["n1"]);
        assert_eq!(
            e("node[001-003,7]"),
            ["node001", "node002", "node003", "node7"]
        );
        assert_eq!(e("a[8-10]"), ["a8", "a9", "a10"]);
        assert_eq!(e("a[08-10]"), ["a08", "a09", "a10"]);
        assert_eq!(
            e("gpu[1-2]-ib[0-1],login"),
            ["gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1", "login"]
        );
        assert_eq!(e("x[1,3],y[2]z"), ["x1", "x3", "y2z"]);
        assert_eq!(
            e("h100-001-253-[012-013]"),
            ["h100-001-253-012", "h100-001-253-013"]
        );
    }

    #[test]
    fn errors_name_the_problem() {
        for (bad, why) in [
            ("n[1-", "never closed"),
            ("n1]", "no matching"),
            ("n[3-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[]", "not a number"),
            ("", "no host"),
            ("n[0-99999999]", "more than"),
        ] {
            let err = expand(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    proptest::proptest! {
        /// Compressing a set of zero-padded numbered hosts and expanding it gives them back.
        #[test]
        fn expand_inverts_compress(prefix in "[a-z]{1,6}", nums in proptest::collection::btree_set(0u32..500, 1..40), width in 1usize..5) {
            let body: Vec<String> = nums.iter().map(|n| format!("{n:0width$}")).collect();
            let list = format!("{prefix}[{}]", body.join(","));
            let want: Vec<String> = body.iter().map(|b| format!("{prefix}{b}")).collect();
            proptest::prop_assert_eq!(expand(&list).unwrap(), want);
        }

        #[test]
        fn never_panics(s in "[a-z0-9\\[\\],-]{0,30}") {
            let _ = expand(&s);
        }
    }
}
