//! Cluster presets: the Google Cloud machine types of the NeMo/NeMo-RL guides (`--slurm-type`,
//! `--cluster_type`). Each says how many GPUs a node has, the NCCL environment its network
//! needs and the host directories holding that network's NCCL plugin, which a container must see.
//! The guides name the types only; the values are those of Google Cloud's published cluster
//! blueprints for each machine (docs/launch.md says which), and a recipe overrides any of them.

/// One machine type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    pub machine: &'static str,
    pub gpus_per_node: u32,
    /// Exported in the batch script; a recipe's `env` wins over these.
    pub env: &'static [(&'static str, &'static str)],
    /// Host directories mounted at the same path when the recipe has a container image.
    pub mounts: &'static [&'static str],
}

/// A3 Mega (8 x H100 80GB, GPUDirect-TCPXO).
const A3M: Preset = Preset {
    name: "hcc-a3m",
    machine: "A3 Mega: 8 x H100 80GB, GPUDirect-TCPXO",
    gpus_per_node: 8,
    env: &[
        (
            "LD_LIBRARY_PATH",
            "/var/lib/tcpxo/lib64:${LD_LIBRARY_PATH:-}",
        ),
        ("NCCL_FASTRAK_CTRL_DEV", "enp0s12"),
        (
            "NCCL_FASTRAK_IFNAME",
            "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0",
        ),
        ("NCCL_SOCKET_IFNAME", "enp0s12"),
        ("NCCL_CROSS_NIC", "0"),
        ("NCCL_ALGO", "Ring,Tree"),
        ("NCCL_PROTO", "Simple,LL128"),
        ("NCCL_MIN_NCHANNELS", "4"),
        ("NCCL_TUNER_PLUGIN", "libnccl-tuner.so"),
        (
            "NCCL_TUNER_CONFIG_PATH",
            "/var/lib/tcpxo/lib64/a3plus_tuner_config.textproto",
        ),
        (
            "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE",
            "/var/lib/tcpxo/lib64/a3plus_guest_config.textproto",
        ),
        ("NCCL_DYNAMIC_CHUNK_SIZE", "524288"),
        ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
        ("NCCL_P2P_PCI_CHUNKSIZE", "524288"),
        ("NCCL_P2P_NVL_CHUNKSIZE", "1048576"),
        ("NCCL_FASTRAK_NUM_FLOWS", "2"),
        ("NCCL_FASTRAK_USE_SNAP", "1"),
        ("NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS", "600000"),
        ("NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL", "0"),
        ("NCCL_BUFFSIZE", "8388608"),
        ("NCCL_NET_GDR_LEVEL", "PIX"),
        ("NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING", "0"),
        ("NCCL_FASTRAK_USE_LLCM", "1"),
        ("NCCL_NVLS_ENABLE", "0"),
    ],
    mounts: &["/var/lib/tcpxo/lib64"],
};

/// A3 High (8 x H100 80GB, GPUDirect-TCPX).
const A3H: Preset = Preset {
    name: "hcc-a3h",
    machine: "A3 High: 8 x H100 80GB, GPUDirect-TCPX",
    gpus_per_node: 8,
    env: &[
        (
            "LD_LIBRARY_PATH",
            "/var/lib/tcpx/lib64:${LD_LIBRARY_PATH:-}",
        ),
        ("NCCL_GPUDIRECTTCPX_CTRL_DEV", "eth0"),
        ("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "eth1,eth2,eth3,eth4"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "/run/tcpx"),
        (
            "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS",
            "500000",
        ),
        ("NCCL_CROSS_NIC", "0"),
        ("NCCL_ALGO", "Ring"),
        ("NCCL_PROTO", "Simple"),
        ("NCCL_NET_GDR_LEVEL", "PIX"),
        ("NCCL_P2P_PXN_LEVEL", "0"),
        ("NCCL_DYNAMIC_CHUNK_SIZE", "524288"),
        ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
        ("NCCL_P2P_PCI_CHUNKSIZE", "524288"),
        ("NCCL_P2P_NVL_CHUNKSIZE", "1048576"),
        ("NCCL_BUFFSIZE", "4194304"),
        ("NCCL_NSOCKS_PERTHREAD", "4"),
        ("NCCL_SOCKET_NTHREADS", "1"),
        ("NCCL_MAX_NCHANNELS", "8"),
        ("NCCL_MIN_NCHANNELS", "8"),
    ],
    mounts: &["/var/lib/tcpx/lib64", "/run/tcpx"],
};

/// The gIB (RDMA over Google's network) settings A3 Ultra and A4 share; they differ in the
/// tuner configuration.
macro_rules! gib_env {
    ($tuner:literal) => {
        &[
            (
                "LD_LIBRARY_PATH",
                "/usr/local/gib/lib64:${LD_LIBRARY_PATH:-}",
            ),
            ("NCCL_NET", "gIB"),
            ("NCCL_CROSS_NIC", "0"),
            ("NCCL_NET_GDR_LEVEL", "PIX"),
            ("NCCL_P2P_NET_CHUNKSIZE", "131072"),
            ("NCCL_NVLS_CHUNKSIZE", "524288"),
            ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_TC", "52"),
            ("NCCL_IB_FIFO_TC", "84"),
            ("NCCL_TUNER_CONFIG_PATH", $tuner),
        ]
    };
}

/// A3 Ultra (8 x H200 141GB, RDMA over gIB).
const A3U: Preset = Preset {
    name: "hcc-a3u",
    machine: "A3 Ultra: 8 x H200 141GB, RDMA (gIB)",
    gpus_per_node: 8,
    env: gib_env!("/usr/local/gib/configs/tuner_config_a3u.txtpb"),
    mounts: &["/usr/local/gib"],
};

/// A4 (8 x B200, RDMA over gIB).
const A4: Preset = Preset {
    name: "hcc-a4",
    machine: "A4: 8 x B200 180GB, RDMA (gIB)",
    gpus_per_node: 8,
    env: gib_env!("/usr/local/gib/configs/tuner_config_a4.txtpb"),
    mounts: &["/usr/local/gib"],
};

pub const PRESETS: &[Preset] = &[A3M, A3U, A4, A3H];

/// The preset of this name.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_types_of_the_guides() {
        assert_eq!(names(), ["hcc-a3m", "hcc-a3u", "hcc-a4", "hcc-a3h"]);
        for p in PRESETS {
            assert_eq!(p.gpus_per_node, 8);
            assert!(p.env.iter().any(|(k, _)| *k == "LD_LIBRARY_PATH"));
            assert!(!p.mounts.is_empty());
        }
        assert!(find("hcc-a5").is_none());
    }
}
