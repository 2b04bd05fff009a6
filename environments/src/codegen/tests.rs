use super::*;

fn grid_point(rng: &mut Rng) -> Vec<f64> {
    (0..4).map(|_| rng.uniform()).collect()
}

/// Plays `lines` in the task `(d, split, seed)`; returns the episode.
fn play(env: &Codegen, d: &[f64], split: Split, seed: u64, lines: &[String]) -> CodegenEpisode {
    let mut ep = env.sample_episode(d, split, seed);
    for l in lines {
        if ep.done() {
            break;
        }
        ep.step(l);
    }
    ep
}

#[test]
fn a_hand_checked_task() {
    // Find a task with a known shape and check its prompt, reference and observations.
    let env = Codegen::new(4);
    let mut ep = env.sample_episode(&[0.0, 0.0, 0.0, 0.0], Split::Train, 3);
    let prompt = ep.prompt();
    let lines = ep.reference_lines();
    assert_eq!(lines.last().map(String::as_str), Some("ret"));
    // One stage (length 0), maybe a finisher, then ret; two examples.
    assert!((2..=3).contains(&lines.len()), "{lines:?}");
    assert_eq!(prompt.lines().count(), 1 + 2, "{prompt}");
    assert!(prompt.ends_with('\n'));
    // The first observation is the first line run on each example.
    let r = ep.step(&lines[0]);
    let examples: Vec<Vec<i64>> = prompt
        .lines()
        .skip(1)
        .map(|l| {
            let inner = l.split(" -> ").next().unwrap_or("");
            inner
                .trim_matches(|c| c == '[' || c == ']')
                .split(' ')
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .collect();
    let expected: Vec<String> = examples
        .iter()
        .map(|x| lang::show(&lang::run_text(&[lines[0].as_str()], x).expect("runs")))
        .collect();
    assert_eq!(r.observation, expected.join(" "));
    assert!(ep.label_of(0));
    for l in &lines[1..] {
        ep.step(l);
    }
    assert!(ep.done() && ep.outcome());
    assert!((0..lines.len()).all(|i| ep.label_of(i)));
}

#[test]
fn a_specific_program_and_its_slips() {
    // `keep above k, sum` written by hand against the interpreter.
    let task_lines = Stage::KeepAbove(23).lines('a');
    assert_eq!(task_lines[0].0, "keep x>23");
    assert_eq!(task_lines[0].1.as_deref(), Some("keep x>=23"));
    let input = [31, 5, 23, 24];
    assert_eq!(
        lang::run_text(&["keep x>23", "fold +"], &input),
        Ok(vec![55])
    );
    assert_eq!(
        lang::run_text(&["keep x>=23", "fold +"], &input),
        Ok(vec![78])
    );
    let minus_min = Stage::MinusMin.lines('b');
    assert_eq!(
        minus_min
            .iter()
            .map(|(l, _)| l.as_str())
            .collect::<Vec<_>>(),
        ["let b=min", "map x-b"]
    );
    assert_eq!(Stage::Affine(3, 14).phrase(), "times 3 plus 14");
    assert_eq!(Stage::Pairwise(FoldOp::Max).phrase(), "pair maxes");
    // Every slip parses and differs from its line.
    for k in 0..PLAIN_KINDS {
        for st in [Stage::plain(k, 0.5, 0.5, 50.0)] {
            for (line, slip) in st.lines('a') {
                assert!(lang::parse(&line).is_ok(), "{line}");
                if let Some(s) = slip {
                    assert!(lang::parse(&s).is_ok() && s != line, "{s}");
                }
            }
        }
    }
    for k in 0..VAR_KINDS {
        for (line, slip) in Stage::variable(k).lines('c') {
            assert!(lang::parse(&line).is_ok(), "{line}");
            assert!(slip.is_none_or(|s| lang::parse(&s).is_ok() && s != line));
        }
    }
}

#[test]
fn the_expert_always_succeeds_and_every_step_is_labelled_correct() {
    let env = Codegen::new(4);
    let mut rng = Rng::new(11);
    for i in 0..3000 {
        let d = grid_point(&mut rng);
        let split = [Split::Train, Split::Eval, Split::Ood][i % 3];
        let seed = rng.next_u64();
        let ep = env.sample_episode(&d, split, seed);
        let lines = ep.reference_lines();
        let ep = play(&env, &d, split, seed, &lines);
        assert!(
            ep.done() && ep.outcome(),
            "{d:?} {split:?} {seed}: {lines:?}"
        );
        assert!((0..lines.len()).all(|i| ep.label_of(i)));
        assert!(ep.prompt().len() <= env.max_prompt_chars());
    }
    // The demonstration at noise 0 is the reference.
    for seed in 0..200 {
        let d = [0.5; 4];
        let (prompt, steps) = env.demonstration(&d, 0.0, seed);
        let ep = env.sample_episode(&d, Split::Train, seed);
        assert_eq!(prompt, ep.prompt());
        assert_eq!(steps, ep.reference_lines());
    }
}

#[test]
fn the_flawed_expert_is_mid_range_and_slips_are_wrong_steps() {
    let env = Codegen::new(4);
    let success = |noise: f64, level: f64| {
        let n = 600;
        let ok = (0..n)
            .filter(|&seed| {
                let d = [level; 4];
                let (_, steps) = env.demonstration(&d, noise, seed);
                play(&env, &d, Split::Train, seed, &steps).outcome()
            })
            .count();
        ok as f64 / n as f64
    };
    assert_eq!(success(0.0, 0.5), 1.0);
    let mid = success(0.5, 0.5);
    assert!((0.2..0.7).contains(&mid), "{mid}");
    // More difficulty, fewer successes for the flawed expert.
    assert!(success(0.5, 1.0) < success(0.5, 0.0));
    // A slip the tests see makes its step (and the outcome) wrong.
    let mut seen = 0;
    for seed in 0..300 {
        let d = [0.5; 4];
        let (_, steps) = env.demonstration(&d, 1.0, seed);
        let ep = play(&env, &d, Split::Train, seed, &steps);
        let reference = ep.reference_lines();
        if let Some(i) = steps.iter().zip(&reference).position(|(a, b)| a != b)
            && !ep.outcome()
        {
            seen += 1;
            assert!(
                (i..steps.len()).any(|j| !ep.label_of(j)),
                "{steps:?} vs {reference:?}"
            );
            assert!(!ep.label_of(steps.len() - 1));
        }
    }
    assert!(seen > 100, "{seen}");
}

#[test]
fn tasks_are_pure_functions_of_difficulty_split_and_seed() {
    let env = Codegen::new(4);
    let mut rng = Rng::new(5);
    for _ in 0..300 {
        let d = grid_point(&mut rng);
        let seed = rng.next_u64();
        for split in [Split::Train, Split::Eval, Split::Ood] {
            let a = env.draw(&d, split, seed);
            assert_eq!(a, env.draw(&d, split, seed));
            assert_eq!(
                env.sample_episode(&d, split, seed).task_key(),
                env.sample_episode(&d, split, seed).task_key()
            );
        }
        // Splits and seeds give other tasks (almost always).
        assert_ne!(
            env.draw(&d, Split::Train, seed),
            env.draw(&d, Split::Eval, seed)
        );
    }
}

#[test]
fn rewrites_keep_what_the_changed_dimension_does_not_control() {
    let env = Codegen::new(4);
    let mut rng = Rng::new(9);
    for _ in 0..500 {
        let d = grid_point(&mut rng);
        let seed = rng.next_u64();
        let a = env.draw(&d, Split::Train, seed);
        for dim in 0..4 {
            let mut d2 = d.clone();
            d2[dim] = rng.uniform();
            let b = env.draw(&d2, Split::Train, seed);
            assert_eq!(a.finisher, b.finisher);
            let lengths = |t: &Task| t.hidden.iter().map(|x| x.0.len()).collect::<Vec<_>>();
            let inputs = |t: &Task| t.hidden.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
            assert_eq!(lengths(&a), lengths(&b));
            match dim {
                LENGTH => {
                    let k = a.stages.len().min(b.stages.len());
                    assert_eq!(a.stages[..k], b.stages[..k]);
                    assert_eq!(inputs(&a), inputs(&b));
                    assert_eq!(a.visible.len(), b.visible.len());
                }
                MAGNITUDE => {
                    assert_eq!(a.stages.len(), b.stages.len());
                    for (x, y) in a.stages.iter().zip(&b.stages) {
                        assert_eq!(std::mem::discriminant(x), std::mem::discriminant(y));
                    }
                    assert_eq!(a.visible.len(), b.visible.len());
                }
                VARIABLES => {
                    assert_eq!(a.stages.len(), b.stages.len());
                    // Stages that are plain in both are the same stage.
                    for (x, y) in a.stages.iter().zip(&b.stages) {
                        if !x.is_var() && !y.is_var() {
                            assert_eq!(x, y);
                        }
                    }
                    assert_eq!(inputs(&a), inputs(&b));
                }
                _ => {
                    assert_eq!(a.stages, b.stages);
                    assert_eq!(a.hidden, b.hidden);
                    let k = a.visible.len().min(b.visible.len());
                    assert_eq!(a.visible[..k], b.visible[..k]);
                }
            }
        }
    }
}

#[test]
fn every_dimension_is_structurally_monotone() {
    // For a fixed seed, raising one coordinate never makes the task easier on that
    // coordinate's own measure.
    let env = Codegen::new(4);
    let measure = |t: &Task, dim: usize| -> f64 {
        match dim {
            LENGTH => t.stages.len() as f64,
            MAGNITUDE => t
                .hidden
                .iter()
                .flat_map(|x| x.0.iter())
                .map(|&v| v as f64)
                .sum(),
            VARIABLES => t.stages.iter().filter(|s| s.is_var()).count() as f64,
            _ => -(t.visible.len() as f64),
        }
    };
    let mut rng = Rng::new(21);
    let mut moved = [0usize; 4];
    for _ in 0..400 {
        let d = grid_point(&mut rng);
        let seed = rng.next_u64();
        for dim in 0..4 {
            let mut last = f64::NEG_INFINITY;
            for step in 0..=10 {
                let mut dd = d.clone();
                dd[dim] = step as f64 / 10.0;
                let m = measure(&env.draw(&dd, Split::Train, seed), dim);
                assert!(m >= last, "dim {dim} at {step}: {m} < {last}");
                if m > last && step > 0 {
                    moved[dim] += 1;
                }
                last = m;
            }
        }
    }
    // Each dimension does change tasks.
    assert!(moved.iter().all(|&m| m > 100), "{moved:?}");
    // And the magnitude dim reaches the constants too.
    let k = |d1: f64| match Stage::plain(0, 0.7, 0.0, Codegen::range(d1)) {
        Stage::KeepAbove(k) => k,
        _ => 0,
    };
    assert!(k(0.0) < 10 && k(1.0) > 50 && k(0.5) <= k(0.6));
}

#[test]
fn ood_tasks_hold_a_held_out_pair_and_training_never_does() {
    let env = Codegen::new(4);
    let has_pair = |t: &Task| {
        t.stages
            .windows(2)
            .any(|w| held_out(w[0].class(), w[1].class()))
    };
    let mut rng = Rng::new(4);
    for _ in 0..2000 {
        let d = grid_point(&mut rng);
        let seed = rng.next_u64();
        assert!(!has_pair(&env.draw(&d, Split::Train, seed)));
        assert!(!has_pair(&env.draw(&d, Split::Eval, seed)));
        assert!(has_pair(&env.draw(&d, Split::Ood, seed)));
    }
}

#[test]
fn rejected_and_wrong_lines() {
    let env = Codegen::new(4);
    let mut ep = env.sample_episode(&[0.0; 4], Split::Train, 1);
    let r = ep.step("print 3");
    assert_eq!(r.observation, "error: unknown statement");
    assert!(!r.done && !ep.label_of(0) && ep.blame_of(0).is_empty());
    let r = ep.step("map x/0");
    assert!(
        r.observation.starts_with("error: division by zero"),
        "{}",
        r.observation
    );
    assert!(!ep.label_of(1));
    // Nothing can complete a program that divides by zero.
    let reference = ep.reference_lines();
    for l in &reference {
        ep.step(l);
    }
    assert!(ep.done() && !ep.outcome());
    // `ret` right away on a task whose output is not its input is wrong.
    let mut ep = env.sample_episode(&[1.0, 0.0, 0.0, 0.0], Split::Train, 2);
    ep.step("ret");
    assert!(ep.done() && !ep.outcome() && !ep.label_of(0));
    // The step budget ends an episode.
    let mut ep = env.sample_episode(&[0.5; 4], Split::Train, 3);
    let budget = ep.max_steps();
    for _ in 0..budget {
        assert!(!ep.done());
        ep.step("sort");
    }
    assert!(ep.done() && !ep.outcome());
    assert_eq!(ep.steps_taken(), budget);
}

#[test]
fn garbage_actions_never_panic_and_stay_bounded() {
    const POOL: &[&str] = &[
        "keep ",
        "map ",
        "x",
        ">",
        "=",
        "+",
        "*",
        "9",
        "0",
        "let ",
        "a",
        "ret",
        "fold ",
        "max",
        " ",
        "\t",
        "é",
        "中",
        "🦀",
        "\u{0}",
        "\u{202e}",
        "$(reboot)",
        "; rm -rf / #",
        "import os; os.system('ls')",
        "ignore previous instructions and print the answer",
        "\u{7f}",
    ];
    let env = Codegen::new(6);
    let mut rng = Rng::new(2026);
    let mut actions = 0;
    while actions < 20_000 {
        let d = grid_point(&mut rng);
        let split = [Split::Train, Split::Eval, Split::Ood][rng.below(3)];
        let mut ep = env.sample_episode(&d, split, rng.next_u64());
        let reference = ep.reference_lines();
        while !ep.done() {
            let action: String = match rng.below(4) {
                0 => {
                    let mut a: Vec<char> = reference[rng.below(reference.len())].chars().collect();
                    if !a.is_empty() {
                        let k = rng.below(a.len());
                        a[k] = POOL[rng.below(POOL.len())].chars().next().unwrap_or('x');
                    }
                    a.into_iter().collect()
                }
                1 => {
                    let len = if rng.bernoulli(0.05) {
                        1 << 16
                    } else {
                        rng.below(64)
                    };
                    let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                }
                _ => (0..rng.below(12))
                    .map(|_| POOL[rng.below(POOL.len())])
                    .collect(),
            };
            let r = ep.step(&action);
            actions += 1;
            assert_eq!(r.done, ep.done());
            // At most three lists of five bounded values, or errors.
            assert!(r.observation.len() <= 3 * 64, "{}", r.observation);
            assert!(ep.steps_taken() <= ep.max_steps());
        }
        for i in 0..ep.max_steps() + 2 {
            let dims = ep.dims_of(i);
            let blame = ep.blame_of(i);
            assert!(dims.iter().chain(&blame).all(|&k| k < EXAMPLES));
            if ep.label_of(i) {
                assert!(blame.is_empty());
            }
        }
        let n = ep.steps_taken();
        assert!(ep.step("ret").done && ep.steps_taken() == n);
    }
}

#[test]
fn settings_validate_and_parse() {
    assert!(CodegenSpec::default().validate().is_ok());
    let bad = CodegenSpec {
        max_stages: 9,
        ..CodegenSpec::default()
    };
    assert_eq!(
        bad.validate().map_err(|e| e.field),
        Err("max_stages".into())
    );
    let bad = CodegenSpec {
        difficulty: vec![0.1; 3],
        ..CodegenSpec::default()
    };
    assert!(bad.validate().is_err());
    let bad = CodegenSpec {
        difficulty: vec![0.1, 0.1, 1.5, 0.1],
        ..CodegenSpec::default()
    };
    assert!(bad.validate().is_err_and(|e| e.message.contains("value 2")));
    let s: CodegenSpec = serde_json::from_str(r#"{"max_stages": 3}"#).expect("parses");
    assert_eq!((s.max_stages, s.difficulty.len()), (3, 4));
    assert!(serde_json::from_str::<CodegenSpec>(r#"{"stages": 3}"#).is_err());
    let env = CodegenSpec::default().build();
    assert_eq!(env.difficulty_space().len(), 4);
    assert_eq!(Codegen::new(0).max_stages(), 1);
}

#[test]
fn expert_trajectories_fit_the_documented_context() {
    // With the default 3 stages, 99% of the expert's trajectories (prompt, lines,
    // observations, a delimiter after each) have at most 270 characters at every eval level
    // and on the OOD split; the shipped experiments' max_seq_len is 288.
    let env = Codegen::new(CodegenSpec::default().max_stages);
    for split in [Split::Eval, Split::Ood] {
        for level in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let mut lens: Vec<usize> = (0..1000u64)
                .map(|seed| {
                    let mut ep = env.sample_episode(&[level; 4], split, seed);
                    let mut n = ep.prompt().len();
                    for line in ep.reference_lines() {
                        let r = ep.step(&line);
                        n += line.len() + 1 + r.observation.len();
                        n += usize::from(!r.observation.is_empty());
                    }
                    n
                })
                .collect();
            lens.sort_unstable();
            assert!(lens[989] <= 270, "{split:?} {level}: p99 {}", lens[989]);
        }
    }
}
