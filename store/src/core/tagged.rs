//! vigil's tagged mode on one connection (docs/store.md, "Tagged mode"): every request carries a
//! tag its reply frame repeats, and a WAIT or WAIT_GET parks under its tag alone, so that one
//! connection holds all of an agent's waits. A connection's first tagged request turns it to this
//! mode for good.

use super::{Core, Effects, End, Session, TagWait, WaitId, MAX_TAGGED_WAITS};
use crate::protocol::{put_bytes, Request, WAIT_CANCELED, WAIT_STOP_WAITING};

/// Appends one tagged reply: `u32` tag, `u64` length, then what `body` writes.
pub(super) fn put_frame<T>(out: &mut Vec<u8>, tag: u32, body: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let start = out.len();
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    let r = body(out);
    let len = (out.len() - start - 12) as u64;
    out[start + 4..start + 12].copy_from_slice(&len.to_le_bytes());
    r
}

impl Core {
    /// The answer of a released tagged wait: WAIT's `STOP_WAITING`, or WAIT_GET's value.
    fn put_wait_answer(&self, out: &mut Vec<u8>, tag: u32, get: Option<&[u8]>) {
        put_frame(out, tag, |o| match get {
            None => o.push(WAIT_STOP_WAITING),
            Some(k) => put_bytes(o, self.get_raw(k).unwrap_or_default()),
        });
    }

    /// A wake-up for a tagged wait: its answer, unless it was cancelled meanwhile.
    pub(super) fn woken_tagged(&mut self, s: &mut Session, id: WaitId, out: &mut Vec<u8>) {
        // Unknown: a tagged wait cancelled after it was released (answered then).
        let Some(w) = s.tag_waits.remove(&id) else {
            return;
        };
        if let Some(k) = &w.get {
            // Deleted again before this connection got to it (a reset): park once more. It was
            // charged before and is bounded by MAX_TAGGED_WAITS: not refused now.
            if !self.present(k) {
                let again = self.waits.register(s.id, vec![k.clone()]);
                s.tag_ids.insert(w.tag, again);
                s.tag_waits.insert(again, w);
                return;
            }
        }
        s.tag_ids.remove(&w.tag);
        self.put_wait_answer(out, w.tag, w.get.as_deref());
    }

    /// Serves one tagged request: its reply goes out as one frame (none for a one-way request),
    /// a wait parks under its tag.
    pub(super) fn tagged(
        &mut self,
        s: &mut Session,
        tag: u32,
        inner: Request,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        if s.wait.is_some() {
            return Err(End::MixedModes);
        }
        s.tagged = true;
        match inner {
            Request::Wait { keys } => self.park_tagged(s, tag, keys, None, out),
            Request::WaitGet { key } => self.park_tagged(s, tag, vec![key.clone()], Some(key), out),
            Request::CancelWait => {
                self.cancel_tagged(s, tag, out);
                Ok(())
            }
            inner => {
                let one_way = inner.one_way();
                let start = out.len();
                let r = put_frame(out, tag, |o| self.plain(s, inner, o, fx));
                if one_way && out.len() == start + 12 {
                    out.truncate(start);
                }
                r
            }
        }
    }

    /// A tagged CANCEL_WAIT: `[1]` for the tag, after the wait's own answer if it had been
    /// released just before.
    fn cancel_tagged(&mut self, s: &mut Session, tag: u32, out: &mut Vec<u8>) {
        if let Some(id) = s.tag_ids.remove(&tag) {
            let w = s
                .tag_waits
                .remove(&id)
                .expect("tag_ids and tag_waits agree");
            if !self.waits.cancel(id) {
                // Released before the cancel (its wake-up, still on its way, is ignored).
                self.put_wait_answer(out, tag, w.get.as_deref());
            }
        }
        put_frame(out, tag, |o| o.push(WAIT_CANCELED));
    }

    fn park_tagged(
        &mut self,
        s: &mut Session,
        tag: u32,
        keys: Vec<Vec<u8>>,
        get: Option<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Result<(), End> {
        if s.tag_ids.contains_key(&tag) {
            return Err(End::DuplicateTag(tag));
        }
        if s.tag_ids.len() >= MAX_TAGGED_WAITS {
            return Err(End::TooManyTags);
        }
        match self.register_wait(s.id, keys)? {
            None => self.put_wait_answer(out, tag, get.as_deref()),
            Some(id) => {
                s.tag_waits.insert(id, TagWait { tag, get });
                s.tag_ids.insert(tag, id);
            }
        }
        Ok(())
    }
}
