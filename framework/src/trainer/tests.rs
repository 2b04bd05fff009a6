//! The loop run end to end on the framework's own stand-ins ([`crate::testing`]): a bigram
//! policy on a few doors, warm-started on a flawed expert, then trained with a perfect
//! step judge. Small enough to run in a second; what it shows is what the phases must do
//! together.

use super::*;
use crate::testing::{Bigram, Doors, Letters, TestAdaptation, TestEnvironment};
use burn::backend::{Autodiff, NdArray};

type B = Autodiff<NdArray<f32>>;

const EXPERIMENT: &str = r#"Experiment(
    name: "doors",
    seeds: [1],
    backend: NdArray,
    environment: Doors(k: 6),
    policy: (
        model: Scratch(d_model: 8, layers: 1, heads: 1, kv_heads: 1, ffn: 8, max_seq_len: 64),
        warm_start: (steps: 150, batch: 16, lr: 0.05, noise: 0.7),
        sampling: (temperature: 1.0, top_p: 1.0, max_step_tokens: 2),
    ),
    judge: Oracle(p_pos: 1.0, p_neg: 1.0),
    reward: (policy_band: (0.0, 1.0)),
    algorithm: Ppo(clip: 0.2, kl: (coef: 0.0, estimator: K3, target: Old), lr: 0.05, policy_updates: 2, max_grad_norm: 1.0),
    adaptation: Static,
    budget: (steps: 12, tasks_per_step: 4, group_size: 8, max_env_steps: 8, eval_every: 12, eval_tasks: 32, checkpoint_every: 12),
)"#;

/// Runs the experiment above into `dir`; returns its metrics, one map a line.
fn run(dir: &std::path::Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let exp =
        Experiment::<TestEnvironment, TestAdaptation>::parse(EXPERIMENT, "doors.ron".as_ref())
            .expect("experiment");
    let dev = Default::default();
    let env = Doors { k: 6 };
    let parts = Components {
        env: &env,
        tok: &Letters,
        policy: Bigram::<B>::preferring(&[], 0.0, &dev),
        judge: None,
        proposer: Box::new(crate::adapt::Static),
    };
    let opts = TrainOptions {
        run_dir: dir.to_path_buf(),
        resume: false,
        stop_after: None,
        progress: false,
        log_lines: false,
        meta: serde_json::json!({}),
        warm_cache: None,
        checkpoint: None,
        observer: None,
        placement: Placement::default(),
    };
    train::<B, _, _, _>(&exp, 1, parts, &dev, &opts).expect("run");
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| {
            let mut m: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(l).expect("json");
            m.retain(|k, _| !k.starts_with("perf/"));
            m
        })
        .collect()
}

fn mean(lines: &[serde_json::Map<String, serde_json::Value>], key: &str) -> f64 {
    let xs: Vec<f64> = lines.iter().filter_map(|m| m.get(key)?.as_f64()).collect();
    assert!(!xs.is_empty(), "{key}");
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Every phase leaves its mark: the warm start copies the flawed expert (clear doors right,
/// borderline ones mostly wrong), the perfect judge scores 1 on its pool, every wrong step
/// is classified, and PPO with step credit makes the borderline doors right — the loop's
/// learning signal reaches the tokens. The same seed writes the same metrics.
#[test]
fn warm_start_then_step_credit_fixes_the_borderline_doors() {
    let root = std::env::temp_dir().join(format!("rlany-trainer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let lines = run(&root.join("a"));
    let steps: Vec<u64> = lines.iter().filter_map(|m| m["step"].as_u64()).collect();
    assert_eq!(steps.first(), Some(&0));
    assert_eq!(steps.last(), Some(&12));
    let train: Vec<_> = lines
        .iter()
        .filter(|m| m.contains_key("env/acc_mean"))
        .cloned()
        .collect();
    assert_eq!(train.len(), 12);
    // The perfect judge on its pool, and on the policy's own steps of every training step,
    // over all and on the borderline doors (both labels there); at the clear doors, where
    // the warm-started policy is right, p⁺ is 1 too.
    assert_eq!(mean(&lines, "judge/eval_bal_acc"), 1.0);
    for key in [
        "judge/steps_bal_acc",
        "judge/steps_bal_acc/borderline",
        "judge/steps_pos_acc/clear",
    ] {
        assert!(train.iter().all(|m| m.contains_key(key)), "{key}");
        assert_eq!(mean(&train, key), 1.0, "{key}");
    }
    // Every wrong step is classified.
    for m in &train {
        let shares: f64 = ["env/wrong/borderline", "env/wrong/clear"]
            .iter()
            .filter_map(|k| m.get(*k)?.as_f64())
            .sum();
        assert!(shares == 0.0 || (shares - 1.0).abs() < 1e-9, "{m:?}");
    }
    // The warm start copies the expert: right at clear doors, wrong at borderline ones
    // (sampled at temperature 1 after 150 steps: 0.81–0.86 and 0.19–0.32 over steps 1–3).
    let (early, late) = (
        mean(&train[..3], "env/step_acc/borderline"),
        mean(&train[9..], "env/step_acc/borderline"),
    );
    let clear = mean(&train[..3], "env/step_acc/clear");
    assert!(clear > early + 0.3, "clear {clear}, borderline {early}");
    // Step credit turns the borderline doors (0.25 -> 0.62 over steps 10-12 when written),
    // and success follows.
    assert!(
        late > early + 0.2,
        "borderline right share {early} -> {late}"
    );
    let (s0, s1) = (
        mean(&train[..3], "env/acc_mean"),
        mean(&train[9..], "env/acc_mean"),
    );
    assert!(s1 > s0 + 0.1, "training success {s0} -> {s1}");
    // The same seed, the same numbers.
    assert_eq!(run(&root.join("b")), lines);
    let _ = std::fs::remove_dir_all(&root);
}

/// The warm-start cache keys hold the environment's behaviour: the same file run on changed
/// environment code (here a corridor that became shorter while its settings did not) misses
/// the cache; the same code hits it.
#[test]
fn a_warm_start_made_by_other_environment_code_is_not_reused() {
    let exp =
        Experiment::<TestEnvironment, TestAdaptation>::parse(EXPERIMENT, "doors.ron".as_ref())
            .expect("experiment");
    let now = Settings::for_env(&exp, &Doors { k: 6 });
    let again = Settings::for_env(&exp, &Doors { k: 6 });
    let changed = Settings::for_env(&exp, &Doors { k: 5 });
    assert_eq!(now.warm_policy_inputs, again.warm_policy_inputs);
    assert_eq!(now.warm_judge_inputs, again.warm_judge_inputs);
    assert_ne!(now.warm_policy_inputs, changed.warm_policy_inputs);
    assert_ne!(now.warm_judge_inputs, changed.warm_judge_inputs);
    let key = |s: &Settings| crate::warmcache::key(&s.warm_policy_inputs);
    assert_ne!(key(&now), key(&changed));
}
