//! `--numa-binding`: each rank runs on the CPUs (and allocates from the memory) of its GPU's NUMA
//! node, as torchrun 2.15's `--numa-binding` does. The CPU sets come from NVML's CPU affinity of
//! the GPU; the memory node from sysfs. Choosing is pure (`plan`); applying happens in the rank
//! between fork and exec (`apply`, two system calls).

use std::path::Path;

use crate::perf::gpu::{self, parse_cpu_list, GpuSource};

/// torchrun's `--numa-binding` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every CPU of the GPU's NUMA node.
    Node,
    /// Every CPU of the socket holding the GPU's NUMA node.
    Socket,
    /// The GPU's NUMA node's CPUs split into disjoint shares among the ranks on that node.
    Exclusive,
    /// One L3 cache group (core complex) of the GPU's NUMA node, a different one per rank where
    /// there are enough.
    CoreComplex,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Node => "node",
            Mode::Socket => "socket",
            Mode::Exclusive => "exclusive",
            Mode::CoreComplex => "core-complex",
        }
    }

    pub fn parse(s: &str) -> Result<Mode, UnknownMode> {
        match s {
            "node" => Ok(Mode::Node),
            "socket" => Ok(Mode::Socket),
            "exclusive" => Ok(Mode::Exclusive),
            "core-complex" | "core_complex" => Ok(Mode::CoreComplex),
            _ => Err(UnknownMode(s.to_string())),
        }
    }
}

/// A `--numa-binding` value that names no [`Mode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--numa-binding {0:?}: give node, socket, exclusive or core-complex")]
pub struct UnknownMode(pub String);

/// Where one rank is to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Binding {
    pub cpus: Vec<usize>,
    /// The NUMA node its memory comes from (`MPOL_BIND`); `None`: memory is not bound.
    pub mem_node: Option<u32>,
}

/// What is known about one rank's GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuPlace {
    /// NVML's CPU affinity of the GPU (its NUMA node's CPUs).
    pub cpus: Vec<usize>,
    pub numa_node: Option<u32>,
}

/// The machine's CPU topology, for `socket` and `core-complex`.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// CPU sets sharing one physical package.
    pub sockets: Vec<Vec<usize>>,
    /// CPU sets sharing one L3 cache.
    pub l3: Vec<Vec<usize>>,
}

/// The binding of every local rank (pure). `places[i]` is rank i's GPU, `None` when unknown
/// (the rank then runs unbound: an empty CPU set).
pub fn plan(mode: Mode, places: &[Option<GpuPlace>], topo: &Topology) -> Vec<Binding> {
    places
        .iter()
        .enumerate()
        .map(|(i, place)| {
            let Some(p) = place.as_ref().filter(|p| !p.cpus.is_empty()) else {
                return Binding::default();
            };
            // The ranks whose GPUs share this CPU set, and this rank's place among them.
            let peers: Vec<usize> = places
                .iter()
                .enumerate()
                .filter(|(_, q)| q.as_ref().is_some_and(|q| q.cpus == p.cpus))
                .map(|(j, _)| j)
                .collect();
            let nth = peers.iter().position(|j| *j == i).unwrap_or(0);
            let cpus = match mode {
                Mode::Node => p.cpus.clone(),
                Mode::Socket => topo
                    .sockets
                    .iter()
                    .find(|s| s.contains(&p.cpus[0]))
                    .cloned()
                    .unwrap_or_else(|| p.cpus.clone()),
                Mode::Exclusive => share(&p.cpus, peers.len(), nth),
                Mode::CoreComplex => {
                    let groups: Vec<&Vec<usize>> = topo
                        .l3
                        .iter()
                        .filter(|g| g.iter().any(|c| p.cpus.contains(c)))
                        .collect();
                    if groups.is_empty() {
                        share(&p.cpus, peers.len(), nth)
                    } else {
                        groups[nth % groups.len()]
                            .iter()
                            .copied()
                            .filter(|c| p.cpus.contains(c))
                            .collect()
                    }
                }
            };
            Binding {
                cpus,
                mem_node: p.numa_node,
            }
        })
        .collect()
}

/// Share `nth` of `cpus` split into `n` contiguous, disjoint parts (sizes differ by at most one);
/// with more ranks than CPUs, ranks share CPUs round-robin.
fn share(cpus: &[usize], n: usize, nth: usize) -> Vec<usize> {
    let n = n.max(1);
    if n > cpus.len() {
        return vec![cpus[nth % cpus.len()]];
    }
    let (base, extra) = (cpus.len() / n, cpus.len() % n);
    let start = nth * base + nth.min(extra);
    let len = base + usize::from(nth < extra);
    cpus[start..start + len].to_vec()
}

/// Reads the sockets and L3 groups from `<sys_root>/devices/system/cpu`.
pub fn read_topology(sys_root: &Path) -> Topology {
    let cpu_dir = sys_root.join("devices/system/cpu");
    let mut sockets: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    let mut l3: Vec<Vec<usize>> = Vec::new();
    let Ok(entries) = std::fs::read_dir(&cpu_dir) else {
        return Topology::default();
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("cpu")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if let Ok(pkg) = std::fs::read_to_string(e.path().join("topology/physical_package_id")) {
            sockets.entry(pkg.trim().to_string()).or_default().push(n);
        }
        if let Some(group) = std::fs::read_to_string(e.path().join("cache/index3/shared_cpu_list"))
            .ok()
            .and_then(|s| parse_cpu_list(&s))
        {
            if !l3.contains(&group) {
                l3.push(group);
            }
        }
    }
    let mut sockets: Vec<Vec<usize>> = sockets.into_values().collect();
    for s in &mut sockets {
        s.sort_unstable();
    }
    l3.sort();
    Topology { sockets, l3 }
}

/// Every local rank's binding, reading NVML and sysfs. `gpus[i]` is local rank i's GPU index.
/// The warning says what could not be bound, for the console.
pub fn bindings(
    src: &GpuSource,
    mode: Mode,
    gpus: &[Option<u32>],
    sys_root: &Path,
) -> (Vec<Binding>, Option<String>) {
    let places: Vec<Option<GpuPlace>> = gpus
        .iter()
        .map(|g| {
            let g = (*g)?;
            let cpus = src.cpu_affinity(g)?;
            Some(GpuPlace {
                cpus,
                numa_node: src.numa_node(g, sys_root),
            })
        })
        .collect();
    let plan = plan(mode, &places, &read_topology(sys_root));
    let unbound: Vec<String> = plan
        .iter()
        .enumerate()
        .filter(|(_, b)| b.cpus.is_empty())
        .map(|(i, _)| i.to_string())
        .collect();
    let warning = (!unbound.is_empty()).then(|| {
        format!(
            "--numa-binding: NVML gives no CPU affinity for the GPU of local rank(s) {}; they start unbound",
            unbound.join(", ")
        )
    });
    (plan, warning)
}

/// A binding made ready before fork: applying it in the child allocates nothing.
#[derive(Clone, Copy)]
pub struct Prepared {
    cpus: Option<libc::cpu_set_t>,
    nodemask: Option<[libc::c_ulong; 16]>,
    policy: libc::c_long,
}

impl Prepared {
    /// `strict`: memory only from the node (`MPOL_BIND`), else preferably (`MPOL_PREFERRED`).
    pub fn new(b: &Binding, strict: bool) -> Prepared {
        let cpus = (!b.cpus.is_empty()).then(|| {
            // SAFETY: cpu_set_t is plain bits; CPU_ZERO/CPU_SET only write into it.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &c in &b.cpus {
                if c < libc::CPU_SETSIZE as usize {
                    unsafe { libc::CPU_SET(c, &mut set) };
                }
            }
            set
        });
        let bits = libc::c_ulong::BITS as usize;
        let nodemask = b.mem_node.filter(|n| (*n as usize) < 16 * bits).map(|n| {
            let mut mask = [0 as libc::c_ulong; 16];
            mask[n as usize / bits] |= 1 << (n as usize % bits);
            mask
        });
        const MPOL_PREFERRED: libc::c_long = 1;
        const MPOL_BIND: libc::c_long = 2;
        Prepared {
            cpus,
            nodemask,
            policy: if strict { MPOL_BIND } else { MPOL_PREFERRED },
        }
    }

    /// In the child between fork and exec: async-signal-safe system calls only.
    pub fn apply(&self) -> std::io::Result<()> {
        if let Some(set) = &self.cpus {
            // SAFETY: a valid cpu_set_t of the size given.
            if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) }
                < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(mask) = &self.nodemask {
            let maxnode = (mask.len() * libc::c_ulong::BITS as usize) as libc::c_ulong;
            // SAFETY: set_mempolicy reads `maxnode` bits from the mask it is given.
            if unsafe {
                libc::syscall(libc::SYS_set_mempolicy, self.policy, mask.as_ptr(), maxnode)
            } < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// `b` kept to the CPUs in `allowed` (the agent's own, which a rank cannot leave); the CPUs
/// dropped are returned (pure).
pub fn restrict(b: &mut Binding, allowed: &[usize]) -> Vec<usize> {
    let (keep, drop): (Vec<usize>, Vec<usize>) = b.cpus.iter().partition(|c| allowed.contains(c));
    b.cpus = keep;
    drop
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes the set it is given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } < 0 {
        return vec![];
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
        .collect()
}

/// Every local rank's prepared binding for `--numa-binding`, and the warnings to print: no NVML
/// (ranks start unbound), GPUs without affinity, CPUs outside what the agent may use.
pub fn prepare(
    lib: Option<&Path>,
    mode: Mode,
    strict: bool,
    nproc: u32,
    cuda_visible: Option<&str>,
) -> (Vec<Option<Prepared>>, Vec<String>) {
    let unbound = || (0..nproc).map(|_| None).collect();
    let src = match GpuSource::open(lib) {
        Ok(s) => s,
        Err(off) => {
            return (
                unbound(),
                vec![format!(
                    "--numa-binding {}: {off}; ranks start unbound",
                    mode.name()
                )],
            )
        }
    };
    let gpus = rank_gpus(&src, nproc, cuda_visible);
    let (mut plan, warning) = bindings(&src, mode, &gpus, Path::new("/sys"));
    let warning = warning.map(|w| {
        w.replacen(
            "--numa-binding",
            &format!("--numa-binding {}", mode.name()),
            1,
        )
    });
    let mut warnings: Vec<String> = warning.into_iter().collect();
    let allowed = allowed_cpus();
    for (lr, b) in plan.iter_mut().enumerate() {
        let dropped = restrict(b, &allowed);
        if !dropped.is_empty() {
            warnings.push(format!(
                "--numa-binding {}: local rank {lr}: CPU(s) {dropped:?} of its GPU are outside the agent's own CPU set; {}",
                mode.name(),
                if b.cpus.is_empty() { "it starts unbound".to_string() } else { format!("bound to {:?}", b.cpus) }
            ));
        }
    }
    let prepared = plan
        .iter()
        .map(|b| (!b.cpus.is_empty() || b.mem_node.is_some()).then(|| Prepared::new(b, strict)))
        .collect();
    (prepared, warnings)
}

/// The GPU of every local rank, as the ranks will see them (`rank_gpu`).
pub fn rank_gpus(src: &GpuSource, nproc: u32, cuda_visible: Option<&str>) -> Vec<Option<u32>> {
    let uuids = src.uuids();
    (0..nproc)
        .map(|lr| gpu::rank_gpu(lr, cuda_visible, &uuids))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn place(cpus: std::ops::Range<usize>, node: u32) -> Option<GpuPlace> {
        Some(GpuPlace {
            cpus: cpus.collect(),
            numa_node: Some(node),
        })
    }

    #[test]
    fn node_socket_exclusive() {
        let places = vec![place(0..8, 0), place(0..8, 0), place(8..16, 1), None];
        let topo = Topology {
            sockets: vec![(0..16).collect(), (16..32).collect()],
            l3: vec![(0..4).collect(), (4..8).collect(), (8..16).collect()],
        };
        let node = plan(Mode::Node, &places, &topo);
        assert_eq!(node[0].cpus, (0..8).collect::<Vec<_>>());
        assert_eq!(node[2].mem_node, Some(1));
        assert_eq!(node[3], Binding::default());
        let sock = plan(Mode::Socket, &places, &topo);
        assert_eq!(sock[2].cpus, (0..16).collect::<Vec<_>>());
        let ex = plan(Mode::Exclusive, &places, &topo);
        assert_eq!(ex[0].cpus, vec![0, 1, 2, 3]);
        assert_eq!(ex[1].cpus, vec![4, 5, 6, 7]);
        assert_eq!(ex[2].cpus, (8..16).collect::<Vec<_>>());
        let cc = plan(Mode::CoreComplex, &places, &topo);
        assert_eq!(cc[0].cpus, vec![0, 1, 2, 3]);
        assert_eq!(cc[1].cpus, vec![4, 5, 6, 7]);
        assert_eq!(cc[2].cpus, (8..16).collect::<Vec<_>>());
    }

    #[test]
    fn modes_parse() {
        assert_eq!(Mode::parse("core-complex"), Ok(Mode::CoreComplex));
        assert!(Mode::parse("nodes")
            .unwrap_err()
            .to_string()
            .contains("give node"));
    }

    proptest! {
        #[test]
        fn exclusive_shares_are_disjoint_and_cover(ncpu in 1usize..64, n in 1usize..16) {
            let cpus: Vec<usize> = (0..ncpu).collect();
            let parts: Vec<Vec<usize>> = (0..n).map(|i| share(&cpus, n, i)).collect();
            prop_assert!(parts.iter().all(|p| !p.is_empty()));
            if n <= ncpu {
                let all: Vec<usize> = parts.concat();
                prop_assert_eq!(all, cpus);
            }
        }
    }
}
