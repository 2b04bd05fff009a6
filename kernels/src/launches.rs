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
//!
//! [`profile_launches`] counts the same way and also times each launch (CubeCL's `basic`
//! level: the runtime waits for every kernel to finish and logs `| <time> | <kernel>`);
//! [`tally`] sums those times by kernel name. A wait per launch hides the overlap of
//! launching and running, so the times say where the device's work goes, not how long the
//! workload takes unprofiled.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cubecl::config::profiling::ProfilingLogLevel;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl_common::config::logger::LogCrateLevel;

/// Launches by kernel name since [`count_launches`] (names as CubeCL formats them).
static COUNTS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Time spent in the launched kernels by kernel name since [`profile_launches`] (or
/// [`watch_grids`]), in nanoseconds.
static TIMES: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Launches with a grid of no cube (a zero in a static cube count) by kernel name, since
/// [`watch_grids`].
static EMPTY_GRIDS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

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
        } else if let Some(launch) = timed_launch(&line) {
            let mut times = TIMES.lock().unwrap_or_else(|p| p.into_inner());
            *times.entry(launch.name.to_string()).or_default() += launch.nanos;
            drop(times);
            if launch.grid.is_some_and(|g| g.contains(&0)) {
                let mut empty = EMPTY_GRIDS.lock().unwrap_or_else(|p| p.into_inner());
                *empty.entry(launch.name.to_string()).or_default() += 1;
            }
            // Counted last: `launches` waits for the counts, so the times are in by then.
            let mut counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
            *counts.entry(launch.name.to_string()).or_default() += 1;
        }
    }

    fn flush(&self) {}
}

static COUNTER: Counter = Counter;

/// One timed launch record: `basic` level `| <time> | <kernel>`, or `full` level `| <time>
/// | <kernel>: <id> CubeCount (x, y, z)` (the id's display spans lines).
#[derive(Debug, PartialEq)]
struct TimedLaunch<'a> {
    name: &'a str,
    /// The kernel's time (`Duration`'s debug form in the record).
    nanos: u64,
    /// The static grid (`full` level; `None` for a grid read from a device buffer or a
    /// `basic` record).
    grid: Option<[u32; 3]>,
}

fn timed_launch(line: &str) -> Option<TimedLaunch<'_>> {
    let (time, launch) = line.strip_prefix("| ")?.split_once(" | ")?;
    let nanos = parse_duration(time.trim())?;
    let Some((head, count)) = launch.rsplit_once(" CubeCount ") else {
        return Some(TimedLaunch {
            name: launch.trim_end(),
            nanos,
            grid: None,
        });
    };
    let name = head.split_once(": ").map_or(head, |(n, _)| n);
    let count = count.trim();
    let grid = count
        .strip_prefix("Static")
        .unwrap_or(count)
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|inner| {
            let dims: Vec<u32> = inner
                .split(',')
                .filter_map(|d| d.trim().parse().ok())
                .collect();
            <[u32; 3]>::try_from(dims).ok()
        });
    Some(TimedLaunch { name, nanos, grid })
}

/// `Duration`'s debug form (`0ns`, `812ns`, `12.5µs`, `1.234567ms`, `2.5s`) in nanoseconds.
fn parse_duration(text: &str) -> Option<u64> {
    let units = [("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)];
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|n| (n, *scale)))?;
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| (value * scale).round() as u64)
}

/// Starts counting every kernel launch of the process's Cube devices. Call it before the
/// first Cube device is created.
///
/// # Errors
/// [`LaunchCountError::Logger`] if another `log` logger is installed,
/// [`LaunchCountError::Configured`] if CubeCL's configuration was already read.
pub fn count_launches() -> Result<(), LaunchCountError> {
    start(ProfilingLogLevel::Minimal)
}

/// Starts counting launches as [`count_launches`] does and also records each launch's grid
/// ([`empty_grids`]): CubeCL's `full` profiling level, which times every launch (a device
/// synchronisation each: slow, for tests). A launch of no cube is what the CUDA driver
/// refuses (`CUDA_ERROR_INVALID_VALUE`) and the CPU's Vulkan driver runs as a no-op, so this
/// is how a test on WGPU sees one.
///
/// # Errors
/// As [`count_launches`].
pub fn watch_grids() -> Result<(), LaunchCountError> {
    start(ProfilingLogLevel::Full)
}

/// Starts counting launches as [`count_launches`] does and also times each one
/// ([`tally`]): CubeCL's `basic` profiling level, which waits for every kernel to
/// finish (slower than an unprofiled run; the times are the kernels', not the run's).
///
/// # Errors
/// As [`count_launches`].
pub fn profile_launches() -> Result<(), LaunchCountError> {
    start(ProfilingLogLevel::Basic)
}

/// [`launches`] and the time spent in each kernel since [`profile_launches`], after one drain
/// of the runtime's log: the counts by kernel name, and the milliseconds by kernel name (empty
/// when launches are only counted).
pub fn tally() -> (BTreeMap<String, u64>, BTreeMap<String, f64>) {
    let counts = launches();
    (counts, times_so_far())
}

/// The recorded times in milliseconds, as they stand (no drain).
fn times_so_far() -> BTreeMap<String, f64> {
    TIMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, &ns)| (k.clone(), ns as f64 * 1e-6))
        .collect()
}

/// Launches with an empty grid since [`watch_grids`], by kernel name (after the runtime's
/// log has drained, as [`launches`]).
pub fn empty_grids() -> BTreeMap<String, u64> {
    let _ = launches();
    EMPTY_GRIDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

fn start(level: ProfilingLogLevel) -> Result<(), LaunchCountError> {
    log::set_logger(&COUNTER).map_err(|_| LaunchCountError::Logger)?;
    log::set_max_level(log::LevelFilter::Info);
    let mut config = CubeClRuntimeConfig::default();
    config.profiling.logger.level = level;
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

#[cfg(test)]
mod tests {
    use super::{TimedLaunch, parse_duration, timed_launch};

    /// The line format of CubeCL 0.10's `full` profiling level (`client.rs`, `launch_inner`).
    #[test]
    fn full_profiling_lines_give_the_kernel_and_its_grid() {
        let launch_with_grid = |line| timed_launch(line).map(|l| (l.name, l.grid));
        // As llvmpipe logged it for a tensor of no elements filled with zeros.
        let line = "| 0ns        | burn_cubecl::FullKernel<WgpuRuntime>: FullKernelInfo {\n    \
                    settings: KernelSettings {\n    },\n} CubeCount (0, 0, 0)";
        assert_eq!(
            launch_with_grid(line),
            Some(("burn_cubecl::FullKernel<WgpuRuntime>", Some([0, 0, 0])))
        );
        let static_form = "| 1.2ms | Fill: 0x1f CubeCount Static(4, 1, 1)";
        assert_eq!(
            launch_with_grid(static_form),
            Some(("Fill", Some([4, 1, 1])))
        );
        let dynamic = "| 3µs | Matmul: 0x2 CubeCount Dynamic(Binding { id: 4 })";
        assert_eq!(launch_with_grid(dynamic), Some(("Matmul", None)));
        assert_eq!(launch_with_grid("Executing Copy"), None);
    }

    /// The `basic` level's record (`logging/server.rs`: `| {duration:<10?} | {name}`) and
    /// `Duration`'s debug form.
    #[test]
    fn basic_profiling_lines_give_the_kernel_and_its_time() {
        assert_eq!(
            timed_launch("| 1.5ms      | burn_cubecl::kernel::matmul::Tiling"),
            Some(TimedLaunch {
                name: "burn_cubecl::kernel::matmul::Tiling",
                nanos: 1_500_000,
                grid: None,
            })
        );
        assert_eq!(
            timed_launch("| 2.25µs     | Fused").map(|l| l.nanos),
            Some(2250)
        );
        assert_eq!(parse_duration("0ns"), Some(0));
        assert_eq!(parse_duration("812ns"), Some(812));
        assert_eq!(parse_duration("1.234567ms"), Some(1_234_567));
        assert_eq!(parse_duration("2.5s"), Some(2_500_000_000));
        assert_eq!(parse_duration("ms"), None);
        assert_eq!(parse_duration("1.2 ms"), None);
        // The summary table CubeCL logs at each sync is not a launch.
        assert_eq!(timed_launch("|⎺⎺⎺⎺| \n| Kernel Name | Count |"), None);
        assert_eq!(timed_launch("| Kernel Name | Count | Total |"), None);
    }
}
