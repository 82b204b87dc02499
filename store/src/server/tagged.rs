//! vigil's tagged mode on one connection (docs/store.md, "Tagged mode"): every request carries a
//! tag its reply frame repeats, and a WAIT or WAIT_GET parks under its tag alone, so that one
//! connection holds all of an agent's waits. A connection's first tagged request turns it to this
//! mode for good.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::{Conn, ConnEnd, State, MAX_TAGGED_WAITS};
use crate::protocol::{put_bytes, Request, WAIT_CANCELED, WAIT_STOP_WAITING};

/// A parked tagged wait: the tag its answer carries, and for WAIT_GET the key whose value it is.
pub(super) struct TagWait {
    pub(super) tag: u32,
    pub(super) get: Option<Vec<u8>>,
}

/// Appends one tagged reply: `u32` tag, `u64` length, then what `body` writes.
fn put_frame(out: &mut Vec<u8>, tag: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    body(out);
    let len = (out.len() - start - 12) as u64;
    out[start + 4..start + 12].copy_from_slice(&len.to_le_bytes());
}

/// The answer of a released tagged wait: WAIT's `STOP_WAITING`, or WAIT_GET's value.
fn put_wait_answer(out: &mut Vec<u8>, st: &State, tag: u32, get: Option<&[u8]>) {
    put_frame(out, tag, |o| match get {
        None => o.push(WAIT_STOP_WAITING),
        Some(k) => put_bytes(o, st.kv.get(k).map_or(&[][..], |v| v)),
    });
}

impl Conn {
    /// A wake-up for a tagged wait: its answer, unless it was cancelled meanwhile.
    pub(super) fn woken_tagged(&mut self, id: u64, out: &mut Vec<u8>) {
        // Unknown: a tagged wait cancelled after it was released (answered then).
        let Some(w) = self.tag_waits.remove(&id) else {
            return;
        };
        let shared = self.shared.clone();
        let mut st = shared.lock();
        if let Some(k) = &w.get {
            // Deleted again before this connection got to it (a reset): park once more.
            if !st.kv.contains_key(k) && !st.register_wait(id, vec![k.clone()], &self.tx) {
                self.tag_waits.insert(id, w);
                return;
            }
        }
        self.tag_ids.remove(&w.tag);
        put_wait_answer(out, &st, w.tag, w.get.as_deref());
    }

    /// Serves one tagged request: its reply goes out as one frame (none for a one-way request),
    /// a wait parks under its tag.
    pub(super) fn tagged(
        &mut self,
        tag: u32,
        inner: Request,
        rx: &mut mpsc::UnboundedReceiver<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnEnd> {
        if !self.validated {
            return Err(ConnEnd::NotValidated);
        }
        if self.wait.is_some() {
            return Err(ConnEnd::MixedModes);
        }
        self.tagged = true;
        self.allowed(&inner)?;
        match inner {
            Request::Wait { keys } => self.park_tagged(tag, keys, None, out),
            Request::WaitGet { key } => self.park_tagged(tag, vec![key.clone()], Some(key), out),
            Request::CancelWait => {
                if let Some(id) = self.tag_ids.remove(&tag) {
                    let w = self
                        .tag_waits
                        .remove(&id)
                        .expect("tag_ids and tag_waits agree");
                    let shared = self.shared.clone();
                    let mut st = shared.lock();
                    if !st.cancel_wait(id) {
                        // Released before the cancel (its wake-up, still in the channel, is
                        // ignored later): answered first, as an untagged cancel does.
                        put_wait_answer(out, &st, tag, w.get.as_deref());
                    }
                }
                put_frame(out, tag, |o| o.push(WAIT_CANCELED));
                Ok(())
            }
            inner => {
                let one_way = inner.one_way();
                let start = out.len();
                let mut r = Ok(());
                put_frame(out, tag, |o| r = self.plain(inner, rx, o));
                if one_way && out.len() == start + 12 {
                    out.truncate(start);
                }
                r
            }
        }
    }

    fn park_tagged(
        &mut self,
        tag: u32,
        keys: Vec<Vec<u8>>,
        get: Option<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Result<(), ConnEnd> {
        if self.tag_ids.contains_key(&tag) {
            return Err(ConnEnd::DuplicateTag(tag));
        }
        if self.tag_ids.len() >= MAX_TAGGED_WAITS {
            return Err(ConnEnd::TooManyTags);
        }
        let id = self.shared.next_wait_id.fetch_add(1, Ordering::Relaxed);
        let shared = self.shared.clone();
        let mut st = shared.lock();
        if st.register_wait(id, keys, &self.tx) {
            put_wait_answer(out, &st, tag, get.as_deref());
        } else {
            self.tag_waits.insert(id, TagWait { tag, get });
            self.tag_ids.insert(tag, id);
        }
        Ok(())
    }
}
