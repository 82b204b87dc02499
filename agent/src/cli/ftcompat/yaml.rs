//! Reading ft_launcher's `--ft-cfg-path` YAML file into settings.

use std::collections::HashMap;
use std::path::Path;

use super::table::{Kind, OPTS};
use super::{expected, opt_index, parse_seconds, parse_str, push_section, FtError, Setting, Val};

/// Read the `--ft-cfg-path` file into settings keyed by option index.
pub(super) fn load_cfg(
    path: &str,
    flag: &str,
    ignore_missing: bool,
    read: &dyn Fn(&Path) -> std::io::Result<String>,
    notes: &mut Vec<String>,
) -> Result<HashMap<usize, Setting>, FtError> {
    let text = match read(Path::new(path)) {
        Ok(t) => t,
        Err(e) if ignore_missing => {
            notes.push(format!(
                "ft_launcher config `{path}` not read ({e}): ignored because of --ignore-missing-fault-tol-cfg"
            ));
            return Ok(HashMap::new());
        }
        Err(e) => {
            return Err(FtError::CfgUnreadable {
                path: path.to_string(),
                flag: flag.to_string(),
                reason: e.to_string(),
            })
        }
    };
    let doc: serde_norway::Value =
        serde_norway::from_str(&text).map_err(|e| FtError::CfgInvalid {
            path: path.to_string(),
            reason: one_line(&e.to_string()),
        })?;
    let section = match find_section(&doc) {
        Some(s) if !s.is_null() => s,
        _ if ignore_missing => {
            notes.push(format!(
                "ft_launcher config `{path}` has no `fault_tolerance:` section: ignored because of --ignore-missing-fault-tol-cfg"
            ));
            return Ok(HashMap::new());
        }
        _ => {
            return Err(FtError::CfgNoSection {
                path: path.to_string(),
            })
        }
    };
    let Some(map) = section.as_mapping() else {
        return Err(FtError::CfgInvalid {
            path: path.to_string(),
            reason: "`fault_tolerance:` is not a mapping of setting names to values".into(),
        });
    };
    let mut out = HashMap::new();
    for (key, value) in map {
        let key = match key {
            serde_norway::Value::String(k) => k.clone(),
            other => scalar(other).unwrap_or_else(|| "?".into()),
        };
        let origin = format!("fault_tolerance.{key} in {path}");
        let Some(idx) = opt_index(&key) else {
            notes.push(format!(
                "{origin}: not an ft_launcher setting vigil knows; ignored"
            ));
            continue;
        };
        let val = yaml_value(OPTS[idx].kind, value).ok_or_else(|| FtError::BadValue {
            origin: origin.clone(),
            value: one_line(&scalar(value).unwrap_or_else(|| format!("{value:?}"))),
            expected: expected(OPTS[idx].kind),
        })?;
        let origin = match scalar(value) {
            Some(v) => format!("fault_tolerance.{key}: {v} in {path}"),
            None => origin,
        };
        out.insert(
            idx,
            Setting {
                val,
                origin,
                from_yaml: true,
            },
        );
    }
    Ok(out)
}

/// ft_launcher looks for `fault_tolerance` at the top level, then depth-first in nested mappings
/// and lists.
pub(super) fn find_section(v: &serde_norway::Value) -> Option<&serde_norway::Value> {
    match v {
        serde_norway::Value::Mapping(m) => {
            if let Some(s) = m.get("fault_tolerance") {
                return Some(s);
            }
            m.values()
                .find_map(|c| find_section(c).filter(|s| !s.is_null()))
        }
        serde_norway::Value::Sequence(items) => items
            .iter()
            .find_map(|c| find_section(c).filter(|s| !s.is_null())),
        serde_norway::Value::Tagged(t) => find_section(&t.value),
        _ => None,
    }
}

/// A YAML scalar as the text a command line would carry; `None` for null and collections.
pub(super) fn scalar(v: &serde_norway::Value) -> Option<String> {
    match v {
        serde_norway::Value::Bool(b) => Some(b.to_string()),
        serde_norway::Value::Number(n) => Some(n.to_string()),
        serde_norway::Value::String(s) => Some(s.clone()),
        serde_norway::Value::Tagged(t) => scalar(&t.value),
        _ => None,
    }
}

pub(super) fn yaml_value(kind: Kind, v: &serde_norway::Value) -> Option<Val> {
    if v.is_null() {
        return Some(match kind {
            Kind::Sections => Val::Sections(Vec::new()),
            _ => Val::None,
        });
    }
    if let (Kind::Sections, serde_norway::Value::Mapping(m)) = (kind, v) {
        let mut out = Vec::new();
        for (name, secs) in m {
            let name = scalar(name)?;
            let secs = if secs.is_null() {
                None
            } else {
                parse_seconds(&scalar(secs)?)?
            };
            push_section(&mut out, &name, secs)?;
        }
        return Some(Val::Sections(out));
    }
    parse_str(kind, &scalar(v)?)
}

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
