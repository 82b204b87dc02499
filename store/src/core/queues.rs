//! Queues (torch's QUEUE_PUSH, QUEUE_POP, QUEUE_LEN): kept apart from keys (not counted by
//! GETNUMKEYS or LIST_KEYS, not removed by DELETE_KEY); a push releases one parked popper.

use super::kv::entry_size;
use super::{Core, Effects, End};
use crate::protocol::{put_bytes, put_i64, Request};

impl Core {
    pub(super) fn queue_op(
        &mut self,
        req: Request,
        out: &mut Vec<u8>,
        fx: &mut Effects,
    ) -> Result<(), End> {
        match req {
            Request::QueuePush { key, value } => {
                let size = entry_size(&key, &value);
                self.admit(size)?;
                self.stored += size;
                self.queues.entry(key.clone()).or_default().push_back(value);
                self.waits.wake_one(&key, fx);
            }
            Request::QueuePop { key } => match self.queues.get_mut(&key) {
                Some(q) if !q.is_empty() => {
                    put_i64(out, q.len() as i64);
                    let v = q.pop_front().expect("non-empty");
                    put_bytes(out, &v);
                    if q.is_empty() {
                        self.queues.remove(&key);
                    }
                    self.stored -= entry_size(&key, &v);
                }
                _ => put_i64(out, 0),
            },
            Request::QueueLen { key } => {
                put_i64(out, self.queues.get(&key).map_or(0, |q| q.len()) as i64);
            }
            other => unreachable!("not a queue request: {:?}", other.opcode()),
        }
        Ok(())
    }
}
