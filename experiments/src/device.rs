//! Starting a GPU backend, or saying clearly why it cannot start.
//!
//! CUDA and WGPU do not report a missing driver as an error: cudarc panics when it cannot
//! load `libcuda.so`, cubecl-wgpu panics when no adapter answers, often on a worker thread
//! and followed by a stack of further panics. `probe` starts the device with one tiny read
//! before anything else happens (no run directory exists yet), catches the first panic, and
//! [`explain`] turns its message into one error that names what is missing and how to get
//! it. The error is a [`BackendUnavailable`], which the command line exits with code 2: the
//! machine cannot run what was asked, and nothing was started.

/// A backend that cannot start on this machine (exit code 2), with the cause and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendUnavailable(pub String);

/// The message of a backend that failed to start: what is missing, named from the first
/// panic message `cause` of `backend` (`"cuda:0"`, `"wgpu"`), and how to get it.
pub fn explain(backend: &str, cause: &str) -> String {
    let first: String = cause
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(300)
        .collect();
    let lower = first.to_lowercase();
    let cpu = "or run on the CPU with `--backend ndarray`";
    let fix = if backend.starts_with("cuda") {
        if lower.contains("\"nvrtc\"") || lower.contains("libnvrtc") {
            format!(
                "the CUDA runtime compiler library libnvrtc.so was not found (CubeCL compiles \
                 its kernels with it). Install CUDA's NVRTC (e.g. the `cuda-nvrtc-13-0` \
                 package) or add the folder holding libnvrtc.so to LD_LIBRARY_PATH, {cpu}"
            )
        } else if lower.contains("\"cuda\"") || lower.contains("libcuda") {
            format!(
                "the NVIDIA driver library libcuda.so was not found: this machine has no \
                 NVIDIA driver, or it is outside the loader's path. Install the NVIDIA driver \
                 (it provides libcuda.so.1; `nvidia-smi` should list the GPU) or add the \
                 folder holding libcuda.so.1 to LD_LIBRARY_PATH, {cpu}"
            )
        } else if lower.contains("no_device") || lower.contains("invalid_device") {
            format!(
                "the NVIDIA driver is installed but sees no such GPU (`nvidia-smi` lists the \
                 devices and their indices; CUDA_VISIBLE_DEVICES may hide some), {cpu}"
            )
        } else {
            format!(
                "the CUDA driver refused to start (check `nvidia-smi`; a driver older than \
                 the CUDA version the binary was built for fails this way: rebuild with \
                 CUDARC_CUDA_VERSION set to the driver's version, e.g. 12080), {cpu}"
            )
        }
    } else if lower.contains("adapter") || lower.contains("vulkan") {
        format!(
            "no GPU adapter answered: WGPU needs a Vulkan driver. Install the GPU vendor's \
             driver, or Mesa's (`mesa-vulkan-drivers` on Debian/Ubuntu, which also runs on \
             the CPU); `vulkaninfo --summary` should list a device. Check VK_ICD_FILENAMES \
             / VK_DRIVER_FILES if they are set, {cpu}"
        )
    } else {
        format!("the graphics driver refused to start, {cpu}")
    };
    format!("backend {backend} cannot start on this machine: {fix}.\n  cause: {first}")
}

/// Starts `device` with one tiny read, once per backend and process, and turns a failed
/// start into a [`BackendUnavailable`] built by [`explain`] from the first panic message.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) fn probe<B: burn::prelude::Backend>(
    backend: &str,
    device: &B::Device,
) -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static PROBED: OnceLock<Mutex<BTreeMap<String, Result<(), String>>>> = OnceLock::new();
    let probed = PROBED.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut done = probed
        .lock()
        .map_err(|_| anyhow::anyhow!("backend probe poisoned"))?;
    let outcome = done.entry(backend.to_string()).or_insert_with(|| {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let previous = std::panic::take_hook();
        let record = Arc::clone(&seen);
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            if let Ok(mut s) = record.lock() {
                s.push(text);
            }
        }));
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            burn::prelude::Tensor::<B, 1>::zeros([1], device).into_data()
        }))
        .is_ok();
        std::panic::set_hook(previous);
        if started {
            Ok(())
        } else {
            let first = seen
                .lock()
                .ok()
                .and_then(|s| s.first().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(explain(backend, &first))
        }
    });
    outcome.clone().map_err(|e| BackendUnavailable(e).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cudarc 0.19's panic when libcuda cannot be loaded (its `panic_no_lib_found`).
    const NO_LIBCUDA: &str = "Unable to dynamically load the \"cuda\" shared library - searched \
        for library names: [\"libcuda.so\", \"libcuda64.so\", \"libcuda.so.13\"]. Ensure that \
        `LD_LIBRARY_PATH` has the correct path to the installed library.";

    #[test]
    fn a_missing_cuda_driver_names_libcuda_and_the_fix() {
        let m = explain("cuda:0", NO_LIBCUDA);
        assert!(
            m.starts_with("backend cuda:0 cannot start on this machine"),
            "{m}"
        );
        assert!(m.contains("libcuda.so.1"), "{m}");
        assert!(m.contains("Install the NVIDIA driver"), "{m}");
        assert!(m.contains("LD_LIBRARY_PATH"), "{m}");
        assert!(m.contains("--backend ndarray"), "{m}");
        assert!(m.contains("cause: Unable to dynamically load"), "{m}");
    }

    #[test]
    fn a_missing_nvrtc_is_told_apart_from_a_missing_driver() {
        let m = explain("cuda:1", &NO_LIBCUDA.replace("\"cuda\"", "\"nvrtc\""));
        assert!(m.contains("libnvrtc.so"), "{m}");
        assert!(!m.contains("Install the NVIDIA driver"), "{m}");
    }

    #[test]
    fn no_device_and_an_unknown_cuda_failure_get_their_own_advice() {
        let m = explain(
            "cuda:3",
            "DriverError(CUDA_ERROR_INVALID_DEVICE, \"invalid device ordinal\")",
        );
        assert!(m.contains("sees no such GPU"), "{m}");
        let m = explain("cuda:0", "DriverError(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)");
        assert!(m.contains("CUDARC_CUDA_VERSION"), "{m}");
    }

    #[test]
    fn no_wgpu_adapter_names_vulkan_and_the_fix() {
        // cubecl-wgpu 0.10's panic when no adapter answers.
        let m = explain(
            "wgpu",
            "No possible adapter available for backend. Falling back to first available.\nmore",
        );
        assert!(m.contains("Vulkan driver"), "{m}");
        assert!(m.contains("mesa-vulkan-drivers"), "{m}");
        assert!(
            m.ends_with(
                "cause: No possible adapter available for backend. Falling back to first available."
            ),
            "{m}"
        );
    }
}
