//! Parked waits: torch's WAIT (one per connection), BARRIER, and the registry that releases a
//! wait when the last of its keys appears. A released wait becomes a wake-up in [`Effects`] for
//! its connection; the shell hands it over while it still holds the core, so a CANCEL_WAIT that
//! comes later on the same connection always sees a consistent picture. Every parked wait is
//! charged against the store's total, tagged or not.

use std::collections::{HashMap, VecDeque};

use super::{ConnId, Core, Effects, End, Session, WaitId, ENTRY_OVERHEAD};
use crate::protocol::{parse_counter, WAIT_CANCELED, WAIT_STOP_WAITING};

struct Waiter {
    /// Keys still missing before this wait is released.
    remaining: usize,
    /// Keys it was registered under (to unregister on cancel).
    keys: Vec<Vec<u8>>,
    conn: ConnId,
    /// What it is charged.
    cost: usize,
}

/// What a parked wait on `keys` is charged: each key is held twice (the wait's list and the
/// registry's), with bookkeeping.
pub(super) fn wait_cost(keys: &[Vec<u8>]) -> usize {
    keys.iter().map(|k| 2 * k.len() + ENTRY_OVERHEAD).sum()
}

#[derive(Default)]
pub(super) struct Waits {
    /// key -> waits registered on it, oldest first.
    by_key: HashMap<Vec<u8>, VecDeque<WaitId>>,
    waits: HashMap<WaitId, Waiter>,
    bytes: usize,
    next: WaitId,
}

impl Waits {
    pub(super) fn len(&self) -> usize {
        self.waits.len()
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Registers a wait of `conn` on `keys` (all missing, at least one).
    pub(super) fn register(&mut self, conn: ConnId, keys: Vec<Vec<u8>>) -> WaitId {
        self.next += 1;
        let id = self.next;
        for k in &keys {
            self.by_key.entry(k.clone()).or_default().push_back(id);
        }
        let cost = wait_cost(&keys);
        self.bytes += cost;
        let remaining = keys.len();
        self.waits.insert(
            id,
            Waiter {
                remaining,
                keys,
                conn,
                cost,
            },
        );
        id
    }

    /// Removes wait `id`. True if it was still parked (not yet released).
    pub(super) fn cancel(&mut self, id: WaitId) -> bool {
        let Some(w) = self.waits.remove(&id) else {
            return false;
        };
        self.bytes -= w.cost;
        for k in &w.keys {
            if let Some(ids) = self.by_key.get_mut(k) {
                ids.retain(|x| *x != id);
                if ids.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
        true
    }

    /// One of `id`'s keys appeared: released if it was the last missing one.
    fn fire(&mut self, id: WaitId, fx: &mut Effects) -> bool {
        let Some(w) = self.waits.get_mut(&id) else {
            return false;
        };
        w.remaining = w.remaining.saturating_sub(1);
        if w.remaining > 0 {
            return false;
        }
        let w = self.waits.remove(&id).expect("present");
        self.bytes -= w.cost;
        // Its other keys' entries were consumed as they appeared; a stale one is skipped.
        fx.wakes.push((w.conn, id));
        true
    }

    /// Releases every wait on `key` whose last missing key this was.
    pub(super) fn wake_all(&mut self, key: &[u8], fx: &mut Effects) {
        if let Some(ids) = self.by_key.remove(key) {
            for id in ids {
                self.fire(id, fx);
            }
        }
    }

    /// Releases one wait on `key` (a queue push makes one element available).
    pub(super) fn wake_one(&mut self, key: &[u8], fx: &mut Effects) {
        let Some(ids) = self.by_key.get_mut(key) else {
            return;
        };
        let mut ids = std::mem::take(ids);
        while let Some(id) = ids.pop_front() {
            if self.fire(id, fx) {
                break;
            }
        }
        if ids.is_empty() {
            self.by_key.remove(key);
        } else {
            self.by_key.insert(key.to_vec(), ids);
        }
    }
}

impl Core {
    /// A key "exists" for CHECK/WAIT if it holds a value or is a non-empty queue.
    pub(super) fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Parks a wait of `conn` on the missing ones of `keys`, charged against the total. `None`:
    /// nothing is missing (the caller answers at once).
    pub(super) fn register_wait(
        &mut self,
        conn: ConnId,
        keys: Vec<Vec<u8>>,
    ) -> Result<Option<WaitId>, End> {
        let missing: Vec<Vec<u8>> = keys.into_iter().filter(|k| !self.present(k)).collect();
        if missing.is_empty() {
            return Ok(None);
        }
        self.admit(wait_cost(&missing))?;
        Ok(Some(self.waits.register(conn, missing)))
    }

    /// torch's WAIT: answered `STOP_WAITING` once every key exists.
    pub(super) fn park(
        &mut self,
        s: &mut Session,
        keys: Vec<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Result<(), End> {
        if s.wait.is_some() {
            return Err(End::WaitAlreadyPending);
        }
        match self.register_wait(s.id, keys)? {
            None => out.push(WAIT_STOP_WAITING),
            Some(id) => s.wait = Some(id),
        }
        Ok(())
    }

    /// torch's CANCEL_WAIT: `WAIT_CANCELED`, after `STOP_WAITING` if the wait had been
    /// released first (its wake-up, still on its way, is then ignored by [`Core::woken`]).
    pub(super) fn cancel_untagged(&mut self, s: &mut Session, out: &mut Vec<u8>) {
        if let Some(id) = s.wait.take() {
            if !self.waits.cancel(id) {
                out.push(WAIT_STOP_WAITING);
            }
        }
        out.push(WAIT_CANCELED);
    }

    /// torch's BARRIER: adds 1 to the counter at `key` and parks the caller until it reaches
    /// `world_size` (or anything else writes the key, as in torch).
    pub(super) fn barrier(
        &mut self,
        s: &mut Session,
        key: Vec<u8>,
        world_size: i64,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        if s.wait.is_some() {
            return Err(End::WaitAlreadyPending);
        }
        let cost = wait_cost(std::slice::from_ref(&key));
        self.admit(self.growth(&key, 20) + cost)?;
        let count = match self.kv.get(&key) {
            Some(v) => parse_counter(v)
                .and_then(|c| c.checked_add(1))
                .ok_or(End::NotACounter)?,
            None => 1,
        };
        self.disown(&key);
        self.kv_put(key.clone(), count.to_string().into_bytes());
        if count >= world_size {
            self.waits.wake_all(&key, fx);
            out.push(WAIT_STOP_WAITING);
        } else {
            // Parked on a key that exists: released by the last arrival.
            s.wait = Some(self.waits.register(s.id, vec![key]));
        }
        Ok(())
    }
}
