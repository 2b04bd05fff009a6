//! `rlany run --peers N` and `mpirun -n N rlany run …`: one run spread over several replicas.
//! Local peers are threads of this process, each with its own replica (on CUDA, peer `i` on
//! `cuda:<index + i>`), joined through host memory ([`HostGroup`]); ranks are processes, on
//! this machine or others, started by an MPI launcher (`mpirun`, `mpiexec`, Slurm's `srun`)
//! and joined by MPI (the `distributed` build, `mpi`).
//!
//! Placement is a launch choice, never part of the experiment: `shards` fixes the numbers,
//! and every placement of the same shards gives the same metrics (framework/METHOD.md,
//! "Placement"). Every exchange has a deadline (`--peer-timeout`): a peer that fails, stalls
//! or never arrives ends the run with an error naming it, never a hang. Ranks launched with
//! different experiments, seeds or resume options are refused before anything is written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::UsageError;
use anyhow::{Context, Result};
use rlany_framework::{BackendKind, HostGroup, Placement, RunSummary, TrainOptions};
use std::path::Path;

/// Where the peers of a run are (`rlany run`'s placement options).
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Peers in this process: replicas on threads of their own (on CUDA, peer i uses
    /// cuda:<index + i> unless --devices says otherwise). The experiment's `shards` must be
    /// at least the number of peers. Under an MPI launcher, leave it at 1: one rank per device.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub peers: u32,
    /// The backend and device of each local peer, in order (e.g. cuda:0,cuda:0 for two peers
    /// on one GPU); as many as --peers. Under MPI: one per rank on a machine, picked by the
    /// rank's place on its machine.
    #[arg(long, value_delimiter = ',', value_name = "BACKEND,...")]
    pub devices: Vec<String>,
    /// Seconds any exchange may wait for the other peers before the run ends with an error
    /// naming the late one (under MPI: the whole job, by MPI_Abort).
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub peer_timeout: u64,
}

/// The ranks an MPI launcher started this process among, read from the environment it sets
/// (Open MPI's `mpirun`: `OMPI_COMM_WORLD_SIZE`; MPICH's and Slurm's PMI: `PMI_SIZE`; PMIx
/// under `srun`: `SLURM_STEP_NUM_TASKS`), and the launcher's name; `None` when no launcher
/// started it.
pub fn launched_ranks() -> Option<(usize, &'static str)> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    if let Some(n) = var("OMPI_COMM_WORLD_SIZE") {
        return Some((n, "Open MPI's launcher"));
    }
    if let Some(n) = var("PMI_SIZE") {
        return Some((n, "an MPI launcher (PMI)"));
    }
    if std::env::var_os("PMIX_RANK").is_some() {
        return var("SLURM_STEP_NUM_TASKS").map(|n| (n, "srun (PMIx)"));
    }
    None
}

impl PlacementArgs {
    /// Whether the run is spread over more than one peer: these options, or an MPI launcher
    /// that started more than one rank.
    pub fn is_spread(&self) -> bool {
        self.peers > 1 || !self.devices.is_empty() || launched_ranks().is_some_and(|(n, _)| n > 1)
    }

    /// Every inconsistency between the options, `ranks` and the experiment, as a usage error.
    fn validate(&self, shards: usize, ranks: usize) -> Result<(), UsageError> {
        if ranks > 1 && self.peers > 1 {
            return Err(UsageError(format!(
                "--peers {} under an MPI launcher of {ranks} ranks: run one rank per device \
                 (mpirun -n {}) and leave --peers at 1",
                self.peers,
                ranks * self.peers as usize
            )));
        }
        let total = ranks.max(self.peers as usize);
        if ranks <= 1 && !self.devices.is_empty() && self.devices.len() != self.peers as usize {
            return Err(UsageError(format!(
                "--devices names {} devices for --peers {}: give one per peer",
                self.devices.len(),
                self.peers
            )));
        }
        if total > shards {
            return Err(UsageError(format!(
                "a placement of {total} peers needs the experiment's shards ≥ {total} (it has \
                 shards: {shards}); add --set shards={total}, and compare it with runs at the \
                 same shards, since shards change the numbers and placements do not"
            )));
        }
        Ok(())
    }
}

/// Trains every seed with the run spread as `args` (and an MPI launcher) say; `opts(seed)`
/// gives the options a run alone would have. Peer 0 writes the run directory and prints the
/// summary.
pub fn run_spread(
    exp: &crate::Experiment,
    seeds: &[u64],
    args: &PlacementArgs,
    opts: &(dyn Fn(u64) -> TrainOptions + Sync),
) -> Result<()> {
    let ranks = launched_ranks().filter(|&(n, _)| n > 1);
    args.validate(exp.shards, ranks.map_or(1, |(n, _)| n))?;
    let devices = args
        .devices
        .iter()
        .map(|d| crate::parse_backend(d))
        .collect::<Result<Vec<_>>>()?;
    let timeout = Duration::from_secs(args.peer_timeout);
    match ranks {
        Some((n, launcher)) => ranks::run(exp, seeds, n, launcher, &devices, timeout, opts),
        None => run_local(exp, seeds, args.peers as usize, &devices, timeout, opts),
    }
}

/// The backend of the peer at `index` on its machine: `--devices`' entry, or on CUDA the
/// experiment's device moved up by the index.
fn backend_of(exp: &crate::Experiment, devices: &[BackendKind], index: usize) -> BackendKind {
    devices.get(index).copied().unwrap_or(match exp.backend {
        BackendKind::Cuda(first) => BackendKind::Cuda(first + index),
        other => other,
    })
}

/// `peers` replicas on threads of this process, joined through host memory.
fn run_local(
    exp: &crate::Experiment,
    seeds: &[u64],
    peers: usize,
    devices: &[BackendKind],
    timeout: Duration,
    opts: &(dyn Fn(u64) -> TrainOptions + Sync),
) -> Result<()> {
    let group = HostGroup::new(peers, timeout);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..peers)
            .map(|rank| {
                let placement = Placement::over(Arc::new(group.peer(rank)));
                let mut exp = exp.clone();
                exp.backend = backend_of(&exp, devices, rank);
                let group = &group;
                s.spawn(move || {
                    let r = train_seeds(&exp, seeds, opts, &placement, "peer");
                    if let Err(e) = &r {
                        group.fail(format!("peer {rank} failed: {e:#}"));
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a peer thread panicked")))
            })
            .collect()
    });
    // The first failure is the cause; the others' errors only report it.
    results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
}

/// Trains every seed on this replica; peer 0 prints the summaries, the others one line each.
/// `who` names a peer in messages ("peer", "rank").
fn train_seeds(
    exp: &crate::Experiment,
    seeds: &[u64],
    opts: &(dyn Fn(u64) -> TrainOptions + Sync),
    placement: &Placement,
    who: &str,
) -> Result<()> {
    let (rank, peers) = (placement.rank(), placement.peers());
    for &seed in seeds {
        let mut o = opts(seed);
        o.placement = placement.clone();
        o.progress &= rank == 0;
        o.log_lines &= rank == 0;
        let started = Instant::now();
        let summary = crate::run(exp, seed, &o)
            .with_context(|| format!("run {} ({who} {rank} of {peers})", o.run_dir.display()))?;
        if rank == 0 {
            crate::print_summary(
                exp,
                seed,
                &o.run_dir,
                &summary,
                started.elapsed().as_secs_f64(),
            );
        } else {
            eprintln!(
                "{}",
                follower_line(who, rank, peers, seed, &o.run_dir, &summary)
            );
        }
    }
    Ok(())
}

/// The line a peer that is not the first prints for a finished seed.
fn follower_line(
    who: &str,
    rank: usize,
    peers: usize,
    seed: u64,
    dir: &Path,
    s: &RunSummary,
) -> String {
    format!(
        "{who} {rank} of {peers}: seed {seed} done at step {} (run directory {}, written by \
         {who} 0)",
        s.last_step,
        dir.display()
    )
}

#[cfg(not(feature = "distributed"))]
mod ranks {
    use super::*;

    pub fn run(
        _: &crate::Experiment,
        _: &[u64],
        n: usize,
        launcher: &str,
        _: &[BackendKind],
        _: Duration,
        _: &(dyn Fn(u64) -> TrainOptions + Sync),
    ) -> Result<()> {
        Err(UsageError(format!(
            "this process is one of {n} ranks started by {launcher}, but this build has no \
             MPI: build with `cargo build --release --features distributed` (it needs an MPI \
             library such as Open MPI), or run without the launcher"
        ))
        .into())
    }
}

#[cfg(feature = "distributed")]
mod ranks {
    use super::*;
    use crate::mpi::MpiJob;

    /// What must be equal on every rank of a job: the resolved experiment (its `resolved.ron`
    /// text), the seeds and the options that decide what is trained (a SHA-256, hex).
    fn launch_digest(exp: &crate::Experiment, seeds: &[u64], o: &TrainOptions) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(exp.to_ron().as_bytes());
        h.update(format!(
            "seeds {seeds:?} resume {} checkpoint {:?} stop_after {:?}",
            o.resume, o.checkpoint, o.stop_after
        ));
        format!("{:x}", h.finalize())
    }

    /// This rank of an MPI job of `n`: checks that every rank was launched alike, then trains
    /// its share; a failure prints its error and ends the whole job.
    pub fn run(
        exp: &crate::Experiment,
        seeds: &[u64],
        n: usize,
        launcher: &str,
        devices: &[BackendKind],
        timeout: Duration,
        opts: &(dyn Fn(u64) -> TrainOptions + Sync),
    ) -> Result<()> {
        let job = Arc::new(
            MpiJob::start(timeout)
                .map_err(|e| anyhow::anyhow!("starting MPI under {launcher}: {e}"))?,
        );
        if job.size != n {
            return Err(anyhow::anyhow!(
                "{launcher} said {n} ranks, MPI says {}: was the binary built against the \
                 launcher's MPI library?",
                job.size
            ));
        }
        let placement = Placement::over(job.clone());
        // Before anything is written: every rank was launched alike.
        let first = seeds.first().copied().unwrap_or_default();
        let digest = launch_digest(exp, seeds, &opts(first));
        let digests = placement.gather(digest, "the launch check")?;
        let differ: Vec<usize> = (0..n).filter(|&r| digests[r] != digests[0]).collect();
        if let Some(&other) = differ.first() {
            let list: Vec<String> = differ.iter().map(|r| r.to_string()).collect();
            return Err(UsageError(format!(
                "rank {} of {n}: rank {} {} launched with another experiment, seeds or \
                 resume options than rank 0 (SHA-256 of the resolved experiment and options \
                 {}… against rank 0's {}…): every rank must run the same file with the same \
                 --set, --seed and --resume; nothing was trained",
                job.rank,
                list.join(", "),
                if differ.len() == 1 { "was" } else { "were" },
                &digests[other][..12],
                &digests[0][..12],
            ))
            .into());
        }
        let mut exp = exp.clone();
        exp.backend = backend_of(&exp, devices, job.local_rank);
        eprintln!(
            "rank {} of {} on {} (local rank {}): {:?}",
            job.rank, job.size, job.host, job.local_rank, exp.backend
        );
        if let Err(e) = train_seeds(&exp, seeds, opts, &placement, "rank") {
            eprintln!("error: rank {} of {n} ({}): {e:#}", job.rank, job.host);
            job.abort(1);
        }
        Ok(())
    }
}

/// What `rlany bench --exchange` measures.
#[derive(Debug, Clone)]
pub struct ExchangeBench {
    /// Local peers (without an MPI launcher).
    pub peers: usize,
    /// Buffer sizes, in f32 values.
    pub sizes: Vec<usize>,
    /// Timed repetitions (the median and the 99th percentile are reported).
    pub reps: usize,
    /// An exchange whose buffer on one peer passes this many bytes is skipped.
    pub max_buffer_bytes: usize,
    /// Also write the results as JSON here.
    pub json: Option<std::path::PathBuf>,
}

/// One measured exchange: (label, values, buffer bytes per peer, [median, p99] ms or why not).
type ExchangeRow = (String, usize, usize, Result<[f64; 2], String>);

/// A peer's measured rows, and its open descriptors after its first exchange and after its
/// last.
type Measured = (Vec<ExchangeRow>, [Option<usize>; 2]);

/// `rlany bench --exchange`: for each size, the median time of the exact gather a spread run
/// uses (each peer's values in its own slot) and, between MPI ranks, of a plain all-reduce of
/// the same values; between the ranks of the MPI job that started it, else between local
/// peers. Prints a table (and writes JSON), with this process's open descriptors before and
/// after.
pub fn bench_exchange(b: &ExchangeBench) -> Result<()> {
    let (rows, peers, how) = match launched_ranks().filter(|&(n, _)| n > 1) {
        Some((_, launcher)) => ranks_bench(b, launcher)?,
        None => {
            if b.peers < 2 {
                return Err(UsageError(
                    "rlany bench --exchange: --peers must be at least 2 (or start it under \
                     mpirun)"
                        .into(),
                )
                .into());
            }
            let group = HostGroup::new(b.peers, Duration::from_secs(600));
            let mut all: Vec<Result<Measured>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..b.peers)
                    .map(|rank| {
                        let p = Placement::over(Arc::new(group.peer(rank)));
                        s.spawn(move || measure(b, &p, None::<&dyn Fn(Vec<f32>) -> Result<()>>))
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("a peer panicked")))
                    })
                    .collect()
            });
            (
                Some(all.swap_remove(0)?),
                b.peers,
                "local peers, host memory".to_string(),
            )
        }
    };
    let Some((rows, [fds, fds_after])) = rows else {
        return Ok(());
    };
    println!(
        "| exchange ({peers} {how}) | values | buffer per peer | median ms | p99 ms | GB/s of buffer |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for (label, n, buffer, ms) in &rows {
        let (med, p99, gbs) = match ms {
            Ok([med, p99]) => (
                format!("{med:.3}"),
                format!("{p99:.3}"),
                format!("{:.2}", *buffer as f64 / med / 1e6),
            ),
            Err(why) => (why.clone(), "-".into(), "-".into()),
        };
        println!(
            "| {label} | {:.6} M | {:.3} MB | {med} | {p99} | {gbs} |",
            *n as f64 / 1e6,
            *buffer as f64 / 1e6
        );
        json.push(serde_json::json!({
            "exchange": label, "values": n, "buffer_bytes": buffer, "peers": peers,
            "median_ms": ms.as_ref().ok().map(|m| m[0]),
            "p99_ms": ms.as_ref().ok().map(|m| m[1]),
            "skipped": ms.as_ref().err(),
        }));
    }
    println!(
        "open descriptors of this process: {} after the first exchange, {} after {} of each kind",
        fds.map_or("?".into(), |n| n.to_string()),
        fds_after.map_or("?".into(), |n| n.to_string()),
        b.reps.max(1) + 1
    );
    if let Some(path) = &b.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "exchange": json, "how": how,
            "open_descriptors": { "after_first": fds, "at_end": fds_after },
        }))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The bench between the ranks of an MPI job: rank 0's rows (`None` on the other ranks).
#[cfg(feature = "distributed")]
fn ranks_bench(b: &ExchangeBench, launcher: &str) -> Result<(Option<Measured>, usize, String)> {
    let job = Arc::new(
        crate::mpi::MpiJob::start(Duration::from_secs(600))
            .map_err(|e| anyhow::anyhow!("starting MPI under {launcher}: {e}"))?,
    );
    let p = Placement::over(job.clone());
    let sum = |v: Vec<f32>| -> Result<()> {
        job.all_reduce_sum(v)?;
        Ok(())
    };
    let rows = measure(b, &p, Some(&sum))?;
    let (rank, size) = (job.rank, job.size);
    Ok(((rank == 0).then_some(rows), size, "MPI ranks".to_string()))
}

#[cfg(not(feature = "distributed"))]
fn ranks_bench(_: &ExchangeBench, launcher: &str) -> Result<(Option<Measured>, usize, String)> {
    Err(UsageError(format!(
        "rlany bench --exchange was started by {launcher}, but this build has no MPI: build \
         with --features distributed"
    ))
    .into())
}

/// Times every size on this peer: the exact gather, and the plain sum where `sum` is given.
fn measure(
    b: &ExchangeBench,
    p: &Placement,
    sum: Option<&dyn Fn(Vec<f32>) -> Result<()>>,
) -> Result<Measured> {
    let rank = p.rank();
    let percentiles = |mut ms: Vec<f64>| {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        [at(0.5), at(0.99)]
    };
    let mut rows = Vec::new();
    let mut fds = None;
    for &n in &b.sizes {
        let mut kinds = vec![("exact gather", 4 * n * p.peers())];
        if sum.is_some() {
            kinds.insert(0, ("all-reduce", 4 * n));
        }
        for (label, buffer) in kinds {
            if buffer > b.max_buffer_bytes {
                let why = format!(
                    "skipped: {:.2} GiB buffer per peer (--max-buffer-gib)",
                    buffer as f64 / (1u64 << 30) as f64
                );
                rows.push((label.to_string(), n, buffer, Err(why)));
                continue;
            }
            let mut ms = Vec::with_capacity(b.reps);
            for rep in 0..b.reps.max(1) + 1 {
                let values = vec![rank as f32 + 0.5; n];
                let t = Instant::now();
                match (label, sum) {
                    ("all-reduce", Some(sum)) => sum(values)?,
                    _ => {
                        p.gather_rows(values, "bench")?;
                    }
                }
                if fds.is_none() {
                    fds = Some(open_descriptors());
                }
                // The first is a warm-up.
                if rep > 0 {
                    ms.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            rows.push((label.to_string(), n, buffer, Ok(percentiles(ms))));
        }
    }
    Ok((rows, [fds.flatten(), open_descriptors()]))
}

/// This process's open file descriptors (Linux), for the stress run's "flat" check.
fn open_descriptors() -> Option<usize> {
    std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count())
}
