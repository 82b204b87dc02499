//! GPU facts from NVML, loaded at run time: a machine without an NVIDIA driver simply has none.

/// Number of NVIDIA GPUs on this node, or why it cannot be known.
pub fn gpu_count() -> Result<u32, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
    nvml.device_count()
        .map_err(|e| format!("NVML cannot count devices: {e}"))
}
