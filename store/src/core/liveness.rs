//! Liveness: leases (keys that a connection's end deletes) and renewed counters with their sweep
//! (docs/store.md, "Leases" and the RENEW/SWEEP rows).

use std::collections::HashSet;

use super::kv::entry_size;
use super::{ConnId, Core, Effects, End, Session, MAX_REPLY_LEN};
use crate::protocol::{parse_counter, put_bytes, put_i64};

/// Raw-key prefix of lease keys: a client writes `vigil/lease/<name>` (stored as
/// `/vigil/lease/<name>`). A lease key is owned by the connection that last stored it with SET,
/// a COMPARE_SET that stored, MULTI_SET or JOIN; when that connection ends (EOF, I/O error,
/// protocol error, but not server shutdown) the key is deleted if it still holds that
/// connection's write, and a [`LeaseEvent`] is reported.
pub const LEASE_PREFIX: &[u8] = b"/vigil/lease/";

/// The queue (raw name) onto which a store configured with
/// [`Core::set_lease_queue`] pushes every [`LeaseEvent::Lost`], in order: a client writes
/// `vigil/lease_events`. Each element is `{"lost": "<name>", "value": "<value, lossy UTF-8>"}`.
pub const LEASE_QUEUE: &[u8] = b"/vigil/lease_events";
/// With the lease queue on, a lost lease `<name>` is also written at `/vigil/lease_lost/<name>`
/// (its last value), so that a client can park on one lease's loss (a WAIT_GET on that key): the
/// agents of a job whose store runs outside it park on their coordinator's and take its work over
/// at once. Whoever takes the lease again deletes the record.
pub const LEASE_LOST_PREFIX: &[u8] = b"/vigil/lease_lost/";
/// At most this many events are kept on [`LEASE_QUEUE`]; one more drops the oldest.
pub const LEASE_QUEUE_MAX: usize = 4096;

/// A JSON string literal of `s`.
fn json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The element [`LEASE_QUEUE`] holds for a lost lease.
pub fn lease_event_json(name: &str, value: &[u8]) -> Vec<u8> {
    let mut s = String::from("{\"lost\": ");
    json_str(name, &mut s);
    s.push_str(", \"value\": ");
    json_str(&String::from_utf8_lossy(value), &mut s);
    s.push('}');
    s.into_bytes()
}

fn is_lease_key(key: &[u8]) -> bool {
    key.starts_with(LEASE_PREFIX)
}

/// What happened to a lease key when the connection that owned it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The key still held the value that connection wrote: it was deleted. `key` is the name
    /// after `/vigil/lease/` (lossy UTF-8); `value` is what the key held.
    Lost { key: String, value: Vec<u8> },
    /// The key had been deleted or overwritten (by anyone, the owner included) since that
    /// connection last wrote it: nothing was deleted.
    Released { key: String },
}

impl Core {
    /// A write of `key` by connection `s` through SET, COMPARE_SET, MULTI_SET or JOIN: a lease
    /// key becomes owned by that connection.
    pub(super) fn set_by(
        &mut self,
        s: &mut Session,
        key: Vec<u8>,
        value: Vec<u8>,
        fx: &mut Effects,
    ) {
        if !is_lease_key(&key) {
            self.set(key, value, fx);
            return;
        }
        if !s.leases.contains(&key) {
            s.leases.insert(key.clone());
        }
        self.lease_owner.insert(key.clone(), s.id);
        self.waits.wake_all(&key, fx);
        self.kv_put(key, value);
    }

    /// `key` was modified or deleted other than by an owning write.
    pub(super) fn disown(&mut self, key: &[u8]) {
        if !self.lease_owner.is_empty() {
            self.lease_owner.remove(key);
        }
    }

    /// Settles the leases of connection `conn` that ended: deletes the keys it still owns and
    /// reports every key it had set, in key order.
    pub(super) fn release_leases(
        &mut self,
        conn: ConnId,
        keys: HashSet<Vec<u8>>,
        fx: &mut Effects,
    ) {
        let mut keys: Vec<Vec<u8>> = keys.into_iter().collect();
        keys.sort();
        for key in keys {
            let name = String::from_utf8_lossy(&key[LEASE_PREFIX.len()..]).into_owned();
            let owned = self.lease_owner.get(&key) == Some(&conn);
            let taken = if owned {
                self.lease_owner.remove(&key);
                // A deletion: nobody is woken.
                self.kv_take(&key)
            } else {
                None
            };
            let ev = match taken {
                Some(value) => {
                    if self.lease_queue {
                        self.queue_lease_event(&name, &value, fx);
                        let lost = [LEASE_LOST_PREFIX, name.as_bytes()].concat();
                        self.set(lost, value.clone(), fx);
                    }
                    LeaseEvent::Lost { key: name, value }
                }
                None => LeaseEvent::Released { key: name },
            };
            fx.leases.push(ev);
        }
    }

    /// Pushes a lost lease onto [`LEASE_QUEUE`], releasing one parked popper or waiter. Beyond
    /// [`LEASE_QUEUE_MAX`] the oldest event is dropped; an event that would take the store over
    /// its total is dropped (a connection's end cannot be refused).
    fn queue_lease_event(&mut self, name: &str, value: &[u8], fx: &mut Effects) {
        let v = lease_event_json(name, value);
        let size = entry_size(LEASE_QUEUE, &v);
        let q = self.queues.entry(LEASE_QUEUE.to_vec()).or_default();
        while q.len() >= LEASE_QUEUE_MAX {
            let old = q.pop_front().expect("non-empty");
            self.stored -= entry_size(LEASE_QUEUE, &old);
        }
        if self.admit(size).is_err() {
            if self.queues.get(LEASE_QUEUE).is_some_and(|q| q.is_empty()) {
                self.queues.remove(LEASE_QUEUE);
            }
            return;
        }
        self.stored += size;
        self.queues
            .get_mut(LEASE_QUEUE)
            .expect("created above")
            .push_back(v);
        self.waits.wake_one(LEASE_QUEUE, fx);
    }

    /// RENEW: ADD by one, remembered as renewed for the next sweep.
    pub(super) fn renew(&mut self, key: Vec<u8>, fx: &mut Effects) -> Result<(), End> {
        self.admit(self.growth(&key, 20) + key.len())?;
        self.add(key.clone(), 1, fx)?;
        self.renewed.insert(key, true);
        Ok(())
    }

    /// SWEEP: the renewed counters under `prefix` not renewed since the previous sweep; every
    /// one under it starts the next period unrenewed. Counters deleted since, or set to 0 or
    /// less (an agent that left says so), are forgotten until renewed again.
    pub fn sweep(&mut self, prefix: &[u8]) -> Vec<Vec<u8>> {
        let kv = &self.kv;
        let mut stale = Vec::new();
        let mut gone = Vec::new();
        for (k, fresh) in self.renewed.range_mut(prefix.to_vec()..) {
            if !k.starts_with(prefix) {
                break;
            }
            let counting = kv
                .get(k)
                .and_then(|v| parse_counter(v))
                .is_some_and(|c| c > 0);
            if !counting {
                gone.push(k.clone());
            } else if !std::mem::replace(fresh, false) {
                stale.push(k.clone());
            }
        }
        for k in gone {
            self.renewed.remove(&k);
        }
        stale
    }

    pub(super) fn sweep_reply(&mut self, prefix: &[u8], out: &mut Vec<u8>) -> Result<(), End> {
        let stale = self.sweep(prefix);
        let size: usize = stale.iter().map(|k| 8 + k.len()).sum();
        if size > MAX_REPLY_LEN {
            return Err(End::ReplyTooLarge);
        }
        put_i64(out, stale.len() as i64);
        for k in &stale {
            put_bytes(out, k);
        }
        Ok(())
    }
}
