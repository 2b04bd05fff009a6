//! Tests that need the real `rlany` executable rather than `cli_main` in-process (the
//! workspace's end-to-end tests live in tests/e2e.rs): the device script, which calls the
//! binary from bash, and a backend that cannot start, whose driver state is per process.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The CPU, shared by the tests of this binary (a read guard) or held by one alone (a write
/// guard): the runs over two processes take it alone, since burn-collective 0.21's node sync
/// can lose a wake-up when a process is preempted at the wrong instant (README, "More than
/// one device or machine"), which two cores shared with other runs make likely.
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

/// reports/perf/device.sh stays runnable on a CPU (`BACKENDS=ndarray QUICK=1 ANCHOR=0`):
/// every step runs, one merged JSON holds every workload, and the report is written.
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
        .status()
        .expect("bash runs");
    let log = std::fs::read_to_string(out.join("device.log")).unwrap_or_default();
    assert!(status.success(), "device.sh failed:\n{log}");
    assert!(!log.contains("exited"), "a step failed:\n{log}");
    assert!(log.contains("] done"), "the script did not finish:\n{log}");
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
/// each (the throughput measurement of reports/perf/llama_cpp.sh) and says so; `--batch 0`
/// is a usage error.
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
        )
    };
    let (code, err) = run(&["--batch", "3", "--ignore-eos", "--max-tokens", "5"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("3 rows, reply 15 tokens"), "{err}");
    let (code, err) = run(&["--batch", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--batch must be at least 1"), "{err}");
}

/// The full system at a tiny scale (a learned judge, the GP proposer, a KL penalty against a
/// frozen reference) with two shards: what the placement tests spread over peers.
#[cfg(feature = "distributed")]
const TINY_FULL: &str = r#"
Experiment(
    name: "tiny_placed",
    seeds: [3],
    shards: 2,
    environment: Arith(max_operands: 3, difficulty: [0.0, 0.0, 0.0]),
    policy: (
        model: Scratch(d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 48),
        warm_start: (steps: 120, batch: 32, lr: 1e-2, noise: 0.6),
        sampling: (max_step_tokens: 8),
    ),
    judge: Learned(model: Scratch(d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 64),
        warm_start: (labels: 60, label_noise: 0.25, steps: 20, batch: 16, lr: 1e-2), lr: 1e-3),
    reward: (policy_band: (0.1, 0.9), judge_band: (0.0, 1.0)),
    algorithm: Ppo(lr: 1e-3, policy_updates: 2, kl: (coef: 0.05, estimator: K2, target: Reference)),
    adaptation: Gp(target: 0.5, band: (0.3, 0.7), candidates: 64),
    gate: (window: 4, min_rollouts: 6),
    budget: (steps: 6, tasks_per_step: 6, group_size: 6, max_env_steps: 3,
             eval_every: 2, eval_tasks: 8, checkpoint_every: 2),
)
"#;

/// A run's metrics lines with the wall-clock keys removed.
#[cfg(feature = "distributed")]
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
#[cfg(feature = "distributed")]
fn tiny_full_in(tag: &str) -> (PathBuf, String) {
    let dir = scratch(tag);
    let file = dir.join("tiny.ron");
    std::fs::write(&file, TINY_FULL).expect("write experiment");
    (dir, file.to_string_lossy().into_owned())
}

/// A placement is not part of the experiment: two peers in one process (burn-collective's
/// local all-reduce) write the metrics of one process running both shards, and a run
/// checkpointed under one placement resumes under the other with the same metrics.
#[cfg(feature = "distributed")]
#[test]
fn two_local_peers_write_the_one_process_metrics_and_resume_across_placements() {
    let _cpu = shared_cpu();
    let (dir, f) = tiny_full_in("placement");
    let run_in = |runs: &Path, extra: &[&str]| {
        let mut args = vec!["run", &f, "--no-warm-cache"];
        args.extend_from_slice(extra);
        let (code, err, _) = rlany(&args, &[], runs);
        assert_eq!(code, 0, "{args:?}: {err}");
        err
    };
    let seed = |runs: &Path| runs.join("tiny_placed/seed-3");
    let alone = dir.join("alone");
    run_in(&alone, &[]);
    let want = metrics_of(&seed(&alone));
    assert_eq!(want.len(), 7, "the warm start and six steps");
    assert!(
        want.iter().any(|m| m.get("policy/loss").is_some()),
        "the policy took a PPO update (else the equality says little)"
    );

    let peers = dir.join("peers");
    let err = run_in(
        &peers,
        &[
            "--peers",
            "2",
            "--devices",
            "ndarray,ndarray",
            "--peer-timeout",
            "60",
        ],
    );
    assert!(err.contains("peer 1 of 2: seed 3 done at step 6"), "{err}");
    assert_eq!(metrics_of(&seed(&peers)), want, "two local peers");

    // Checkpointed with two peers, resumed alone; and the other way round.
    for (tag, first, then) in [
        ("two-then-one", &["--peers", "2"][..], &[][..]),
        ("one-then-two", &[][..], &["--peers", "2"][..]),
    ] {
        let runs = dir.join(tag);
        let mut a = vec!["--stop-after", "3"];
        a.extend_from_slice(first);
        run_in(&runs, &a);
        let resume = seed(&runs).to_string_lossy().into_owned();
        let mut b = vec!["--resume", resume.as_str()];
        b.extend_from_slice(then);
        run_in(&runs, &b);
        assert_eq!(metrics_of(&seed(&runs)), want, "{tag}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n` consecutive free TCP ports on the loopback, below the kernel's ephemeral range (so
/// that no outgoing connection takes one between now and its use) and never handed out twice
/// in this process (the tests run side by side). A two-node run on coordinator port `p`
/// uses `p..p + 6`: the coordinators of even and odd sessions, then each node's two tensor
/// service ports (the default node addresses).
#[cfg(feature = "distributed")]
fn free_ports(n: u16) -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20_000 + (std::process::id() % 400) as u16 * 25,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..200 {
        let p = NEXT.fetch_add(n, Ordering::SeqCst);
        assert!(p < 32_000, "no free ports left below the ephemeral range");
        if (p..p + n).all(|q| std::net::TcpListener::bind(("127.0.0.1", q)).is_ok()) {
            return p;
        }
    }
    panic!("no {n} consecutive free ports on the loopback")
}

/// `rlany run f --no-warm-cache`, then `extra`, then the `--nodes 2` placement options for node
/// `rank`, meeting at `coord` (the nodes' tensor services at their default addresses,
/// `coord + 2 + 2 × rank`).
#[cfg(feature = "distributed")]
fn node_run(f: &str, extra: &[String], rank: u32, coord: u16, timeout: u32) -> Vec<String> {
    let mut args: Vec<String> = ["run", f, "--no-warm-cache"].map(String::from).to_vec();
    args.extend_from_slice(extra);
    args.extend(
        [
            "--nodes",
            "2",
            "--node-rank",
            &rank.to_string(),
            "--coordinator",
            &format!("127.0.0.1:{coord}"),
            "--peer-timeout",
            &timeout.to_string(),
        ]
        .map(String::from),
    );
    args
}

/// Starts node 1 of a two-node run of `args` in the background (its stderr piped).
#[cfg(feature = "distributed")]
fn spawn_node(args: &[String], runs: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_rlany"))
        .args(args)
        .arg("--runs-dir")
        .arg(runs)
        .arg("--no-progress")
        .current_dir(repo_root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rlany starts")
}

/// Times a two-node run may stop on burn-collective 0.21's lost wake-up (its node sync can
/// miss the other node's arrival, measured about once in 4000 exchanges; README, "More than
/// one device or machine") and be resumed from its last checkpoint before a test fails.
#[cfg(feature = "distributed")]
const STALLS: usize = 3;

/// Whether both nodes' errors are the deadline of an exchange (a stall, not a failure).
#[cfg(feature = "distributed")]
fn stalled(err0: &str, err1: &str) -> bool {
    err0.contains("no answer within") && err1.contains("no answer within")
}

/// Runs the experiment `f` over two processes on the loopback, node 0's runs in `runs` (with
/// `extra` options); after a stall both resume from the last checkpoint (or start again
/// before the first). Node 1's stderr and the stalls.
#[cfg(feature = "distributed")]
fn two_nodes(f: &str, runs: &Path, extra: &[&str]) -> (String, usize) {
    let seed = runs.join("tiny_placed/seed-3");
    for stalls in 0..=STALLS {
        let coord = free_ports(6);
        let checkpointed = std::fs::read_dir(seed.join("checkpoints"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        let mut options: Vec<String> = Vec::new();
        if checkpointed {
            options.extend(["--resume".to_string(), seed.to_string_lossy().into_owned()]);
        }
        options.extend(extra.iter().map(|s| s.to_string()));
        let with = |rank| node_run(f, &options, rank, coord, 20);
        let other = spawn_node(&with(1), &runs.with_extension("node-1"));
        let args0 = with(0);
        let args0: Vec<&str> = args0.iter().map(String::as_str).collect();
        let (code, err0, _) = rlany(&args0, &[], runs);
        let out1 = other.wait_with_output().expect("node 1 ends");
        let err1 = String::from_utf8_lossy(&out1.stderr).into_owned();
        if code == 0 && out1.status.code() == Some(0) {
            return (err1, stalls);
        }
        assert!(
            stalls < STALLS && stalled(&err0, &err1),
            "node 0 (exit {code}): {err0}\nnode 1: {err1}"
        );
        eprintln!(
            "two nodes stalled ({}); resuming",
            err0.lines().last().unwrap_or("")
        );
        if !checkpointed {
            let _ = std::fs::remove_dir_all(runs);
        }
    }
    unreachable!("the loop returns or fails")
}

/// Two processes on the loopback (burn-collective's global all-reduce, one session per
/// exchange) write the metrics of one process running both shards; a run checkpointed over
/// two processes resumes in one with the same metrics.
#[cfg(feature = "distributed")]
#[test]
fn two_processes_write_the_one_process_metrics() {
    let _cpu = whole_cpu();
    let (dir, f) = tiny_full_in("placement-nodes");
    let seed = |runs: &Path| runs.join("tiny_placed/seed-3");
    let alone = dir.join("alone");
    let (code, err, _) = rlany(&["run", &f, "--no-warm-cache"], &[], &alone);
    assert_eq!(code, 0, "{err}");
    let want = metrics_of(&seed(&alone));

    let nodes = dir.join("nodes");
    let (err1, stalls) = two_nodes(&f, &nodes, &[]);
    assert!(
        err1.contains("peer 1 of 2: seed 3 done at step 6"),
        "{err1}"
    );
    assert_eq!(
        metrics_of(&seed(&nodes)),
        want,
        "two processes ({stalls} stalls)"
    );

    // Checkpointed over two processes, resumed in one.
    let runs = dir.join("nodes-then-one");
    two_nodes(&f, &runs, &["--stop-after", "3"]);
    let resume = seed(&runs).to_string_lossy().into_owned();
    let (code, err, _) = rlany(
        &["run", &f, "--no-warm-cache", "--resume", &resume],
        &[],
        &runs,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(metrics_of(&seed(&runs)), want, "two processes, then one");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node killed in the middle of a run stops the other within its --peer-timeout with an
/// error naming it (exit 1), and the last checkpoint resumes to the metrics of a whole run.
#[cfg(feature = "distributed")]
#[test]
fn a_killed_node_stops_the_other_with_a_clear_error() {
    let _cpu = whole_cpu();
    let (dir, f) = tiny_full_in("placement-killed");
    let runs = dir.join("runs");
    let checkpoint = runs.join("tiny_placed/seed-3/checkpoints/step-000002");
    // Node 0 in the background; node 1 killed once node 0 has checkpointed step 2 (started
    // again, at most STALLS times, when the two stall before).
    let mut attempt = 0;
    let (node, mut other) = loop {
        let coord = free_ports(6);
        let with = |rank| node_run(&f, &[], rank, coord, 5);
        let _ = std::fs::remove_dir_all(&runs);
        let mut node = spawn_node(&with(0), &runs);
        let mut other = spawn_node(&with(1), &dir.join("node-1-runs"));
        let started = std::time::Instant::now();
        let mut ended = None;
        while !checkpoint.exists() {
            assert!(
                started.elapsed().as_secs() < 300,
                "no checkpoint after 300 s: {}",
                checkpoint.display()
            );
            if let Ok(Some(status)) = node.try_wait() {
                ended = Some(status);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let Some(status) = ended else {
            break (node, other);
        };
        let _ = other.kill();
        let out = node.wait_with_output().expect("node 0 ends");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        attempt += 1;
        assert!(
            attempt <= STALLS && stalled(&err, &err),
            "node 0 ended early ({status}) before checkpointing step 2: {err}"
        );
    };
    other.kill().expect("kill node 1");
    let killed = std::time::Instant::now();
    let _ = other.wait();
    let out = node.wait_with_output().expect("node 0 ends");
    let took = killed.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Either the deadline, or burn-collective failing at once to reach the dead node.
    assert!(
        err.contains("no answer within 5 s") || err.contains("died or went away"),
        "{err}"
    );
    assert!(err.contains("node 1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(took < 60.0, "node 0 took {took:.1} s to stop");

    // The last checkpoint is intact: the run resumes in one process to its end.
    let resume = runs
        .join("tiny_placed/seed-3")
        .to_string_lossy()
        .into_owned();
    let (code, err, _) = rlany(
        &["run", &f, "--no-warm-cache", "--resume", &resume],
        &[],
        &runs,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        metrics_of(&runs.join("tiny_placed/seed-3")).len(),
        7,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node whose peer never arrives, and a node whose coordinator never answers, stop within
/// their --peer-timeout with an error naming what is missing (exit 1), never hang.
#[cfg(feature = "distributed")]
#[test]
fn a_missing_node_or_coordinator_is_a_clear_error_within_the_timeout() {
    let _cpu = shared_cpu();
    let (dir, f) = tiny_full_in("placement-faults");
    for (rank, want) in [(0, "node 1"), (1, "coordinator 127.0.0.1")] {
        let coord = format!("127.0.0.1:{}", free_ports(2));
        let node_addr = format!("127.0.0.1:{}", free_ports(2));
        let rank_s = rank.to_string();
        let started = std::time::Instant::now();
        let (code, err, _) = rlany(
            &[
                "run",
                &f,
                "--nodes",
                "2",
                "--node-rank",
                &rank_s,
                "--coordinator",
                &coord,
                "--node-address",
                &node_addr,
                "--peer-timeout",
                "3",
            ],
            &[],
            &dir.join(format!("runs-{rank}")),
        );
        let took = started.elapsed().as_secs_f64();
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("no answer within 3 s"), "{err}");
        assert!(err.contains(want), "rank {rank}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(took < 30.0, "took {took:.1} s");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A placement with more peers than the experiment has shards is refused before anything
/// runs (exit 2), naming the setting to change; without the distributed build, the feature.
#[test]
fn a_placement_wider_than_the_shards_is_refused() {
    let _cpu = shared_cpu();
    let dir = scratch("placement-usage");
    let runs = dir.join("runs");
    let (code, err, made) = rlany(
        &["run", "experiments/quickstart.ron", "--peers", "2"],
        &[],
        &runs,
    );
    assert_eq!(code, 2, "{err}");
    assert!(!made, "a run directory was made: {err}");
    if cfg!(feature = "distributed") {
        assert!(err.contains("--set shards=2"), "{err}");
        let (code, err, _) = rlany(
            &[
                "run",
                "experiments/quickstart.ron",
                "--peers",
                "2",
                "--devices",
                "ndarray",
            ],
            &[],
            &runs,
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("give one per peer"), "{err}");
    } else {
        assert!(err.contains("--features distributed"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rlany bench --exchange` times both exchanges of a spread run and writes them as JSON.
#[cfg(feature = "distributed")]
#[test]
fn the_exchange_bench_times_both_exchanges() {
    let _cpu = shared_cpu();
    let dir = scratch("exchange-bench");
    let json = dir.join("exchange.json");
    let out = Command::new(env!("CARGO_BIN_EXE_rlany"))
        .args([
            "bench",
            "--exchange",
            "--sizes-m",
            "0.01",
            "--reps",
            "1",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("rlany runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| exact gather | 0.010 M | 0.1 MB |"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid JSON");
    let rows = v["exchange"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r["median_ms"].as_f64().is_some_and(|ms| ms > 0.0))
    );
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
