//! InfiniBand ports from sysfs (`<root>/<device>/ports/<n>/{state,counters/...}`).

use std::path::Path;

use super::{check, Check, Status};

/// One port as sysfs shows it; a value sysfs does not have is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbPort {
    pub device: String,
    pub port: String,
    /// `state`'s text after the number: `ACTIVE`, `DOWN`, `INIT`...
    pub state: Option<String>,
    pub link_downed: Option<u64>,
    pub symbol_error: Option<u64>,
    /// Counters that cannot be read as a count, each with why: `link_downed "abc" is not a
    /// count`, `symbol_error missing`, `link_downed unreadable (it is a directory, ...)`.
    pub garbled: Vec<String>,
}

/// A counter file that does not hold a count: its name and the first 24 characters it held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} {shown:?}{} is not a count", if *.cut { "..." } else { "" })]
pub struct NotACount {
    pub name: String,
    pub shown: String,
    /// The file held more than `shown`.
    pub cut: bool,
}

/// A counter file's text as a count, or what it held instead.
pub fn parse_counter(name: &str, text: String) -> Result<u64, NotACount> {
    text.parse::<u64>().map_err(|_| {
        let shown: String = text.chars().take(24).collect();
        NotACount {
            name: name.to_string(),
            cut: shown.len() < text.len(),
            shown,
        }
    })
}

/// A counter as read from its file (at most a sysfs page, trimmed), or why it cannot vouch for
/// the port: missing, not a regular file (a directory, a FIFO: opened without blocking, a
/// device), longer than a page, or not a count.
pub fn read_counter(path: &Path, name: &str) -> Result<u64, String> {
    match vigil_bounded::read_string(path, vigil_bounded::SYSFS_LIMIT) {
        Ok(text) => parse_counter(name, text.trim().to_string()).map_err(|e| e.to_string()),
        Err(e) if e.is_not_found() => Err(format!("{name} missing")),
        Err(e) => Err(format!("{name} unreadable ({})", e.reason())),
    }
}

fn read_trim(p: &Path) -> Option<String> {
    vigil_bounded::read_sysfs(p)
}

/// Every port of every device under `root`, sorted; empty when there is no such tree.
pub fn read_ib(root: &Path) -> Vec<IbPort> {
    let mut out = Vec::new();
    let Ok(devices) = std::fs::read_dir(root) else {
        return out;
    };
    for dev in devices.flatten() {
        let device = dev.file_name().to_string_lossy().into_owned();
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            let p = port.path();
            let mut garbled = Vec::new();
            let mut counter = |name: &str| {
                read_counter(&p.join("counters").join(name), name)
                    .map_err(|why| garbled.push(why))
                    .ok()
            };
            let link_downed = counter("link_downed");
            let symbol_error = counter("symbol_error");
            out.push(IbPort {
                device: device.clone(),
                port: port.file_name().to_string_lossy().into_owned(),
                // "4: ACTIVE"
                state: read_trim(&p.join("state")).map(|s| match s.split_once(':') {
                    Some((_, name)) => name.trim().to_string(),
                    None => s,
                }),
                link_downed,
                symbol_error,
                garbled,
            });
        }
    }
    out.sort_by(|a, b| (&a.device, &a.port).cmp(&(&b.device, &b.port)));
    out
}

/// The verdict on the ports (pure): every port ACTIVE, `link_downed` and `symbol_error` at most
/// `max_errors` each. No device passes (the node has no InfiniBand) unless `require`.
pub fn ib_check(root: &Path, ports: Vec<IbPort>, require: bool, max_errors: u64) -> Check {
    if ports.is_empty() {
        let detail = format!("no InfiniBand devices under {}", root.display());
        return if require {
            check("ib_ports", Status::Fail, format!("{detail} (--require-ib)"))
        } else {
            check("ib_ports", Status::Skip, detail)
        };
    }
    let mut bad = Vec::new();
    for p in &ports {
        let mut why = Vec::new();
        match p.state.as_deref() {
            Some("ACTIVE") => {}
            Some(s) => why.push(format!("state {s}")),
            None => why.push("state unknown".to_string()),
        }
        for (name, v) in [
            ("link_downed", p.link_downed),
            ("symbol_error", p.symbol_error),
        ] {
            if let Some(n) = v.filter(|n| *n > max_errors) {
                why.push(format!("{name} {n}"));
            }
        }
        // A counter that cannot be read as a count cannot vouch for the port.
        why.extend(p.garbled.iter().cloned());
        if !why.is_empty() {
            bad.push(format!("{} port {}: {}", p.device, p.port, why.join(", ")));
        }
    }
    if bad.is_empty() {
        check(
            "ib_ports",
            Status::Pass,
            format!(
                "{} port(s) ACTIVE, link_downed and symbol_error at most {max_errors}",
                ports.len()
            ),
        )
    } else {
        check("ib_ports", Status::Fail, bad.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, downed: u64, sym: u64) -> IbPort {
        IbPort {
            device: "mlx5_0".into(),
            port: "1".into(),
            state: Some(state.into()),
            link_downed: Some(downed),
            symbol_error: Some(sym),
            garbled: vec![],
        }
    }

    #[test]
    fn verdicts() {
        let root = Path::new("/sys/class/infiniband");
        assert_eq!(ib_check(root, vec![], false, 0).status, Status::Skip);
        assert_eq!(ib_check(root, vec![], true, 0).status, Status::Fail);
        assert_eq!(
            ib_check(root, vec![port("ACTIVE", 0, 0)], false, 0).status,
            Status::Pass
        );
        let c = ib_check(root, vec![port("DOWN", 2, 0)], false, 0);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.detail, "mlx5_0 port 1: state DOWN, link_downed 2");
        assert_eq!(
            ib_check(root, vec![port("ACTIVE", 0, 5)], false, 10).status,
            Status::Pass
        );
        let mut g = port("ACTIVE", 0, 0);
        g.garbled = vec![parse_counter("symbol_error", "12abc".into())
            .unwrap_err()
            .to_string()];
        let c = ib_check(root, vec![g], false, 0);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.detail,
            "mlx5_0 port 1: symbol_error \"12abc\" is not a count"
        );
    }

    #[test]
    fn counters_parse_or_say_what_they_held() {
        assert_eq!(parse_counter("link_downed", "7".into()), Ok(7));
        let e = parse_counter("link_downed", "x".repeat(100))
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("\"... is not a count"), "{e}");
        assert!(e.len() < 80, "{e}");
        assert!(parse_counter("link_downed", "-1".into()).is_err());
        assert!(parse_counter("link_downed", "\u{1b}[2J".into())
            .unwrap_err()
            .to_string()
            .contains("\\u{1b}"));
    }

    #[test]
    fn reads_a_tree() {
        let dir = std::env::temp_dir().join(format!("vigil-ib-test-{}", std::process::id()));
        let p = dir.join("mlx5_1/ports/1");
        std::fs::create_dir_all(p.join("counters")).unwrap();
        std::fs::write(p.join("state"), "4: ACTIVE\n").unwrap();
        std::fs::write(p.join("counters/link_downed"), "7\n").unwrap();
        let ports = read_ib(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            ports,
            vec![IbPort {
                device: "mlx5_1".into(),
                port: "1".into(),
                state: Some("ACTIVE".into()),
                link_downed: Some(7),
                symbol_error: None,
                garbled: vec!["symbol_error missing".into()],
            }]
        );
    }

    #[test]
    fn a_counter_that_is_not_a_small_regular_file_is_named() {
        let dir = std::env::temp_dir().join(format!("vigil-ib-odd-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a_dir")).unwrap();
        std::fs::write(dir.join("big"), "0".repeat(5000)).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let got = |n: &str| read_counter(&dir.join(n), "link_downed").unwrap_err();
        assert_eq!(got("none"), "link_downed missing");
        assert!(
            got("a_dir").contains("it is a directory"),
            "{}",
            got("a_dir")
        );
        // Opened without blocking though nothing writes to it.
        assert!(got("fifo").contains("a FIFO"), "{}", got("fifo"));
        assert!(
            got("big").contains("larger than 4096 bytes"),
            "{}",
            got("big")
        );
        let e = read_counter(Path::new("/dev/zero"), "symbol_error").unwrap_err();
        assert!(e.contains("character device"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
