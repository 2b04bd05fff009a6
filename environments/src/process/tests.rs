//! The process environment against the reference child and deliberately broken ones
//! (`environments/process/testdata/broken.py`).

use super::*;
use std::time::Instant;

fn script(name: &str) -> String {
    format!("{}/process/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn reference() -> ProcessSpec {
    ProcessSpec {
        command: vec!["python3".into(), script("reference.py")],
        difficulty: vec![0.5, 0.5],
        ..ProcessSpec::default()
    }
}

fn broken(mode: &str, timeout_s: f64, max_failures: usize) -> ProcessSpec {
    broken_with(&[mode], timeout_s, max_failures)
}

fn broken_with(args: &[&str], timeout_s: f64, max_failures: usize) -> ProcessSpec {
    let mut command = vec!["python3".to_string(), script("testdata/broken.py")];
    command.extend(args.iter().map(|a| a.to_string()));
    ProcessSpec {
        command,
        difficulty: vec![0.5, 0.5],
        children: 1,
        timeout_s,
        max_line_kib: 64,
        max_failures,
        ..ProcessSpec::default()
    }
}

/// Hand-checked against `reference.py`: seed 7 at difficulty 0.5 starts at 2, walks to 7
/// (distance 1 + sround(4) = 5) in steps of at most 1 + sround(1) = 2; the expert goes
/// +2, +2, +1.
#[test]
fn the_reference_child_plays_a_task_the_expert_solves() {
    let env = reference().try_build().expect("reference starts");
    let names: Vec<String> = env.difficulty_space().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["distance", "stride"]);
    assert_eq!(env.eval_levels(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    assert_eq!(env.identity().as_deref(), Some("numberline 1"));
    let mut ep = env.sample(&[0.5, 0.5], Split::Train, 7);
    assert_eq!(ep.prompt(), "from 2 to 7, steps up to 2\n");
    assert!(ep.instructions().is_some_and(|i| i.contains("+N or -N")));
    let r = ep.step("+2");
    assert_eq!((r.observation.as_str(), r.done), ("at 4", false));
    assert!(r.label);
    assert_eq!(r.dims, vec![0, 1]);
    // A wasted step: no progress, an `error:` observation, labelled wrong, no blame (invalid).
    let r = ep.step("jump");
    assert!(r.observation.starts_with("error:"), "{}", r.observation);
    assert!(!r.label && r.blame.is_empty());
    // Overshooting backwards is valid but no progress: blamed on what the step exercises.
    let r = ep.step("-1");
    assert_eq!(r.observation, "at 3");
    assert!(!r.label);
    assert_eq!(r.blame, vec![0, 1]);
    assert!(!ep.outcome());
    let (prompt, actions) = env.demonstration(&[0.5, 0.5], 0.0, 7);
    assert_eq!(prompt, "from 2 to 7, steps up to 2\n");
    assert_eq!(actions, ["+2", "+2", "+1"]);
    let mut ep = env.sample(&[0.5, 0.5], Split::Train, 7);
    for a in &actions {
        ep.step(a);
    }
    assert!(ep.done() && ep.outcome());
    // The OOD split walks down.
    let ood = env.sample(&[0.5, 0.5], Split::Ood, 7).prompt();
    let nums: Vec<i64> = ood
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .filter_map(|s| s.parse().ok())
        .collect();
    assert!(nums[1] < nums[0], "{ood}");
    assert_eq!(env.fault(), None);
    assert_eq!(env.failed_calls(), 0);
}

#[test]
fn two_environments_give_the_same_tasks_and_many_episodes_share_children() {
    let (a, b) = (reference().build(), reference().build());
    let mut eps: Vec<Box<dyn Episode>> = (0..10)
        .map(|s| a.sample(&[0.3, 0.9], Split::Eval, s))
        .collect();
    for (s, ep) in eps.iter_mut().enumerate() {
        assert_eq!(
            ep.prompt(),
            b.sample(&[0.3, 0.9], Split::Eval, s as u64).prompt()
        );
        assert!(!ep.step("+1").observation.is_empty());
    }
}

#[test]
fn the_reference_child_passes_the_conformance_checks() {
    let checks = conformance::run(&reference());
    let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        [
            "hello",
            "unknown op",
            "space",
            "deterministic",
            "expert solves",
            "step answers",
            "any action",
            "splits"
        ]
    );
    for c in &checks {
        assert!(c.ok, "{}: {}", c.name, c.detail);
    }
    // 5 levels × 3 seeds; the reference labels its expert's steps (the protocol lets a child
    // leave labels out, so the check only counts them).
    assert!(
        checks[4].detail.starts_with("15 of 15 tasks"),
        "{}",
        checks[4].detail
    );
}

/// A broken child fails its episode at the first step, within its timeout, and faults the
/// environment with a message naming the command and what happened.
fn fails_clearly(mode: &str, timeout_s: f64, expect: &[&str]) {
    let env = broken(mode, timeout_s, 1).build();
    assert_eq!(env.fault(), None, "{mode}: hello and reset still work");
    let mut ep = env.sample(&[0.5, 0.5], Split::Train, 7);
    assert_eq!(ep.prompt(), "from 2 to 7, steps up to 2\n");
    let t = Instant::now();
    let r = ep.step("+2");
    let took = t.elapsed().as_secs_f64();
    assert!(took < timeout_s + 2.0, "{mode}: {took} s");
    assert!(r.done && r.observation.is_empty() && ep.done() && !ep.outcome());
    assert_eq!(r, StepResult::ended());
    let fault = env.fault().unwrap_or_else(|| panic!("{mode}: no fault"));
    for e in expect
        .iter()
        .chain(&["broken.py", mode, "max_failures is 1"])
    {
        assert!(fault.contains(e), "{mode}: {e:?} not in {fault}");
    }
    // Faulted: later calls fail at once, starting nothing.
    let t = Instant::now();
    let ep = env.sample(&[0.5, 0.5], Split::Train, 8);
    assert!(ep.done() && ep.prompt() == FAILED_PROMPT);
    assert!(t.elapsed().as_secs_f64() < 0.5);
}

#[test]
fn a_crashing_child_is_named_with_its_exit_status_and_stderr() {
    fails_clearly(
        "crash",
        10.0,
        &[
            "exited during `step`",
            "exit status: 3",
            "crashed on purpose",
        ],
    );
}

#[test]
fn a_hanging_child_is_killed_at_its_timeout() {
    // 3 s, not less: the child's own start (a Python interpreter) must fit in the timeout of
    // its `hello` on a loaded CI machine.
    fails_clearly("hang", 3.0, &["sent no reply to `step` within 3 s"]);
}

#[test]
fn a_child_writing_garbage_is_named_with_the_line() {
    fails_clearly("garbage", 10.0, &["not JSON", "this is not json"]);
}

#[test]
fn an_oversized_line_is_refused_before_it_is_read_whole() {
    fails_clearly("oversized", 10.0, &["longer than 65536 bytes"]);
}

#[test]
fn a_reply_to_another_request_is_garbage() {
    fails_clearly("wrongseq", 10.0, &["seq is not"]);
}

#[test]
fn a_child_that_fails_its_hello_faults_the_environment_at_build() {
    // Timeouts roomy enough for a Python start on a loaded machine; only `silent` waits one out.
    for (mode, timeout_s, expect) in [
        ("silent", 3.0, "sent no reply to `hello` within 3 s"),
        ("nodims", 10.0, "1 to 16 dimensions"),
        ("oldproto", 10.0, "speaks protocol 0"),
    ] {
        let t = Instant::now();
        let env = broken(mode, timeout_s, 3).build();
        assert!(t.elapsed().as_secs_f64() < timeout_s + 2.0, "{mode}");
        let fault = env.fault().unwrap_or_else(|| panic!("{mode}: no fault"));
        assert!(
            fault.contains(expect) && fault.contains("broken.py"),
            "{fault}"
        );
        assert!(env.difficulty_space().is_empty());
    }
    let missing = ProcessSpec {
        command: vec!["/no/such/program".into()],
        ..reference()
    };
    let fault = missing.build().fault().expect("fault");
    assert!(
        fault.contains("`/no/such/program` could not be started"),
        "{fault}"
    );
}

/// `flaky` crashes at the first step of every even-seeded episode: those episodes fail, the
/// child is replaced, the episodes it held are lost, and with successes in between the
/// environment never faults (max_failures 3).
#[test]
fn a_flaky_child_is_restarted_and_its_episodes_count_as_failed() {
    let env = broken("flaky", 10.0, 3).try_build().expect("starts");
    // Both on the one child: the odd one is lost when the even one crashes it.
    let mut odd = env.sample(&[0.5, 0.5], Split::Train, 7);
    let mut even = env.sample(&[0.5, 0.5], Split::Train, 8);
    assert!(!even.step("+1").observation.starts_with("at") && even.done() && !even.outcome());
    assert!(odd.step("+2").done && !odd.outcome());
    let (mut solved, mut failed) = (0, 0);
    for seed in 10..20u64 {
        let (_, actions) = env.demonstration(&[0.5, 0.5], 0.0, seed);
        let mut ep = env.sample(&[0.5, 0.5], Split::Train, seed);
        for a in &actions {
            ep.step(a);
        }
        if ep.outcome() {
            solved += 1;
        } else {
            failed += 1;
        }
    }
    assert_eq!((solved, failed), (5, 5));
    assert_eq!(env.fault(), None);
    // The crash at seed 8 and 5 crashes at even seeds (the lost episode made no call).
    assert_eq!(env.failed_calls(), 6);
}

#[test]
fn three_failures_in_a_row_fault_the_environment() {
    let env = broken("crash", 10.0, 3).build();
    for seed in 0..2 {
        let mut ep = env.sample(&[0.5, 0.5], Split::Train, seed);
        ep.step("+1");
        assert_eq!(env.fault(), None, "after {} failures", seed + 1);
    }
    let mut ep = env.sample(&[0.5, 0.5], Split::Train, 2);
    ep.step("+1");
    let fault = env.fault().expect("third failure faults");
    assert!(
        fault.contains("3 failed calls since the last good step"),
        "{fault}"
    );
}

#[test]
fn the_conformance_checks_name_a_broken_child() {
    let checks = conformance::run(&broken("garbage", 5.0, 1000));
    let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    assert!(
        failed.contains(&"deterministic") && failed.contains(&"expert solves"),
        "{checks:?}"
    );
    assert!(checks[0].ok && checks[1].ok, "{checks:?}");
}

#[test]
fn bad_settings_are_refused_by_field() {
    let field = |s: ProcessSpec| s.validate().expect_err("invalid").field;
    assert_eq!(
        field(ProcessSpec {
            command: vec![],
            ..reference()
        }),
        "command"
    );
    assert_eq!(
        field(ProcessSpec {
            difficulty: vec![],
            ..reference()
        }),
        "difficulty"
    );
    assert_eq!(
        field(ProcessSpec {
            difficulty: vec![1.5],
            ..reference()
        }),
        "difficulty"
    );
    assert_eq!(
        field(ProcessSpec {
            children: 0,
            ..reference()
        }),
        "children"
    );
    assert_eq!(
        field(ProcessSpec {
            timeout_s: 0.0,
            ..reference()
        }),
        "timeout_s"
    );
    assert_eq!(
        field(ProcessSpec {
            max_failures: 0,
            ..reference()
        }),
        "max_failures"
    );
    assert!(reference().validate().is_ok());
}

/// Resets sent together and steps submitted together run on the children in parallel:
/// 8 episodes on 4 children that sleep 0.3 s per request take about 2 × 0.3 s per round,
/// not 8 × 0.3 s.
#[test]
fn requests_to_several_children_run_in_parallel() {
    let spec = ProcessSpec {
        children: 4,
        ..broken("slow", 10.0, 1)
    };
    let env = spec.try_build().expect("starts");
    // Start the children (a first call starts each).
    drop(env.sample_many(&vec![(vec![0.5, 0.5], Split::Train, 0); 4]));
    let tasks: Vec<_> = (0..8u64)
        .map(|s| (vec![0.5, 0.5], Split::Eval, s))
        .collect();
    let t = Instant::now();
    let mut eps = env.sample_many(&tasks);
    let reset_s = t.elapsed().as_secs_f64();
    assert!(reset_s < 1.5, "8 resets took {reset_s} s");
    for (ep, (d, split, seed)) in eps.iter().zip(&tasks) {
        assert_eq!(ep.prompt(), env.sample(d, *split, *seed).prompt());
    }
    let t = Instant::now();
    for ep in &mut eps {
        ep.submit("+1");
    }
    for ep in &mut eps {
        assert!(ep.step("+1").observation.starts_with("at "));
    }
    let step_s = t.elapsed().as_secs_f64();
    assert!(step_s < 1.5, "8 steps took {step_s} s");
    assert_eq!(env.fault(), None);
    // A step must follow the submit of its own action.
    let mut ep = env.sample(&[0.5, 0.5], Split::Train, 1);
    ep.submit("+1");
    assert!(ep.step("+2").done && !ep.outcome());
}

/// Plays the expert's trajectory of each seed in turn until the environment faults; returns
/// the episodes played and how many of them the environment ended.
fn play_until_fault(env: &ProcessEnv, seeds: std::ops::Range<u64>) -> (usize, usize) {
    let (mut played, mut ended) = (0, 0);
    for seed in seeds {
        if env.fault().is_some() {
            break;
        }
        let (_, actions) = env.demonstration(&[0.5, 0.5], 0.0, seed);
        let mut ep = match env.try_sample(&[0.5, 0.5], Split::Train, seed) {
            Ok(ep) => ep,
            Err(_) => {
                (played, ended) = (played + 1, ended + 1);
                continue;
            }
        };
        let mut failed = false;
        for a in &actions {
            failed |= ep.try_step(a).is_err();
        }
        played += 1;
        ended += usize::from(failed || ep.error().is_some());
    }
    (played, ended)
}

/// A child that crashes at every third step never fails twice in a row (each new child
/// answers two steps first), so only the failure rate stops it: with the defaults (more
/// than 0.25 of the last 20 outcomes) a third of the outcomes failing stops it after 20
/// outcomes — 7 failures, within 7 episodes of the expert's three steps.
#[test]
fn a_child_crashing_at_every_third_step_is_stopped_by_its_failure_rate() {
    let spec = ProcessSpec {
        children: 1,
        ..broken_with(&["every", "3"], 10.0, 3)
    };
    assert_eq!((spec.max_failure_rate, spec.failure_window), (0.25, 20));
    let env = spec.try_build().expect("starts");
    let t0 = Instant::now();
    let (played, ended) = play_until_fault(&env, 0..200);
    let fault = env.fault().expect("the rate bound faults it");
    assert!(played <= 7, "{played} episodes before the fault");
    assert_eq!(ended, played, "every episode reached the crash");
    assert!(
        fault.contains("7 of the last 20 calls failed")
            && fault.contains("environment.max_failure_rate 0.25")
            && fault.contains("broken.py")
            && fault.contains("crashed at step request 3"),
        "{fault}"
    );
    assert!(t0.elapsed().as_secs() < 30, "{:?}", t0.elapsed());
    let h = env.health().expect("counted");
    assert_eq!((h.failed_calls, h.timeouts), (7, 0));
    assert_eq!(
        h.restarts, 6,
        "each crash but the last was followed by a new child"
    );
    assert!(h.failed_episodes >= 7, "{h:?}");
    // With the rate bound off the same child runs on (the old behaviour, now a choice).
    let env = ProcessSpec {
        max_failure_rate: 1.0,
        ..spec.clone()
    }
    .try_build()
    .expect("starts");
    let (played, _) = play_until_fault(&env, 0..12);
    assert_eq!((played, env.fault()), (12, None));
}

/// A marker file path for the `once`/`sleeponce` modes of broken.py, not there yet: the
/// path and its text.
fn fresh_marker(tag: &str) -> (std::path::PathBuf, String) {
    let marker = std::env::temp_dir().join(format!("rlany-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let text = marker.to_string_lossy().into_owned();
    (marker, text)
}

/// One crash in a run: the episode it ended is counted, the child is restarted, nothing
/// stops, and the later episodes are solved.
#[test]
fn a_child_that_fails_once_is_counted_and_the_run_goes_on() {
    let (marker, marker_s) = fresh_marker("once");
    let env = ProcessSpec {
        children: 1,
        ..broken_with(&["once", &marker_s], 10.0, 3)
    }
    .try_build()
    .expect("starts");
    let (played, ended) = play_until_fault(&env, 0..30);
    let _ = std::fs::remove_file(&marker);
    assert_eq!((played, ended), (30, 1));
    assert_eq!(env.fault(), None);
    let h = env.health().expect("counted");
    assert_eq!(
        h,
        rlany_contract::EnvHealth {
            failed_calls: 1,
            timeouts: 0,
            restarts: 1,
            failed_episodes: 1
        }
    );
}

/// One reply later than `timeout_s`: counted as a timeout, the child is replaced, the run
/// goes on. (A 2.5 s limit against a 5 s sleep: at 1 s, a replacement child's Python start-up
/// on a loaded two-core machine once passed the limit too.)
#[test]
fn one_reply_past_its_timeout_is_counted_and_the_run_goes_on() {
    let (marker, marker_s) = fresh_marker("sleeponce");
    let env = ProcessSpec {
        children: 1,
        ..broken_with(&["sleeponce", &marker_s, "5"], 2.5, 3)
    }
    .try_build()
    .expect("starts");
    let (played, ended) = play_until_fault(&env, 0..10);
    let _ = std::fs::remove_file(&marker);
    assert_eq!((played, ended), (10, 1));
    assert_eq!(env.fault(), None);
    let h = env.health().expect("counted");
    assert_eq!(
        (h.failed_calls, h.timeouts, h.restarts, h.failed_episodes),
        (1, 1, 1, 1)
    );
}
