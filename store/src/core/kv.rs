//! Keys and values: SET, COMPARE_SET, GET, ADD, CHECK, GETNUMKEYS, DELETE_KEY, APPEND,
//! MULTI_GET, MULTI_SET, LIST_KEYS and vigil's JOIN, answered as torch's server answers them
//! (docs/store.md). A write releases the waits on its key; a write by a connection of a lease
//! key makes that connection its owner (`liveness`).

use super::{Core, Effects, End, Role, Session, AGENT_PREFIX, ENTRY_OVERHEAD, MAX_REPLY_LEN};
use crate::protocol::{
    parse_counter, put_bytes, put_i64, ProtocolError, Request, CHECK_NOT_READY, CHECK_READY,
    MAX_VALUE_LEN,
};

pub(super) fn entry_size(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

impl Core {
    /// Stores `key` (no waking, no lease bookkeeping), keeping the stored bytes right.
    pub(super) fn kv_put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.stored += entry_size(&key, &value);
        if let Some(old) = self.kv.get(&key) {
            self.stored -= entry_size(&key, old);
        }
        self.kv.insert(key, value);
    }

    pub(super) fn kv_take(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let v = self.kv.remove(key)?;
        self.stored -= entry_size(key, &v);
        Some(v)
    }

    /// How much storing a value of `value_len` bytes at `key` would add.
    pub(super) fn growth(&self, key: &[u8], value_len: usize) -> usize {
        let old = self.kv.get(key).map_or(0, |v| entry_size(key, v));
        (key.len() + value_len + ENTRY_OVERHEAD).saturating_sub(old)
    }

    /// A write of `key` that takes no lease ownership (it ends any).
    pub(super) fn set(&mut self, key: Vec<u8>, value: Vec<u8>, fx: &mut Effects) {
        self.disown(&key);
        self.waits.wake_all(&key, fx);
        self.kv_put(key, value);
    }

    /// Deletes a key (not a queue). True if it existed. Nobody is woken.
    pub(super) fn delete(&mut self, key: &[u8]) -> bool {
        self.disown(key);
        self.kv_take(key).is_some()
    }

    pub(super) fn add(&mut self, key: Vec<u8>, delta: i64, fx: &mut Effects) -> Result<i64, End> {
        let old = match self.kv.get(&key) {
            Some(v) => parse_counter(v).ok_or(End::NotACounter)?,
            None => 0,
        };
        let new = old.checked_add(delta).ok_or(End::NotACounter)?;
        self.set(key, new.to_string().into_bytes(), fx);
        Ok(new)
    }

    /// Reads a raw key.
    pub fn get_raw(&self, key: &[u8]) -> Option<&[u8]> {
        self.kv.get(key).map(Vec::as_slice)
    }

    /// Writes a raw key from the hosting agent, releasing its waiters; the effects carry the
    /// wake-ups.
    pub fn set_raw(&mut self, key: &[u8], value: &[u8]) -> Effects {
        let mut fx = Effects::default();
        self.set(key.to_vec(), value.to_vec(), &mut fx);
        fx
    }

    /// How many keys start with `prefix`, without copying any.
    pub fn count_prefix(&self, prefix: &[u8]) -> usize {
        self.kv.keys().filter(|k| k.starts_with(prefix)).count()
    }

    /// The keys starting with `prefix` and their values, sorted by key.
    pub fn entries_prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = (self.kv.iter())
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort();
        out
    }

    /// All raw key names, sorted.
    pub fn keys_raw(&self) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = self.kv.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Deletes every key and queue for which `doomed` holds; how many entries went.
    pub fn remove_where(&mut self, mut doomed: impl FnMut(&[u8]) -> bool) -> usize {
        let before = self.kv.len() + self.queues.len();
        let mut freed = 0;
        self.kv.retain(|k, v| {
            let gone = doomed(k);
            if gone {
                freed += entry_size(k, v);
            }
            !gone
        });
        self.queues.retain(|k, q| {
            let gone = doomed(k);
            if gone {
                freed += q.iter().map(|v| entry_size(k, v)).sum::<usize>();
            }
            !gone
        });
        self.stored -= freed;
        let removed = before - self.kv.len() - self.queues.len();
        let kv = &self.kv;
        self.lease_owner.retain(|k, _| kv.contains_key(k));
        self.renewed.retain(|k, _| kv.contains_key(k));
        removed
    }

    /// Serves a key-value request.
    pub(super) fn kv_op(
        &mut self,
        s: &mut Session,
        req: Request,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        match req {
            Request::Set { key, value } => {
                self.admit(self.growth(&key, value.len()))?;
                self.set_by(s, key, value, fx);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => self.compare_set(s, key, expected, desired, out, fx)?,
            Request::Get { key } => put_bytes(out, self.get_raw(&key).unwrap_or_default()),
            Request::Add { key, delta } => {
                self.admit(self.growth(&key, 20))?;
                put_i64(out, self.add(key, delta, fx)?);
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|k| self.present(k));
                out.push(if ready { CHECK_READY } else { CHECK_NOT_READY });
            }
            Request::GetNumKeys => put_i64(out, self.visible(s).count() as i64),
            Request::DeleteKey { key } => put_i64(out, self.delete(&key) as i64),
            Request::Append { key, value } => self.append(key, value, fx)?,
            Request::MultiGet { keys } => self.multi_get(&keys, out)?,
            Request::MultiSet { pairs } => {
                self.admit(pairs.iter().map(|(k, v)| self.growth(k, v.len())).sum())?;
                for (k, v) in pairs {
                    self.set_by(s, k, v, fx);
                }
            }
            Request::ListKeys => {
                let keys: Vec<&Vec<u8>> = self.visible(s).collect();
                put_i64(out, keys.len() as i64);
                for k in keys {
                    put_bytes(out, k);
                }
            }
            Request::Join {
                key,
                value,
                counter,
            } => {
                self.admit(self.growth(&key, value.len()) + self.growth(&counter, 20))?;
                self.set_by(s, key, value, fx);
                put_i64(out, self.add(counter, 1, fx)?);
            }
            other => unreachable!("not a key-value request: {:?}", other.opcode()),
        }
        Ok(())
    }

    /// The keys `s` may see: a rank's connection does not see vigil's.
    fn visible<'a>(&'a self, s: &Session) -> impl Iterator<Item = &'a Vec<u8>> + 'a {
        let all = s.role() == Role::Agent;
        self.kv
            .keys()
            .filter(move |k| all || !k.starts_with(AGENT_PREFIX))
    }

    /// torch: a missing key is created only when `expected` is empty; otherwise the reply is
    /// `expected` and nothing changes.
    fn compare_set(
        &mut self,
        s: &mut Session,
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        self.admit(self.growth(&key, desired.len()))?;
        match self.kv.get(&key) {
            None if expected.is_empty() => {}
            None => {
                put_bytes(out, &expected);
                return Ok(());
            }
            Some(cur) if *cur == expected => {}
            Some(cur) => {
                put_bytes(out, cur);
                return Ok(());
            }
        }
        put_bytes(out, &desired);
        self.set_by(s, key, desired, fx);
        Ok(())
    }

    fn append(&mut self, key: Vec<u8>, value: Vec<u8>, fx: &mut Effects) -> Result<(), End> {
        let old = self.kv.get(&key).map_or(0, Vec::len);
        if old + value.len() > MAX_VALUE_LEN as usize {
            return Err(End::Protocol(ProtocolError::ValueTooLong(
                (old + value.len()) as u64,
            )));
        }
        self.admit(self.growth(&key, old + value.len()))?;
        self.disown(&key);
        self.waits.wake_all(&key, fx);
        let mut v = self.kv_take(&key).unwrap_or_default();
        v.extend_from_slice(&value);
        self.kv_put(key, v);
        Ok(())
    }

    fn multi_get(&self, keys: &[Vec<u8>], out: &mut Vec<u8>) -> Result<(), End> {
        let size: usize = keys
            .iter()
            .map(|k| 8 + self.kv.get(k).map_or(0, Vec::len))
            .sum();
        if size > MAX_REPLY_LEN {
            return Err(End::ReplyTooLarge);
        }
        for k in keys {
            put_bytes(out, self.get_raw(k).unwrap_or_default());
        }
        Ok(())
    }
}
