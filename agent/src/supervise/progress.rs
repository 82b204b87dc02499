//! Progress, by the highest step each attempt (or allocation) reached: pure functions shared by the
//! supervisor (in-job attempts) and the requeue policy (allocations, `allocation::policy`).

/// Whether each entry of `highest` (in order) made progress over the best before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Made,
    None,
    /// No step was ever reported up to here.
    Unknown,
}

pub fn progress(highest: &[Option<u64>], min: u64) -> Vec<Progress> {
    let mut best: Option<u64> = None;
    highest
        .iter()
        .map(|h| {
            let p = match (best, *h) {
                (None, None) => Progress::Unknown,
                (None, Some(_)) => Progress::Made,
                (Some(_), None) => Progress::None,
                (Some(b), Some(h)) if h >= b.saturating_add(min) => Progress::Made,
                (Some(_), Some(_)) => Progress::None,
            };
            best = best.max(*h);
            p
        })
        .collect()
}

/// Entries without progress at the end of `highest`, counted back to the last with progress;
/// only the last `window` entries may count.
pub fn trailing_no_progress(highest: &[Option<u64>], min: u64, window: usize) -> usize {
    let p = progress(highest, min);
    let mut n = 0;
    for x in p.iter().rev().take(window) {
        match x {
            Progress::Made => break,
            Progress::None => n += 1,
            Progress::Unknown => {}
        }
    }
    n
}

/// In-job attempts: true when the last `n` attempts of this allocation (each one's highest
/// step, in order) made no progress of `min` steps over the best before them. `n == 0`: never.
pub fn attempt_no_progress(highest: &[Option<u64>], n: u32, min: u64) -> bool {
    n > 0 && trailing_no_progress(highest, min, highest.len()) >= n as usize
}
