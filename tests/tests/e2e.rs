//! End-to-end tests: the `rlany` command line run in-process on real (tiny) experiments.
//! One integration binary for the whole workspace keeps CI builds cheap.

use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// A small but real experiment: the arith environment at its easiest setting, a 1-layer
/// policy, a few steps. Budgets are tiny so the whole file runs in seconds.
const TINY: &str = r#"
Experiment(
    name: "tiny",
    seeds: [3],
    environment: Arith(max_operands: 3, difficulty: [0.0, 0.0, 0.0]),
    policy: (
        d_model: 32, layers: 1, heads: 2, kv_heads: 1, ffn: 64, max_seq_len: 48,
        warm_start: (steps: 120, batch: 32, lr: 1e-2, noise: 0.6),
        sampling: (max_step_tokens: 8),
    ),
    reward: (policy_band: (0.1, 0.9)),
    algorithm: Ppo(lr: 1e-3, policy_updates: 2),
    budget: (steps: 6, tasks_per_step: 6, group_size: 6, max_env_steps: 3,
             eval_every: 2, eval_tasks: 8, checkpoint_every: 2),
)
"#;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlany-e2e-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn rlany(args: &[&str]) -> u8 {
    let mut full = vec!["rlany"];
    full.extend_from_slice(args);
    rlany::cli_main(full)
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    fs::write(&p, text).expect("write experiment");
    p.to_string_lossy().into_owned()
}

/// Metrics lines without wall-clock fields.
fn metrics(run: &Path) -> Vec<Value> {
    let text = fs::read_to_string(run.join("metrics.jsonl")).expect("metrics.jsonl");
    text.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("json line");
            if let Value::Object(m) = &mut v {
                m.retain(|k, _| !k.starts_with("perf/"));
            }
            v
        })
        .collect()
}

fn run_tiny(dir: &Path, extra: &[&str]) -> (u8, PathBuf) {
    let file = write(dir, "tiny.ron", TINY);
    let runs = dir.join("runs");
    let runs_s = runs.to_string_lossy().into_owned();
    let mut args = vec![
        "run",
        file.as_str(),
        "--runs-dir",
        runs_s.as_str(),
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    (rlany(&args), runs.join("tiny").join("seed-3"))
}

#[test]
fn same_seed_gives_identical_metrics_and_the_policy_is_updated() {
    let a = scratch("det-a");
    let b = scratch("det-b");
    let (ca, ra) = run_tiny(&a, &[]);
    let (cb, rb) = run_tiny(&b, &[]);
    assert_eq!((ca, cb), (0, 0));
    let (ma, mb) = (metrics(&ra), metrics(&rb));
    assert_eq!(ma.len(), 7, "step 0 (warm start) + 6 steps");
    assert_eq!(
        ma, mb,
        "same experiment and seed must give the same metrics"
    );
    // The run must have exercised the PPO update, or this test proves little.
    assert!(
        ma.iter().any(|m| m.get("policy/updates").is_some()),
        "no step trained the policy: {ma:?}"
    );
    for key in [
        "eval/acc_id",
        "eval/acc_ood",
        "env/acc_mean",
        "policy/kl",
        "policy/clipfrac",
        "policy/loss",
    ] {
        assert!(ma.iter().any(|m| m.get(key).is_some()), "missing {key}");
    }
    for f in [
        "resolved.ron",
        "meta.json",
        "samples.jsonl",
        "checkpoints/latest",
    ] {
        assert!(ra.join(f).exists(), "missing {f}");
    }
    // A different seed gives a different run.
    let c = scratch("det-c");
    let file = write(&c, "tiny.ron", TINY);
    let runs = c.join("runs").to_string_lossy().into_owned();
    assert_eq!(
        rlany(&[
            "run",
            &file,
            "--runs-dir",
            &runs,
            "--no-progress",
            "--seed",
            "4"
        ]),
        0
    );
    assert_ne!(metrics(&c.join("runs/tiny/seed-4")), ma);
    for d in [a, b, c] {
        let _ = fs::remove_dir_all(d);
    }
}

#[test]
fn killed_and_resumed_run_writes_the_same_metrics() {
    let a = scratch("resume-a");
    let b = scratch("resume-b");
    let (ca, ra) = run_tiny(&a, &[]);
    assert_eq!(ca, 0);
    // Stop after step 3: the last checkpoint is step 2, and the line of step 3 is on disk.
    let (cb, rb) = run_tiny(&b, &["--stop-after", "3"]);
    assert_eq!(cb, 0);
    assert_eq!(metrics(&rb).len(), 4);
    let file = b.join("tiny.ron").to_string_lossy().into_owned();
    let rb_s = rb.to_string_lossy().into_owned();
    assert_eq!(
        rlany(&["run", &file, "--resume", &rb_s, "--no-progress"]),
        0
    );
    assert_eq!(
        metrics(&ra),
        metrics(&rb),
        "resumed run must match the uninterrupted one"
    );
    // Starting the same run again without --resume refuses to overwrite it.
    assert_eq!(run_tiny(&b, &[]).0, 1);
    // Resuming with a different experiment is refused.
    let other = write(&b, "other.ron", &TINY.replace("steps: 6,", "steps: 7,"));
    assert_ne!(
        rlany(&["run", &other, "--resume", &rb_s, "--no-progress"]),
        0
    );
    for d in [a, b] {
        let _ = fs::remove_dir_all(d);
    }
}

#[test]
fn bad_input_is_one_clear_error_exit_2_and_no_run_directory() {
    let dir = scratch("bad");
    let runs = dir.join("runs");
    let runs_s = runs.to_string_lossy().into_owned();
    let cases = [
        ("malformed", TINY.replace("seeds: [3],", "seeds: [3,")),
        (
            "unknown_field",
            TINY.replace("layers: 1,", "layers: 1, layer_count: 2,"),
        ),
        ("unknown_variant", TINY.replace("Arith(", "Arithmetic(")),
        ("group_zero", TINY.replace("group_size: 6", "group_size: 0")),
        ("negative_lr", TINY.replace("lr: 1e-3", "lr: -1e-3")),
        ("nan", TINY.replace("noise: 0.6", "noise: NaN")),
        ("no_seeds", TINY.replace("seeds: [3],", "seeds: [],")),
        ("huge", TINY.replace("d_model: 32", "d_model: 1000000000")),
        ("bad_heads", TINY.replace("kv_heads: 1", "kv_heads: 3")),
    ];
    for (name, text) in &cases {
        let f = write(&dir, &format!("{name}.ron"), text);
        assert_eq!(rlany(&["check", &f]), 2, "{name}: check");
        assert_eq!(
            rlany(&["run", &f, "--runs-dir", &runs_s, "--no-progress"]),
            2,
            "{name}: run"
        );
        assert!(!runs.exists(), "{name}: a run directory was created");
    }
    let missing = dir.join("nope.ron").to_string_lossy().into_owned();
    assert_eq!(rlany(&["check", &missing]), 2);
    assert_eq!(
        rlany(&["run", &write(&dir, "ok.ron", TINY), "--backend", "tpu"]),
        2
    );
    // The error names the file and the line of the offending field.
    let f = dir.join("group_zero.ron");
    let err = rlany_framework::Experiment::load(&f)
        .expect_err("invalid")
        .to_string();
    assert!(
        err.contains("group_zero.ron:") && err.contains("budget.group_size"),
        "{err}"
    );
    let f = dir.join("unknown_field.ron");
    let err = rlany_framework::Experiment::load(&f)
        .expect_err("invalid")
        .to_string();
    assert!(err.contains("unknown_field.ron:7:"), "{err}");
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn shipped_experiment_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("experiments");
    let mut n = 0;
    for entry in fs::read_dir(&root).expect("experiments/") {
        let p = entry.expect("entry").path();
        if p.extension().is_some_and(|e| e == "ron") {
            rlany_framework::Experiment::load(&p).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 1);
}

#[test]
fn quickstart_smoke_with_a_tiny_budget() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("experiments");
    let mut exp =
        rlany_framework::Experiment::load(&root.join("quickstart.ron")).expect("quickstart");
    exp.policy.warm_start.steps = 5;
    exp.budget.steps = 2;
    exp.budget.tasks_per_step = 4;
    exp.budget.eval_tasks = 4;
    exp.budget.eval_every = 1;
    let dir = scratch("smoke");
    let f = write(&dir, "q.ron", &exp.to_ron());
    let runs = dir.join("runs").to_string_lossy().into_owned();
    assert_eq!(rlany(&["run", &f, "--runs-dir", &runs, "--no-progress"]), 0);
    let m = metrics(&dir.join("runs/quickstart/seed-1"));
    assert_eq!(m.len(), 3);
    assert!(m.iter().all(|l| l.get("eval/acc_id").is_some()));
    let _ = fs::remove_dir_all(dir);
}
