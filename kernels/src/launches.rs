//! Kernel launches counted on the Cube backends (WGPU, CUDA): a measurement of how
//! launch-bound a workload is that does not depend on the device — the same model on the
//! same backend launches the same kernels on an H200 and on the CPU's Vulkan driver.
//!
//! CubeCL logs one line `Executing <kernel>` for every launch when its profiling log level is
//! `minimal`, through the `log` crate when asked to. [`count_launches`] sets that level (it
//! must run before the first Cube device of the process is created: CubeCL reads its
//! configuration once) and installs a `log` logger that counts those lines by kernel name;
//! [`launches`] reads the counts after the runtime's log has drained. Nothing else is logged.
//! Autotuning launches candidate kernels the first time an operation runs: count a workload
//! after its warm-up.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cubecl::config::profiling::ProfilingLogLevel;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl_common::config::logger::LogCrateLevel;

/// Launches by kernel name since [`count_launches`] (names as CubeCL formats them).
static COUNTS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Why launches cannot be counted in this process.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchCountError {
    /// Another `log` logger is installed.
    #[error("another logger is installed in this process; launches are counted through the log")]
    Logger,
    /// CubeCL's configuration was read before (a Cube device was created first).
    #[error("CubeCL's configuration is already fixed: count launches before creating a GPU device")]
    Configured,
}

/// The counting logger: keeps CubeCL's `Executing <kernel>` records, drops the rest.
struct Counter;

impl log::Log for Counter {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info && metadata.target().starts_with("cubecl")
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = record.args().to_string();
        if let Some(name) = line.strip_prefix("Executing ") {
            let mut counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
            *counts.entry(name.to_string()).or_default() += 1;
        }
    }

    fn flush(&self) {}
}

static COUNTER: Counter = Counter;

/// Starts counting every kernel launch of the process's Cube devices. Call it before the
/// first Cube device is created.
///
/// # Errors
/// [`LaunchCountError::Logger`] if another `log` logger is installed,
/// [`LaunchCountError::Configured`] if CubeCL's configuration was already read.
pub fn count_launches() -> Result<(), LaunchCountError> {
    log::set_logger(&COUNTER).map_err(|_| LaunchCountError::Logger)?;
    log::set_max_level(log::LevelFilter::Info);
    let mut config = CubeClRuntimeConfig::default();
    config.profiling.logger.level = ProfilingLogLevel::Minimal;
    config.profiling.logger.log = Some(LogCrateLevel::Info);
    // `set` panics when the configuration was already read; that is the caller's order.
    std::panic::catch_unwind(move || CubeClRuntimeConfig::set(config))
        .map_err(|_| LaunchCountError::Configured)
}

/// The launches counted so far, by kernel name, once the runtime's log has drained (the
/// counts unchanged for 50 ms, or 2 s at most). Synchronise the device first.
pub fn launches() -> BTreeMap<String, u64> {
    let read = || COUNTS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let total = |c: &BTreeMap<String, u64>| c.values().sum::<u64>();
    let start = Instant::now();
    let (mut last, mut since) = (read(), Instant::now());
    while start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
        let now = read();
        if total(&now) != total(&last) {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(50) {
            break;
        }
    }
    last
}
