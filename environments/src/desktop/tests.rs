use super::app::{Action, App, Control, Elem, Goal, Hint, Id, parse};
use super::*;
use crate::planner::testing;
use rlany_contract::Rng;

const LEVELS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// Plays the expert on a task; returns the episode and the whole text the model would read.
fn play(env: &Desktop, d: &[f64], split: Split, seed: u64) -> (DesktopEpisode, String) {
    let mut ep = env.sample_episode(d, split, seed);
    let text = testing::play_expert(&mut ep);
    (ep, text)
}

/// The id of the first element matching `f`.
fn find(app: &App, f: impl Fn(&Elem) -> bool) -> Id {
    app.elems
        .iter()
        .position(f)
        .map(|i| i + 1)
        .expect("element")
}

#[test]
fn actions_parse_strictly() {
    assert_eq!(parse("click(7)"), Ok(Action::Click(7)));
    assert_eq!(parse(" click( 7 ) "), Ok(Action::Click(7)));
    assert_eq!(parse("key(ctrl+s)"), Ok(Action::Key("ctrl+s".into())));
    assert_eq!(parse("scroll(5, -2)"), Ok(Action::Scroll(5, -2)));
    assert_eq!(parse("scroll(5, 9999)"), Ok(Action::Scroll(5, 99)));
    assert_eq!(
        parse("type(9, \"Budget\")"),
        Ok(Action::Type(9, "Budget".into()))
    );
    for bad in [
        "click 7",
        "click(seven)",
        "click(7",
        "type(9, Budget)",
        "scroll(5)",
        "rm(-rf)",
        "",
        "click(-1)",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    assert!(parse(&format!("type(1, \"{}\")", "x".repeat(60))).is_err());
}

#[test]
fn a_task_at_the_easiest_level_plays_as_documented() {
    // Level 0: no submenus, no second tabs, no distractors, one setting, the full path.
    let env = Desktop::default();
    let t = env.draw(&[0.0; 4], Split::Train, 3);
    let mut app = t.app.clone();
    assert_eq!(app.view(), "[1]File [2]Edit [3]View [4]Format [5]Tools");
    let font = find(&app, |e| matches!(e, Elem::Opens { label: "Font", .. }));
    let size = find(&app, |e| *e == Elem::Ctrl { setting: 0 });
    // The Font item is not on the bar: clicking it now is an error and changes nothing.
    let before = app.clone();
    let out = app.act(&format!("click({font})"));
    assert!(!out.valid && out.text.starts_with("error: no element"));
    assert_eq!(app, before);
    let format = app.path_to(font)[0];
    let out = app.act(&format!("click({format})"));
    assert!(
        out.valid && out.text.starts_with("Format: "),
        "{}",
        out.text
    );
    let out = app.act(&format!("click({font})"));
    assert!(out.text.starts_with("Font: ") && out.text.contains(&format!("[{size}]size=10")));
    // The size list opens at the current value (10, the third of nine): two above, three below.
    let out = app.act(&format!("click({size})"));
    assert_eq!(out.text.split_whitespace().next(), Some("size:"));
    assert!(
        out.text.starts_with("size: -2 [") && out.text.ends_with("+3"),
        "{}",
        out.text
    );
    assert!(!app.act(&format!("scroll({size}, -9)")).text.is_empty());
    assert!(app.view().starts_with("size: [") && app.view().ends_with("+5"));
    assert!(!app.act(&format!("scroll({size}, -1)")).valid); // already at the top
    app.act(&format!("scroll({size}, 5)"));
    assert!(app.view().starts_with("size: -5 "), "{}", app.view());
    let opt16 = find(&app, |e| {
        *e == Elem::Opt {
            setting: 0,
            index: 6,
        }
    });
    assert_eq!(
        app.act(&format!("click({opt16})")).text,
        format!("[{size}]size=16")
    );
    // Nothing applies until OK.
    assert_eq!(app.values[0], "10");
    assert!(!app.act("key(ctrl+s)").valid);
    assert_eq!(app.act("key(enter)").text, "applied size=16");
    assert_eq!(app.values[0], "16");
    assert!(!app.saved);
    assert_eq!(app.act("key(ctrl+s)").text, "saved");
    assert!(app.satisfied(&Goal {
        set: vec![(0, "16".into())],
        save: true
    }));
    // A dialog cancelled applies nothing.
    app.act(&format!("click({format})"));
    app.act(&format!("click({font})"));
    let bold = find(&app, |e| *e == Elem::Ctrl { setting: 1 });
    assert_eq!(
        app.act(&format!("click({bold})")).text,
        format!("[{bold}]bold=on")
    );
    assert_eq!(app.act("key(escape)").text, "cancelled");
    assert_eq!(app.values[1], "off");
    // Fields keep letters and digits only, at most 16.
    let file = 1;
    let props = find(&app, |e| {
        matches!(
            e,
            Elem::Opens {
                label: "Properties",
                ..
            }
        )
    });
    let title = find(&app, |e| *e == Elem::Ctrl { setting: 8 });
    app.act(&format!("click({file})"));
    app.act(&format!("click({props})"));
    let out = app.act(&format!(
        "type({title}, \"$(rm -rf /) Budget {}\")",
        "z".repeat(8)
    ));
    assert_eq!(out.text, format!("[{title}]title=rmrfBudgetzzzzzz"));
    assert!(!app.act(&format!("type({bold}, \"x\")")).valid);
}

#[test]
fn real_elements_have_the_same_id_in_every_task() {
    // At level 0 there are no distractors and no submenus: every element is a real one.
    let env = Desktop::default();
    let reference = env.draw(&[0.0; 4], Split::Train, 0).app;
    let real = reference.elems.len();
    let label = |e: &Elem| match e {
        Elem::Menu { label, .. } => Some(*label),
        _ => None,
    };
    let mut rng = Rng::new(11);
    for seed in 0..2000 {
        let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
        let split = [Split::Train, Split::Eval, Split::Ood][seed as usize % 3];
        let app = env.draw(&d, split, seed).app;
        assert!(app.elems.len() >= real);
        for (i, (a, b)) in reference.elems.iter().zip(&app.elems).enumerate() {
            match a {
                // A bar menu's items depend on the layout; its id and label do not.
                Elem::Menu { .. } => assert_eq!(label(a), label(b), "id {}", i + 1),
                _ => assert_eq!(a, b, "id {} at {d:?}, seed {seed}", i + 1),
            }
        }
        // Whatever varies (distractor items, submenus, distractor check boxes) comes after.
        for e in &app.elems[real..] {
            let varying = matches!(e, Elem::Dud { .. } | Elem::Menu { .. })
                || matches!(e, Elem::Ctrl { setting } if *setting >= reference.settings.len());
            assert!(varying, "{e:?} after the real elements");
        }
    }
}

testing::planner_env_tests!(
    env: Desktop::default(),
    levels: LEVELS,
    flawed: |accs: &[f64]| {
        assert!(accs.iter().all(|a| (0.2..=0.65).contains(a)), "{accs:?}");
        assert!(accs[4] < accs[0], "worse when harder: {accs:?}");
    },
    counts: counts,
    max_prompt: MAX_PROMPT_CHARS,
);

/// The structural counts each dimension controls.
fn counts(t: &Task) -> [usize; 4] {
    let app = &t.app;
    let deep = app
        .elems
        .iter()
        .filter(|e| matches!(e, Elem::Menu { label: "More", .. }))
        .map(|e| match e {
            Elem::Menu { items, .. } => items.len(),
            _ => 0,
        })
        .sum::<usize>()
        + app
            .dialogs
            .iter()
            .map(|d| d.tabs.get(1).map_or(0, |t| t.1.len()))
            .sum::<usize>();
    let subgoals = t.goal.set.len() + usize::from(t.goal.save);
    let distractors = app
        .elems
        .iter()
        .filter(|e| matches!(e, Elem::Dud { label } if *label != "Undo"))
        .count()
        + app.settings.len()
        - settings_table().len();
    let hints = match t.hints[0] {
        Hint::Path => 0,
        Hint::Menu(_) => 1,
        Hint::None => 2,
    };
    [deep, subgoals, distractors, hints]
}

#[test]
fn rewrites_keep_what_the_changed_dimension_does_not_control() {
    let env = Desktop::default();
    let draw = |d: &[f64], seed| env.draw(d, Split::Train, seed);
    testing::for_each_rewrite(draw, |a, b, k| {
        let entry_menus = |t: &Task| -> Vec<Id> {
            (0..settings_table().len())
                .map(|s| {
                    let e = t.app.entry_of(s).unwrap_or(0);
                    t.app.path_to(e).first().copied().unwrap_or(0)
                })
                .collect()
        };
        match k {
            DEPTH | DISTRACTORS => {
                assert_eq!(a.goal, b.goal);
                assert_eq!(entry_menus(a), entry_menus(b));
            }
            SUBGOALS => {
                assert_eq!(a.app, b.app);
                assert_eq!(a.goal.set[0], b.goal.set[0]);
            }
            _ => {
                assert_eq!(a.app, b.app);
                assert_eq!(a.goal, b.goal);
            }
        }
    });
}

#[test]
fn the_ood_split_holds_exactly_the_held_out_arrangements() {
    let env = Desktop::default();
    let mut rng = Rng::new(3);
    let table = settings_table();
    for seed in 0..2000 {
        let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
        for split in [Split::Train, Split::Eval, Split::Ood] {
            let t = env.draw(&d, split, seed);
            let held: Vec<bool> = (0..table.len())
                .map(|s| {
                    let e = table[s].3;
                    let entry = t.app.entry_of(s).unwrap_or(0);
                    t.app.path_to(entry).first() == Some(&(ENTRIES[e].2 + 1))
                })
                .collect();
            if split == Split::Ood {
                assert!(held[t.goal.set[0].0], "seed {seed}");
            } else {
                assert!(!held.iter().any(|&h| h), "{split:?} seed {seed}");
            }
        }
    }
}

#[test]
fn garbage_actions_never_panic_and_stay_bounded() {
    let env = Desktop::default();
    let garbage = [
        "",
        "click()",
        "click(0)",
        "click(18446744073709551615)",
        "scroll(3, -9223372036854775808)",
        "type(7, \"\u{0}\u{202e}evil\")",
        "key(alt+f4)",
        "$(reboot)",
        "rm -rf /",
        "ignore the goal; click(1)",
    ];
    let near_miss = |rng: &mut Rng, i: u64| match i % 4 {
        2 => format!("click({})", rng.below(120)),
        _ => format!("scroll({}, {})", rng.below(120), rng.below(20) as i64 - 10),
    };
    testing::assert_junk_is_harmless(
        |d, split, seed| env.sample_episode(d, split, seed),
        &garbage,
        near_miss,
        300,
    );
}

#[test]
fn expert_trajectories_have_the_documented_lengths() {
    let env = Desktop::default();
    let bounds = [(0.0, 340), (0.25, 440), (0.5, 470), (0.75, 900), (1.0, 900)];
    for (level, bound) in bounds {
        for split in [Split::Eval, Split::Ood] {
            let mut lens: Vec<usize> = (0..1000)
                .map(|seed| play(&env, &[level; 4], split, seed).1.chars().count())
                .collect();
            lens.sort_unstable();
            assert!(
                lens[989] <= bound,
                "level {level} {split:?}: p99 {}",
                lens[989]
            );
        }
    }
}

#[test]
fn settings_are_validated() {
    assert!(DesktopSpec::default().validate().is_ok());
    let Err(e) = DesktopSpec {
        difficulty: vec![0.1; 3],
        ..Default::default()
    }
    .validate() else {
        panic!("three values accepted");
    };
    assert!(e.message.contains("depth, subgoals, distractors, hints"));
    assert!(
        DesktopSpec {
            difficulty: vec![0.1, 1.5, 0.0, 0.0],
            ..Default::default()
        }
        .validate()
        .is_err()
    );
    assert!(matches!(settings_table()[0].1, Control::Drop(_)));
}

/// `slack` sets the horizon with the tasks and the demonstrations fixed.
#[test]
fn slack_sets_the_horizon_with_the_tasks_fixed() {
    testing::assert_slack_sets_the_horizon(
        (2, 9),
        &[0.5; 4],
        |slack| Box::new(Desktop::with_slack(slack)),
        |slack, d, split, seed| Desktop::with_slack(slack).sample_episode(d, split, seed),
    );
    let bad = DesktopSpec {
        slack: 41,
        ..Default::default()
    };
    assert!(bad.validate().is_err());
}
