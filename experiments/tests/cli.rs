//! Tests that need the real `rlany` executable rather than `cli_main` in-process (the
//! workspace's end-to-end tests live in tests/e2e.rs): the device script, which calls the
//! binary from bash, and a backend that cannot start, whose driver state is per process.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The CPU, shared by the tests of this binary (a read guard) or held by one alone (a write
/// guard): the MPI jobs take it alone, so that their deadlines measure the job, not the
/// other tests on two cores.
static CPU: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared_cpu() -> std::sync::RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(|e| e.into_inner())
}

#[cfg(feature = "distributed")]
fn whole_cpu() -> std::sync::RwLockWriteGuard<'static, ()> {
    CPU.write().unwrap_or_else(|e| e.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlany-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// reports/perf/device.sh stays runnable on a CPU (`BACKENDS=ndarray QUICK=1 ANCHOR=0`, the
/// loop step on the quickstart): every step runs, one merged JSON holds every workload, the
/// training run's metrics come back, and the report is written — all of it in one archive
/// beside the log.
#[test]
fn the_device_script_runs_on_the_cpu() {
    let _cpu = shared_cpu();
    let dir = scratch("device-sh");
    let bins = dir.join("bin");
    let out = dir.join("out");
    std::fs::create_dir_all(&bins).expect("bin dir");
    std::fs::copy(env!("CARGO_BIN_EXE_rlany"), bins.join("rlany")).expect("copy rlany");
    let status = Command::new("bash")
        .arg(repo_root().join("reports/perf/device.sh"))
        .current_dir(repo_root())
        .env("OUT", &out)
        .env("DIR", &bins)
        .env("BACKENDS", "ndarray")
        .env("QUICK", "1")
        .env("ANCHOR", "0")
        .env("CAP", "240")
        .env("DEADLINE", "1200")
        // The loop step (on a GPU: SmolLM2 + LoRA), here the quickstart kept tiny.
        .env("TRAIN", "1")
        .env("TRAIN_FILE", "experiments/quickstart.ron")
        .env(
            "TRAIN_TINY",
            "--set budget.tasks_per_step=4 --set budget.group_size=4 --set budget.eval_tasks=16",
        )
        .env(
            "TRAIN_SET",
            "--set budget.steps=2 --set budget.eval_every=2 --set budget.eval_tasks=16 --set policy.warm_start.steps=5",
        )
        .status()
        .expect("bash runs");
    let log = std::fs::read_to_string(out.join("device.log")).unwrap_or_default();
    assert!(status.success(), "device.sh failed:\n{log}");
    // What comes back from a device is at most 8 files: the log and one archive of the rest.
    let mut left: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    left.sort();
    assert_eq!(left, ["all.tar.gz", "device.log"]);
    let out = dir.join("unpacked");
    std::fs::create_dir_all(&out).expect("unpack dir");
    let untar = Command::new("tar")
        .arg("xzf")
        .arg(dir.join("out/all.tar.gz"))
        .arg("-C")
        .arg(&out)
        .status()
        .expect("tar runs");
    assert!(untar.success());
    assert!(!log.contains("exited"), "a step failed:\n{log}");
    assert!(log.contains("] done"), "the script did not finish:\n{log}");
    assert!(
        log.contains("train: tiny steps done") && log.contains("train: 3 metrics lines"),
        "the loop step:\n{log}"
    );
    let train = std::fs::read_to_string(out.join("train-metrics.jsonl")).expect("train metrics");
    assert_eq!(train.lines().count(), 3, "steps 0–2:\n{train}");
    assert!(!out.join("train").exists(), "the run folders are removed");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("ndarray.json")).expect("ndarray.json"),
    )
    .expect("valid JSON");
    let names: Vec<&str> = json["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for want in [
        "K1_fwd_V4096_f32",
        "R_small@quick",
        "T_small@quick",
        "C_tiny_R@quick",
        "C_tiny_T",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(
        !dir.join("out/parts").exists(),
        "the per-step parts are removed"
    );
    let report = std::fs::read_to_string(out.join("report/report.md")).expect("report.md");
    assert!(report.contains("C_tiny_T"), "{report}");
    assert!(out.join("report/figures/bench.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `rlany` with `args` and extra environment; exit code, stderr, and whether a run
/// directory was made under `runs`.
fn rlany(args: &[&str], env: &[(&str, &str)], runs: &Path) -> (i32, String, bool) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlany"));
    cmd.args(args)
        .arg("--runs-dir")
        .arg(runs)
        .arg("--no-progress")
        .current_dir(repo_root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("rlany runs");
    let made = runs.exists()
        && std::fs::read_dir(runs)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        made,
    )
}

/// Runs the quickstart on `backend` with `env` and checks that it is refused the way a
/// backend that cannot start must be: exit 2, no run directory, no panic text, and a message
/// containing each of `expected` when the backend is compiled in (`compiled`), else the
/// `--features <feature>` hint.
fn assert_refused(
    tag: &str,
    backend: &str,
    env: &[(&str, &str)],
    compiled: bool,
    expected: &[&str],
) {
    let dir = scratch(tag);
    let runs = dir.join("runs");
    let (code, err, made) = rlany(
        &["run", "experiments/quickstart.ron", "--backend", backend],
        env,
        &runs,
    );
    assert_eq!(code, 2, "{err}");
    assert!(!made, "a run directory was made: {err}");
    if compiled {
        for want in expected {
            assert!(err.contains(want), "{want:?} missing: {err}");
        }
    } else {
        assert!(err.contains(&format!("--features {backend}")), "{err}");
    }
    assert!(!err.contains("panicked"), "a panic reached the user: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--backend cuda` on a machine without the NVIDIA driver (or a binary without CUDA) is one
/// clear error, exit 2, before any run directory exists.
#[test]
fn cuda_without_a_driver_is_a_clear_error() {
    let _cpu = shared_cpu();
    let has_driver = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if cfg!(feature = "cuda") && has_driver {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    assert_refused(
        "no-cuda",
        "cuda",
        // An empty loader path, so that a driver outside the standard folders is not found.
        &[("LD_LIBRARY_PATH", "")],
        cfg!(feature = "cuda"),
        &[
            "backend cuda:0 cannot start",
            "libcuda.so",
            "Install the NVIDIA driver",
        ],
    );
}

/// `--backend wgpu` where no Vulkan driver answers (the driver list pointed at nothing) is
/// one clear error, exit 2, before any run directory exists.
#[test]
fn wgpu_without_a_vulkan_driver_is_a_clear_error() {
    let _cpu = shared_cpu();
    let missing =
        std::env::temp_dir().join(format!("rlany-no-such-icd-{}.json", std::process::id()));
    let missing = missing.to_string_lossy();
    assert_refused(
        "no-vulkan",
        "wgpu",
        &[
            ("VK_ICD_FILENAMES", &*missing),
            ("VK_DRIVER_FILES", &*missing),
            ("WGPU_BACKEND", "vulkan"),
        ],
        cfg!(feature = "wgpu"),
        &["backend wgpu cannot start", "Vulkan driver"],
    );
}

/// A backend this binary was built without is refused with the rebuild hint, exit 2, before
/// any run directory exists. Checked on the first of Flex, CUDA and WGPU that is not compiled
/// in: Flex on the default build, CUDA in CI (which compiles Flex and WGPU), so the refusal is
/// exercised in every build that lacks one.
#[test]
fn a_backend_not_compiled_in_is_refused_with_its_feature() {
    let _cpu = shared_cpu();
    let missing = [
        ("flex", cfg!(feature = "flex")),
        ("cuda", cfg!(feature = "cuda")),
        ("wgpu", cfg!(feature = "wgpu")),
    ]
    .into_iter()
    .find(|(_, compiled)| !compiled);
    match missing {
        Some((backend, _)) => assert_refused("not-compiled", backend, &[], false, &[]),
        None => eprintln!("every backend is compiled into this binary: nothing to refuse"),
    }
}

/// `rlany generate --batch N --ignore-eos` decodes N rows of exactly `--max-tokens` tokens
/// each (the throughput measurement of reports/perf/llama_cpp.sh) and says so, in row groups
/// on their own threads with `--shards` (the same greedy reply), on the file's quantized blocks
/// unless `--dense`; `--batch 0` and `--shards 0` are usage errors.
#[test]
fn generate_decodes_a_batch_of_fixed_length_rows() {
    let _cpu = shared_cpu();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
            // A short system prompt: the tiny model's context is 64 tokens.
            .args([
                "generate",
                "models/fixtures/tiny.gguf",
                "--prompt",
                "hi",
                "--system",
                "s",
            ])
            .args(extra)
            .current_dir(repo_root())
            .output()
            .expect("rlany runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, err, reply) = run(&["--batch", "3", "--ignore-eos", "--max-tokens", "5"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("3 rows, reply 15 tokens"), "{err}");
    let (code, err, sharded) = run(&[
        "--batch",
        "3",
        "--ignore-eos",
        "--max-tokens",
        "5",
        "--shards",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("3 rows, reply 15 tokens"), "{err}");
    assert_eq!(sharded, reply, "greedy rows do not depend on their group");
    // The fixture's Q4_1/Q8_0 projections are kept as blocks (rows of 3 and fewer read them);
    // `--dense` keeps the f32 weights only.
    assert!(err.contains("; packed weights;"), "{err}");
    let (code, err, _) = run(&["--max-tokens", "3", "--dense"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("; dense weights;"), "{err}");
    for (flag, message) in [
        ("--batch", "--batch must be at least 1"),
        ("--shards", "--shards must be at least 1"),
    ] {
        let (code, err, _) = run(&[flag, "0"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(message), "{err}");
    }
}

/// The full system at a tiny scale (a learned judge, the GP proposer, a KL penalty against a
/// frozen reference) with four shards: what the placement tests spread over peers.
const TINY_FULL: &str = r#"
Experiment(
    name: "tiny_placed",
    seeds: [3],
    shards: 4,
    environment: Arith(max_operands: 3, difficulty: [0.0, 0.0, 0.0]),
    policy: (
        model: Scratch(d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 48),
        warm_start: (steps: 120, batch: 32, lr: 1e-2, noise: 0.6),
        sampling: (max_step_tokens: 8),
    ),
    judge: Learned(model: Scratch(d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 64),
        warm_start: (labels: 60, label_noise: 0.25, steps: 20, batch: 16, lr: 1e-2, validation: 0.0), lr: 1e-3),
    reward: (policy_band: (0.1, 0.9), judge_band: (0.0, 1.0)),
    algorithm: Ppo(lr: 1e-3, policy_updates: 2, kl: (coef: 0.05, estimator: K2, target: Reference)),
    adaptation: Gp(target: 0.5, band: (0.3, 0.7), candidates: 64),
    gate: (window: 4, min_rollouts: 6),
    budget: (steps: 6, tasks_per_step: 6, group_size: 6, max_env_steps: 3,
             eval_every: 2, eval_tasks: 8, checkpoint_every: 2),
)
"#;

/// A run's metrics lines with the wall-clock keys removed.
fn metrics_of(run: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).expect("metrics.jsonl");
    text.lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            if let Some(m) = v.as_object_mut() {
                m.retain(|k, _| !k.starts_with("perf/") && !k.starts_with("time/"));
            }
            v
        })
        .collect()
}

/// A scratch folder named `tag` holding [`TINY_FULL`] as `tiny.ron`; the folder and the file.
fn tiny_full_in(tag: &str) -> (PathBuf, String) {
    let dir = scratch(tag);
    let file = dir.join("tiny.ron");
    std::fs::write(&file, TINY_FULL).expect("write experiment");
    (dir, file.to_string_lossy().into_owned())
}

/// The seed directory of [`TINY_FULL`] under `runs`.
fn tiny_seed(runs: &Path) -> PathBuf {
    runs.join("tiny_placed/seed-3")
}

/// [`TINY_FULL`] alone in one process: its metrics (the warm start and six steps, one of
/// them with a PPO update, else the equalities below say little).
fn tiny_alone(dir: &Path, f: &str) -> Vec<serde_json::Value> {
    let alone = dir.join("alone");
    let (code, err, _) = rlany(&["run", f, "--no-warm-cache"], &[], &alone);
    assert_eq!(code, 0, "{err}");
    let want = metrics_of(&tiny_seed(&alone));
    assert_eq!(want.len(), 7, "the warm start and six steps");
    assert!(
        want.iter().any(|m| m.get("policy/loss").is_some()),
        "the policy took a PPO update"
    );
    want
}

/// A placement is not part of the experiment: four peers in one process (threads joined
/// through host memory) write the metrics of one process running all four shards, and a run
/// checkpointed under one placement resumes under another with the same metrics.
#[test]
fn local_peers_write_the_one_process_metrics_and_resume_across_placements() {
    let _cpu = shared_cpu();
    let (dir, f) = tiny_full_in("placement");
    let run_in = |runs: &Path, extra: &[&str]| {
        let mut args = vec!["run", &f, "--no-warm-cache"];
        args.extend_from_slice(extra);
        let (code, err, _) = rlany(&args, &[], runs);
        assert_eq!(code, 0, "{args:?}: {err}");
        err
    };
    let want = tiny_alone(&dir, &f);

    let peers = dir.join("peers");
    let err = run_in(
        &peers,
        &[
            "--peers",
            "4",
            "--devices",
            "ndarray,ndarray,ndarray,ndarray",
        ],
    );
    assert!(err.contains("peer 3 of 4: seed 3 done at step 6"), "{err}");
    assert_eq!(metrics_of(&tiny_seed(&peers)), want, "four local peers");

    // Checkpointed with two peers, resumed alone; and the other way round.
    for (tag, first, then) in [
        ("two-then-one", &["--peers", "2"][..], &[][..]),
        ("one-then-two", &[][..], &["--peers", "2"][..]),
    ] {
        let runs = dir.join(tag);
        let mut a = vec!["--stop-after", "3"];
        a.extend_from_slice(first);
        run_in(&runs, &a);
        let resume = tiny_seed(&runs).to_string_lossy().into_owned();
        let mut b = vec!["--resume", resume.as_str()];
        b.extend_from_slice(then);
        run_in(&runs, &b);
        assert_eq!(metrics_of(&tiny_seed(&runs)), want, "{tag}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Open MPI's `mpirun` for `n` ranks of `rlany` (its arguments to follow), told that root may
/// run it and that ranks may outnumber the cores.
#[cfg(feature = "distributed")]
fn mpirun(n: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-n", &n.to_string()])
        .arg(env!("CARGO_BIN_EXE_rlany"))
        .current_dir(repo_root())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

/// `mpirun` for `n` ranks of `rlany args --runs-dir runs --no-progress`.
#[cfg(feature = "distributed")]
fn mpirun_run(n: usize, args: &[&str], runs: &Path) -> Command {
    let mut cmd = mpirun(n);
    cmd.args(args)
        .arg("--runs-dir")
        .arg(runs)
        .arg("--no-progress");
    cmd
}

/// Runs `cmd` to its end: exit code and stderr.
#[cfg(feature = "distributed")]
fn finish(mut cmd: Command) -> (i32, String) {
    let out = cmd.output().expect("mpirun runs (Open MPI installed?)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The process of rank `rank` among the children of the launcher `launcher` (read from the
/// environment Open MPI gives each rank).
#[cfg(feature = "distributed")]
fn rank_pid(launcher: u32, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // pid (comm) state ppid …: the comm may hold spaces, so read after its ')'.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        (ppid == launcher && env.split(|&b| b == 0).any(|v| v == want.as_bytes())).then_some(pid)
    })
}

/// Ranks under `mpirun` write the metrics of one process running all shards (two ranks and
/// four), and a run resumes across placements: one process, then two ranks, then four.
#[cfg(feature = "distributed")]
#[test]
fn mpi_ranks_write_the_one_process_metrics_and_resume_across_placements() {
    let _cpu = whole_cpu();
    let (dir, f) = tiny_full_in("placement-ranks");
    let want = tiny_alone(&dir, &f);
    for n in [2, 4] {
        let runs = dir.join(format!("ranks-{n}"));
        let (code, err) = finish(mpirun_run(n, &["run", &f, "--no-warm-cache"], &runs));
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains(&format!("rank {} of {n}: seed 3 done at step 6", n - 1)),
            "{err}"
        );
        assert_eq!(metrics_of(&tiny_seed(&runs)), want, "{n} ranks");
    }
    let runs = dir.join("one-two-four");
    let (code, err, _) = rlany(
        &["run", &f, "--no-warm-cache", "--stop-after", "2"],
        &[],
        &runs,
    );
    assert_eq!(code, 0, "{err}");
    let resume = tiny_seed(&runs).to_string_lossy().into_owned();
    for (n, stop) in [(2, &["--stop-after", "4"][..]), (4, &[][..])] {
        let mut args = vec!["run", &f, "--no-warm-cache", "--resume", &resume];
        args.extend_from_slice(stop);
        let (code, err) = finish(mpirun_run(n, &args, &runs));
        assert_eq!(code, 0, "{n} ranks: {err}");
    }
    assert_eq!(
        metrics_of(&tiny_seed(&runs)),
        want,
        "one, then two, then four"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts [`TINY_FULL`] over two ranks for 30 steps (`extra` options), waits until rank 0
/// has checkpointed step 4, and hands the launcher and rank 1's process id.
#[cfg(feature = "distributed")]
fn two_ranks_past_step_4(f: &str, runs: &Path, extra: &[&str]) -> (std::process::Child, u32) {
    let mut args = vec!["run", f, "--no-warm-cache", "--set", "budget.steps=30"];
    args.extend_from_slice(extra);
    let mut cmd = mpirun_run(2, &args, runs);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut job = cmd.spawn().expect("mpirun starts (Open MPI installed?)");
    let checkpoint = tiny_seed(runs).join("checkpoints/step-000004");
    let started = std::time::Instant::now();
    while !checkpoint.exists() {
        if let Ok(Some(status)) = job.try_wait() {
            let out = job.wait_with_output().expect("the job's output");
            panic!(
                "the job ended ({status}) before step 4: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            started.elapsed().as_secs() < 300,
            "no checkpoint after 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = rank_pid(job.id(), 1).expect("rank 1's process");
    (job, pid)
}

/// Sends `signal` (`-9`, `-STOP`) to the process `pid` and waits for the MPI job `job` to
/// end: its exit code, its stderr and the seconds from the signal to its end.
#[cfg(feature = "distributed")]
fn signal_and_wait(job: std::process::Child, pid: u32, signal: &str) -> (Option<i32>, String, f64) {
    let sent = std::time::Instant::now();
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
    let out = job.wait_with_output().expect("the job ends");
    let took = sent.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), err, took)
}

/// A rank killed in the middle of a run ends the job within seconds, the launcher naming the
/// rank; the last checkpoint resumes in one process to the metrics of a whole run.
#[cfg(feature = "distributed")]
#[test]
fn a_killed_rank_ends_the_job_naming_it_and_the_run_resumes() {
    let _cpu = whole_cpu();
    let (dir, f) = tiny_full_in("placement-killed");
    let runs = dir.join("runs");
    let (job, rank1) = two_ranks_past_step_4(&f, &runs, &[]);
    let (code, err, took) = signal_and_wait(job, rank1, "-9");
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("process rank 1") && err.contains("signal 9"),
        "{err}"
    );
    assert!(took < 30.0, "the job took {took:.1} s to end");

    // The last checkpoint is intact: the run resumes alone to its end.
    let resume = tiny_seed(&runs).to_string_lossy().into_owned();
    let (code, err, _) = rlany(
        &[
            "run",
            &f,
            "--no-warm-cache",
            "--resume",
            &resume,
            "--set",
            "budget.steps=30",
        ],
        &[],
        &runs,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(metrics_of(&tiny_seed(&runs)).len(), 31, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that hangs (stopped by SIGSTOP) is caught at --peer-timeout: rank 0 names it and
/// the exchange it never reached, and the job ends (MPI_Abort), the stopped rank with it.
#[cfg(feature = "distributed")]
#[test]
fn a_hung_rank_is_named_at_the_peer_timeout() {
    let _cpu = whole_cpu();
    let (dir, f) = tiny_full_in("placement-hung");
    let (job, rank1) = two_ranks_past_step_4(&f, &dir.join("runs"), &["--peer-timeout", "3"]);
    let (code, err, took) = signal_and_wait(job, rank1, "-STOP");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("error: rank 0 of 2"), "{err}");
    assert!(
        err.contains("did not complete within 3 s (--peer-timeout)"),
        "{err}"
    );
    assert!(err.contains("rank 1 has not been heard from for"), "{err}");
    // That the job ended is read from its exit and the stopped rank's death below, not from
    // Open MPI's own MPI_ABORT notice: under load its help system can fail to print it
    // ("ORTE_ERROR_LOG: Data unpack would read past end of buffer ... show_help.c", seen in
    // a CI run while the job ended as it should).
    assert!(
        (3.0..30.0).contains(&took),
        "the job took {took:.1} s to end"
    );
    assert!(
        !Path::new(&format!("/proc/{rank1}")).exists()
            || std::fs::read_to_string(format!("/proc/{rank1}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "the stopped rank outlived the job"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranks launched with different experiments are refused at the start (exit 2 from every
/// rank), naming the rank that differs; nothing is written.
#[cfg(feature = "distributed")]
#[test]
fn ranks_launched_with_different_experiments_are_refused() {
    let _cpu = whole_cpu();
    let (dir, f) = tiny_full_in("placement-mismatch");
    let runs = dir.join("runs");
    let runs_s = runs.to_string_lossy().into_owned();
    let mut cmd = mpirun_run(1, &["run", &f, "--no-warm-cache"], &runs);
    cmd.args([
        ":",
        "-n",
        "1",
        env!("CARGO_BIN_EXE_rlany"),
        "run",
        &f,
        "--no-warm-cache",
    ])
    .args([
        "--set",
        "budget.steps=7",
        "--runs-dir",
        &runs_s,
        "--no-progress",
    ]);
    let (code, err) = finish(cmd);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("rank 1 was launched with another experiment, seeds or resume options"),
        "{err}"
    );
    assert!(err.contains("nothing was trained"), "{err}");
    assert!(!runs.exists(), "a run directory was made: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A placement with more peers than the experiment has shards is refused before anything
/// runs (exit 2), naming the setting to change; so are devices that do not match the peers,
/// and, without the distributed build, a process an MPI launcher started among others.
#[test]
fn a_placement_that_cannot_run_is_refused() {
    let _cpu = shared_cpu();
    let dir = scratch("placement-usage");
    let runs = dir.join("runs");
    let q = "experiments/quickstart.ron";
    // (arguments, environment, what the refusal says)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = [
        (vec!["run", q, "--peers", "2"], vec![], "--set shards=2"),
        (
            vec!["run", q, "--peers", "2", "--devices", "ndarray"],
            vec![],
            "give one per peer",
        ),
    ]
    .into_iter()
    .chain((!cfg!(feature = "distributed")).then(|| {
        (
            vec!["run", q, "--set", "shards=2"],
            vec![("OMPI_COMM_WORLD_SIZE", "2")],
            "--features distributed",
        )
    }))
    .collect();
    for (args, env, want) in cases {
        let (code, err, made) = rlany(&args, &env, &runs);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!made, "a run directory was made: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rlany bench --exchange` between local peers times the exact gather, writes JSON and
/// counts this process's descriptors; under `mpirun` it also times a plain all-reduce.
#[test]
fn the_exchange_bench_times_the_exchanges() {
    let _cpu = shared_cpu();
    let dir = scratch("exchange-bench");
    let json = dir.join("exchange.json");
    let args = [
        "bench",
        "--exchange",
        "--sizes-m",
        "0.01",
        "--reps",
        "3",
        "--json",
    ];
    let mut local = Command::new(env!("CARGO_BIN_EXE_rlany"));
    local.args(args).arg(&json);
    #[cfg_attr(not(feature = "distributed"), allow(unused_mut))]
    let mut runs: Vec<(Command, usize)> = vec![(local, 1)];
    #[cfg(feature = "distributed")]
    {
        let mut ranks = mpirun(2);
        ranks.args(args).arg(&json);
        runs.push((ranks, 2));
    }
    for (mut cmd, kinds) in runs {
        let out = cmd.output().expect("the bench runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}{stderr}");
        assert!(
            stdout.contains("| exact gather | 0.010000 M | 0.080 MB |"),
            "{stdout}"
        );
        assert!(
            stdout.contains("open descriptors of this process"),
            "{stdout}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json"))
                .expect("valid JSON");
        let rows = v["exchange"].as_array().expect("rows");
        assert_eq!(rows.len(), kinds, "{stdout}");
        assert!(
            rows.iter()
                .all(|r| r["median_ms"].as_f64().is_some_and(|ms| ms > 0.0)),
            "{stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rlany env … | head`: the reader goes away before the task is printed; the command ends
/// quietly with exit 0, no panic text.
#[test]
fn a_closed_stdout_ends_rlany_env_quietly() {
    let _cpu = shared_cpu();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .args(["env", "experiments/quickstart.ron"])
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rlany starts");
    drop(child.stdout.take()); // the reader is gone before anything is written
    let out = child.wait_with_output().expect("rlany ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// `rlany generate --run`: a run's trained policy answers. A from-scratch corridor policy
/// reads the prompt as an episode (the rule's line, then a door's sign) and answers with its
/// next action; a LoRA policy on the tiny GGUF fixture answers in its chat template, with
/// its checkpoint's adapters.
#[test]
fn generate_answers_with_a_runs_trained_policy() {
    let _cpu = shared_cpu();
    let dir = scratch("generate-run");
    let runs = dir.join("runs");
    let corridor = r#"
Experiment(
    name: "cor_talk",
    seeds: [2],
    environment: Corridor(difficulty: [1.0], min_length: 3, max_length: 6, slack: 2),
    policy: (
        model: Scratch(d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 96),
        warm_start: (steps: 200, batch: 16, lr: 1e-2, noise: 0.0),
        sampling: (max_step_tokens: 4),
    ),
    algorithm: Ppo(lr: 1e-3, policy_updates: 1),
    budget: (steps: 2, tasks_per_step: 4, group_size: 4, max_env_steps: 8,
             eval_every: 2, eval_tasks: 8, checkpoint_every: 2),
)
"#;
    let lora = r#"
Experiment(
    name: "tiny_lora",
    seeds: [1],
    environment: Arith(max_operands: 3, difficulty: [0.0, 0.0, 0.0]),
    policy: (
        model: Pretrained(path: "models/fixtures/tiny.gguf", max_seq_len: 64,
                          lora: Some(r: 4, lora_alpha: 8, target_modules: ["q_proj", "v_proj"])),
        warm_start: (steps: 0),
        sampling: (max_step_tokens: 4),
    ),
    algorithm: Ppo(lr: 1e-2, policy_updates: 1),
    budget: (steps: 2, tasks_per_step: 2, group_size: 4, max_env_steps: 2,
             eval_every: 2, eval_tasks: 4, checkpoint_every: 2),
)
"#;
    for (name, text) in [("cor_talk", corridor), ("tiny_lora", lora)] {
        let file = dir.join(format!("{name}.ron"));
        std::fs::write(&file, text).expect("write");
        let (code, err, _) = rlany(&["run", &file.to_string_lossy()], &[], &runs);
        assert_eq!(code, 0, "{name}: {err}");
    }
    let talk = |run: &str, prompt: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
            .args([
                "generate",
                "--run",
                run,
                "--prompt",
                prompt,
                "--max-tokens",
                "8",
            ])
            .args(extra)
            .current_dir(repo_root())
            .output()
            .expect("rlany runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cor = runs.join("cor_talk/seed-2").to_string_lossy().into_owned();
    // The corridor's rule on its clear doors: L below 5, R otherwise (the warm start on the
    // noiseless expert taught it).
    for (sign, want) in [("1", "L"), ("8", "R"), ("0", "L"), ("9", "R")] {
        let (code, reply, err) = talk(&cor, &format!("L if sign<5 else R\n{sign}"), &[]);
        assert_eq!((code, reply.as_str()), (0, want), "door {sign}: {err}");
        assert!(err.contains("at step-000002"), "{err}");
    }
    let (code, _, err) = talk(&cor, "x", &["--checkpoint", "step-000001"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("step-000002"),
        "the kept checkpoints are named: {err}"
    );
    let lora_run = runs.join("tiny_lora/seed-1").to_string_lossy().into_owned();
    let (code, _, err) = talk(&lora_run, "hi", &["--show-prompt", "--system", "s"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("<|im_start|>user\nhi<|im_end|>"),
        "its chat template: {err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `rlany report --compare ROW=AGAINST --seeds …` on the fixture runs: the extra comparison is
/// in the printed table, and a malformed pair is refused by the parser (exit 2, the form named).
#[test]
fn report_takes_comparisons_and_seeds() {
    let _cpu = shared_cpu();
    let dir = scratch("report-compare");
    let fixture = repo_root().join("tests/fixtures/runs");
    let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .arg("report")
        .arg(&fixture)
        .args([
            "--compare",
            "c_env_gp=b_policy_judge",
            "--seeds",
            "1,2",
            "--out",
        ])
        .arg(&dir)
        .output()
        .expect("rlany report runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| c_env_gp | b_policy_judge | 1 |")
            && stdout.contains("| b_policy_judge | a_outcome_only | 1, 2 |"),
        "{stdout}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .arg("report")
        .arg(&fixture)
        .args(["--compare", "c_env_gp", "--out"])
        .arg(&dir)
        .output()
        .expect("rlany report runs");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(err.contains("joined by `=`"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rlany report` on a `rlany judge-fit` study folder rewrites its report from its cells
/// (here a copy of the committed household study); `--out` is refused there.
#[test]
fn report_rewrites_a_judge_fit_study() {
    let _cpu = shared_cpu();
    let dir = scratch("report-judge-fit");
    let cells = dir.join("cells");
    std::fs::create_dir_all(&cells).expect("cells dir");
    let src = repo_root().join("reports/results/judge-learnability/household-new/cells");
    for e in std::fs::read_dir(&src)
        .expect("committed cells")
        .filter_map(Result::ok)
    {
        std::fs::copy(e.path(), cells.join(e.file_name())).expect("copy cell");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .arg("report")
        .arg(&dir)
        .output()
        .expect("rlany report runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    // Household's kinds, not the corridor's: no borderline column, a by-kind table.
    assert!(
        md.contains("policy's steps, all (logit)") && !md.contains("borderline (logit)"),
        "{md}"
    );
    assert!(md.contains("| off_plan |"), "{md}");
    assert!(dir.join("figures/learnability.svg").exists());
    let refused = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .arg("report")
        .arg(&dir)
        .args(["--out", "/tmp/elsewhere"])
        .output()
        .expect("rlany report runs");
    assert_eq!(refused.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A step that teaches the policy nothing says so on the console: with one step allowed
/// per episode no chain can be finished, so every group fails in all its rollouts, no
/// step carries an advantage (outcome reward only), and each step's line names it with the
/// count so far.
#[test]
fn a_step_without_learning_signal_is_named_on_the_console() {
    let _cpu = shared_cpu();
    let dir = scratch("silent");
    let file = dir.join("silent.ron");
    let text = r#"
Experiment(
    name: "silent",
    seeds: [3],
    environment: Arith(max_operands: 3, difficulty: [0.0, 0.0, 0.0]),
    policy: (
        model: Scratch(d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 48),
        warm_start: (steps: 20, batch: 32, lr: 1e-2, noise: 0.6),
        sampling: (max_step_tokens: 8),
    ),
    judge: None,
    budget: (steps: 2, tasks_per_step: 2, group_size: 4, max_env_steps: 1,
             eval_every: 2, eval_tasks: 8, checkpoint_every: 2),
)
"#;
    std::fs::write(&file, text).expect("write experiment");
    let (code, err, _) = rlany(
        &["run", &file.to_string_lossy(), "--no-warm-cache"],
        &[],
        &dir.join("runs"),
    );
    assert_eq!(code, 0, "{err}");
    for (step, so_far) in [(1, 1), (2, 2)] {
        let line = err
            .lines()
            .find(|l| l.contains(&format!("step    {step}/2")))
            .unwrap_or_else(|| panic!("no line for step {step}:\n{err}"));
        assert!(
            line.contains(&format!(
                "no policy gradient (every group all solved or all failed): {so_far} of {step} steps so far"
            )),
            "{line}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--quant` is the GGUF export's and `--base-model` the PEFT export's: with another format
/// each is refused before anything is read, not ignored; `rlany --help` names the three
/// formats.
#[test]
fn export_refuses_quant_outside_gguf_and_help_names_every_format() {
    let dir = scratch("quant");
    let refusals = [
        (
            "--quant",
            "q8_0",
            ["hf", "peft"],
            "--quant is for --format gguf",
        ),
        (
            "--base-model",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            ["hf", "gguf"],
            "--base-model is for --format peft",
        ),
    ];
    for (flag, value, formats, says) in refusals {
        for format in formats {
            let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
                .args([
                    "export",
                    "no-such-run",
                    "out",
                    "--format",
                    format,
                    flag,
                    value,
                ])
                .current_dir(&dir)
                .output()
                .expect("rlany runs");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{format} {flag}: {err}");
            assert!(err.contains(says), "{format} {flag}: {err}");
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .arg("--help")
        .output()
        .expect("rlany runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("`peft`") && help.contains("`gguf`"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}
