//! The timeouts in force as the event log and the state file hold them ([`Timeouts`]):
//! durations written as seconds, bounded by [`crate::MAX_SECONDS`] when read back.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::MAX_SECONDS;

/// The timeouts in force. `None` disables that check. Also the state file's `timeouts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    #[serde(with = "opt_secs", default)]
    pub initial: Option<Duration>,
    #[serde(with = "opt_secs", default)]
    pub heartbeat: Option<Duration>,
    #[serde(with = "map_secs", default)]
    pub sections: BTreeMap<String, Duration>,
    #[serde(with = "opt_secs", default)]
    pub out_of_section: Option<Duration>,
    /// Applies to every section during the first `warmup_steps` heartbeats.
    #[serde(with = "opt_secs", default)]
    pub warmup: Option<Duration>,
}

impl Timeouts {
    pub fn any(&self) -> bool {
        self.initial.is_some()
            || self.heartbeat.is_some()
            || !self.sections.is_empty()
            || self.out_of_section.is_some()
    }

    pub fn to_msg(&self) -> vigil_ipc::AgentMsg {
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
        vigil_ipc::AgentMsg::Timeouts {
            initial_ms: ms(self.initial),
            heartbeat_ms: ms(self.heartbeat),
            out_of_section_ms: ms(self.out_of_section),
            sections: self
                .sections
                .iter()
                .map(|(k, v)| (k.clone(), v.as_millis() as u64))
                .collect(),
        }
    }
}

mod opt_secs {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    pub fn serialize<S: serde::Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        v.map(|d| d.as_secs_f64()).serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let v: Option<f64> = Option::deserialize(d)?;
        Ok(match v {
            Some(x) => super::secs(x)?,
            None => None,
        })
    }
}

/// A saved timeout in seconds: zero, negative or not finite is off; beyond a year is an error
/// (a hand-edited file), never a panic.
fn secs<E: serde::de::Error>(x: f64) -> Result<Option<Duration>, E> {
    if !(x.is_finite() && x > 0.0) {
        return Ok(None);
    }
    if x > MAX_SECONDS {
        return Err(E::custom(format!("a timeout of {x} s is more than a year")));
    }
    Ok(Some(Duration::from_secs_f64(x)))
}

mod map_secs {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    pub fn serialize<S: serde::Serializer>(
        v: &BTreeMap<String, Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|(k, d)| (k.clone(), d.as_secs_f64()))
            .collect::<BTreeMap<_, _>>()
            .serialize(s)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, Duration>, D::Error> {
        let v: BTreeMap<String, f64> = BTreeMap::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (k, x) in v {
            if let Some(t) = super::secs(x)? {
                out.insert(k, t);
            }
        }
        Ok(out)
    }
}
