//! Facts about the node's accelerators. Straggler scores, NVML telemetry and health checks will
//! live here (ARCHITECTURE.md, "Where the next capabilities go").

pub mod gpu;
pub mod straggler;
