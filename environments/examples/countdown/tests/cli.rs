//! The example crate as its user runs it: its own binary (`countdown`) checks the experiment
//! file, runs the environment contract's checks on the plugin and trains two steps.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `countdown args…` in the crate's folder; exit code and everything it printed.
fn countdown(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_countdown"))
        .args(args)
        .current_dir(crate_dir())
        .output()
        .expect("countdown runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_plugin_checks_and_trains_through_its_own_binary() {
    let (code, text) = countdown(&["check", "countdown.ron"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("countdown.ron: ok") && text.contains("Countdown("),
        "{text}"
    );

    let (code, text) = countdown(&["env", "countdown", "--check"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("oracle labels"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");

    let runs = std::env::temp_dir().join(format!("countdown-runs-{}", std::process::id()));
    let runs_arg = runs.to_string_lossy().into_owned();
    let (code, text) = countdown(&[
        "run",
        "countdown.ron",
        "--set",
        "budget.steps=2",
        "--set",
        "policy.warm_start.steps=20",
        "--set",
        "budget.eval_tasks=16",
        "--set",
        "budget.eval_every=2",
        "--set",
        "budget.checkpoint_every=2",
        "--runs-dir",
        &runs_arg,
        "--no-progress",
        "--no-warm-cache",
    ]);
    assert_eq!(code, 0, "{text}");
    let metrics = std::fs::read_to_string(Path::new(&runs).join("countdown/seed-1/metrics.jsonl"))
        .expect("the run's metrics");
    assert_eq!(metrics.lines().count(), 3, "step 0 and two training steps");
    let _ = std::fs::remove_dir_all(&runs);

    // A name the binary does not know is refused with the names it does.
    let (code, text) = countdown(&["env", "countup"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("countdown"), "{text}");
}
