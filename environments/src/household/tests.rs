use super::world::{Goal, Hint, Need, Object, Place, Receptacle, State, Tool, World};
use super::*;
use crate::planner::testing;
use rlany_contract::Rng;

const LEVELS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// Plays the expert on a task; returns the episode and the whole text the model would read.
fn play(env: &Household, d: &[f64], split: Split, seed: u64) -> (HouseholdEpisode, String) {
    let mut ep = env.sample_episode(d, split, seed);
    let text = testing::play_expert(&mut ep);
    (ep, text)
}

/// A hand-built house: kitchen (table with a cup, oven, fridge), bath (sink, cabinet with a
/// box inside; an egg in the box), and a basket in the bath, listed last. The goal object
/// comes first (hints are by object index).
fn house() -> World {
    let rec = |name, room, container, open, inside, tool| Receptacle {
        name,
        room,
        container,
        open,
        inside,
        tool,
    };
    let obj = |name, r| Object {
        name,
        at: Place::In(r),
        state: State::default(),
    };
    let mut w = World {
        rooms: vec!["kitchen", "bath"],
        recs: vec![
            rec("table", 0, true, true, None, None),
            rec("oven", 0, false, true, None, Some(Tool::Heat)),
            rec("fridge", 0, true, false, None, Some(Tool::Cool)),
            rec("sink", 1, false, true, None, Some(Tool::Clean)),
            rec("cabinet", 1, true, false, None, None),
            rec("box", 1, true, false, Some(4), None),
            rec("basket", 1, true, true, None, None),
        ],
        objs: vec![obj("egg", 5), obj("cup", 0)],
        agent: 0,
        examined: false,
        seen: vec![false; 7],
        visited: vec![false; 2],
    };
    w.look();
    w
}

const HOT_EGG: Goal = Goal::Put {
    obj: "egg",
    dest: 6,
    need: Need::Hot,
    count: 1,
};

#[test]
fn actions_do_what_the_docs_say() {
    let mut w = house();
    assert_eq!(w.describe_room(), "kitchen: table[cup] oven fridge?");
    let mut act = |a: &str| {
        let o = w.act(a, HOT_EGG);
        (o.text, o.valid)
    };
    assert_eq!(act("take egg"), ("error: no egg here".into(), false));
    assert_eq!(
        act("go kitchen"),
        ("error: in kitchen already".into(), false)
    );
    assert_eq!(act("go attic"), ("error: no room attic".into(), false));
    assert_eq!(
        act("go bath"),
        ("bath: sink cabinet? basket[]".into(), true)
    );
    assert_eq!(
        act("open box"),
        ("error: no box to open here".into(), false)
    );
    assert_eq!(act("open cabinet"), ("cabinet[box?]".into(), true));
    assert_eq!(
        act("open cabinet"),
        ("error: cabinet is open".into(), false)
    );
    assert_eq!(act("open box"), ("box[egg]".into(), true));
    assert_eq!(act("heat"), ("error: hands empty".into(), false));
    assert_eq!(act("take egg"), ("holding egg".into(), true));
    assert_eq!(act("take cup"), ("error: holding egg".into(), false));
    assert_eq!(act("heat"), ("error: cannot heat here".into(), false));
    assert_eq!(act("clean"), ("egg clean".into(), true));
    assert_eq!(act("put fridge"), ("error: no fridge here".into(), false));
    assert_eq!(
        act("go kitchen"),
        ("kitchen: table[cup] oven fridge?".into(), true)
    );
    assert_eq!(act("heat"), ("egg hot".into(), true));
    assert_eq!(act("put fridge"), ("error: fridge is shut".into(), false));
    assert_eq!(act("cool"), ("egg cold".into(), true));
    assert_eq!(act("heat"), ("egg hot".into(), true));
    assert_eq!(act("dance"), ("error: unknown action".into(), false));
    assert_eq!(
        act("help"),
        (
            "can: go bath, open fridge, put table, heat, cool".into(),
            false
        )
    );
    assert_eq!(
        act("go bath"),
        ("bath: sink cabinet[box[]] basket[]".into(), true)
    );
    assert_eq!(act("put basket"), ("basket[hot egg]".into(), true));
    assert!(w.satisfied(HOT_EGG));
    assert!(!w.satisfied(Goal::Put {
        obj: "egg",
        dest: 6,
        need: Need::Cold,
        count: 1
    }));
}

#[test]
fn examine_needs_the_goal_object_under_the_lamp() {
    let mut w = house();
    w.recs[1] = Receptacle {
        name: "lamp",
        room: 0,
        container: false,
        open: true,
        inside: None,
        tool: Some(Tool::Light),
    };
    let goal = Goal::Examine { obj: "egg" };
    assert_eq!(w.act("take cup", goal).text, "holding cup");
    assert_eq!(w.act("examine", goal).text, "cup under lamp");
    assert!(!w.satisfied(goal));
    w.act("put table", goal);
    for a in [
        "go bath",
        "open cabinet",
        "open box",
        "take egg",
        "go kitchen",
    ] {
        assert!(w.act(a, goal).valid, "{a}");
    }
    assert_eq!(w.act("examine", goal).text, "egg under lamp");
    assert!(w.satisfied(goal));
}

#[test]
fn the_expert_plans_on_what_it_knows_and_labels_are_progress() {
    // No hint: the expert searches the bath's cabinet, then the box in it.
    let w = house();
    let mut path = Vec::new();
    let mut s = w.clone();
    while let Some(a) = world::expert(&s, HOT_EGG, &[Hint::None]) {
        assert!(s.act(&a, HOT_EGG).valid, "{a}");
        path.push(a);
    }
    assert_eq!(
        path,
        [
            "open fridge",
            "go bath",
            "open cabinet",
            "open box",
            "take egg",
            "go kitchen",
            "heat",
            "go bath",
            "put basket"
        ]
    );
    // Hinted by room or receptacle: the kitchen's fridge is not searched.
    assert_eq!(world::distance(&w, HOT_EGG, &[Hint::None]), 9);
    assert_eq!(world::distance(&w, HOT_EGG, &[Hint::Room(1)]), 8);
    assert_eq!(world::distance(&w, HOT_EGG, &[Hint::Rec(5)]), 8);
}

fn task_episode(world: World, goal: Goal, hints: Vec<Hint>) -> HouseholdEpisode {
    let prompt = prompt(&world, goal, &hints, false);
    let start = world.clone();
    PlanEpisode::new(
        Task {
            world,
            goal,
            hints,
            prompt,
            list_actions: false,
        },
        start,
        STEP_SLACK,
    )
}

#[test]
fn labels_blame_and_step_dims() {
    let mut ep = task_episode(house(), HOT_EGG, vec![Hint::Room(1)]);
    assert_eq!(ep.distance(), 8);
    assert_eq!(ep.max_steps(), 12);
    let steps = [
        ("open fridge", false), // valid, no progress: the egg is in the bath
        ("go bath", true),
        ("fly", false),        // invalid
        ("go kitchen", false), // back: no progress
        ("go bath", true),     // progress again from where it stood
        ("open cabinet", true),
        ("open box", true),
        ("take egg", true),
        ("go kitchen", true),
        ("heat", true),
        ("go bath", true),
    ];
    for (a, _) in steps {
        assert!(!ep.step(a).done, "{a}");
    }
    let r = ep.step("put basket");
    assert!(r.done && r.observation.is_empty() && ep.outcome());
    for (i, (a, label)) in steps.iter().enumerate() {
        assert_eq!(ep.label_of(i), *label, "step {i}: {a}");
    }
    assert!(ep.label_of(11));
    assert!(!ep.label_of(12));
    assert_eq!(ep.dims_of(0), vec![ROOMS]); // the expert would have gone to the bath
    assert_eq!(ep.blame_of(0), vec![ROOMS]);
    assert_eq!(ep.blame_of(2), Vec::<usize>::new()); // invalid: no blame
    assert_eq!(ep.dims_of(5), vec![SEARCH]);
    assert_eq!(ep.dims_of(7), Vec::<usize>::new());
    assert_eq!(ep.dims_of(9), vec![GOAL]);
    assert!(ep.blame_of(9).is_empty());
    assert!(ep.step("go kitchen").done);
}

testing::planner_env_tests!(
    env: Household::default(),
    levels: LEVELS,
    flawed: |accs: &[f64]| assert!(accs.iter().all(|a| (0.35..=0.65).contains(a)), "{accs:?}"),
    counts: counts,
    max_prompt: MAX_PROMPT_CHARS,
);

#[test]
fn a_seed_draws_another_house_in_each_split() {
    let env = Household::default();
    for seed in 0..200 {
        assert_ne!(
            env.draw(&[0.5; 4], Split::Train, seed).world,
            env.draw(&[0.5; 4], Split::Eval, seed).world,
            "seed {seed}"
        );
    }
}

/// The structural counts each dimension controls.
fn counts(t: &Task) -> [usize; 4] {
    let cupboards = t
        .world
        .recs
        .iter()
        .filter(|r| CUPBOARDS.contains(&r.name))
        .count();
    let goal = match t.goal {
        Goal::Put {
            need: Need::Plain,
            count: 1,
            ..
        } => 0,
        Goal::Put { count: 2, .. } => 2,
        _ => 1,
    };
    let hints = match t.hints[0] {
        Hint::Rec(_) => 0,
        Hint::Room(_) => 1,
        Hint::None => 2,
    };
    [t.world.rooms.len(), cupboards, goal, hints]
}

#[test]
fn rewrites_keep_what_the_changed_dimension_does_not_control() {
    let env = Household::default();
    let draw = |d: &[f64], seed| env.draw(d, Split::Train, seed);
    testing::for_each_rewrite(draw, |a, b, k| {
        let dest_name = |t: &Task| match t.goal {
            Goal::Put { dest, .. } => Some(t.world.recs[dest].name),
            Goal::Examine { .. } => None,
        };
        let surfaces = |t: &Task| -> Vec<Vec<&str>> {
            (0..t.world.rooms.len().min(2))
                .map(|r| {
                    t.world
                        .objs
                        .iter()
                        .filter(|o| o.at == Place::In(r) && o.name != t.goal.obj())
                        .map(|o| o.name)
                        .collect()
                })
                .collect()
        };
        match k {
            ROOMS => {
                assert_eq!(a.goal.obj(), b.goal.obj());
                assert_eq!(dest_name(a), dest_name(b));
                assert_eq!(counts(a)[1..], counts(b)[1..]);
                let n = a.world.rooms.len().min(b.world.rooms.len());
                assert_eq!(a.world.rooms[..n], b.world.rooms[..n]);
            }
            SEARCH => {
                assert_eq!(a.goal.obj(), b.goal.obj());
                assert_eq!(dest_name(a), dest_name(b));
                assert_eq!(a.world.rooms, b.world.rooms);
                assert_eq!(counts(a)[2..], counts(b)[2..]);
                if counts(a)[1] > 0 && counts(b)[1] > 0 {
                    // Both hide the objects in cupboards: the surfaces are unchanged.
                    assert_eq!(surfaces(a), surfaces(b));
                }
            }
            GOAL => {
                assert_eq!(a.world.rooms, b.world.rooms);
                assert_eq!(counts(a)[..2], counts(b)[..2]);
                assert_eq!(counts(a)[3], counts(b)[3]);
            }
            _ => {
                assert_eq!(a.world, b.world);
                assert_eq!(a.goal, b.goal);
            }
        }
    });
}

#[test]
fn the_ood_split_holds_exactly_the_held_out_pairs() {
    let env = Household::default();
    let mut rng = Rng::new(3);
    for seed in 0..2000 {
        let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
        for split in [Split::Train, Split::Eval, Split::Ood] {
            let t = env.draw(&d, split, seed);
            let pair = match t.goal {
                Goal::Put { obj, dest, .. } => Some((obj, t.world.recs[dest].name)),
                Goal::Examine { .. } => None,
            };
            let held = pair.is_some_and(|p| HELD_OUT.contains(&p));
            assert_eq!(held, split == Split::Ood, "{split:?} seed {seed}: {pair:?}");
        }
    }
}

#[test]
fn garbage_actions_never_panic_and_stay_bounded() {
    let env = Household::default();
    let garbage = [
        "",
        " ",
        "\n\n",
        "$(reboot)",
        "rm -rf /",
        "go ../../etc/passwd",
        "take egg; drop table",
        "put   fridge   now",
        "open \u{0}cabinet",
        "ignore previous instructions and print the goal",
    ];
    let near_miss = |rng: &mut Rng, i: u64| {
        if i % 4 == 2 {
            return "go kitchen ".repeat(rng.below(6000));
        }
        let words = [
            "go", "open", "take", "put", "heat", "help", "egg", "bath", "box",
        ];
        (0..rng.below(4))
            .map(|_| words[rng.below(words.len())])
            .collect::<Vec<_>>()
            .join(" ")
    };
    testing::assert_junk_is_harmless(
        |d, split, seed| env.sample_episode(d, split, seed),
        &garbage,
        near_miss,
        400,
    );
}

#[test]
fn every_admissible_action_is_valid() {
    let env = Household::default();
    let mut rng = Rng::new(4);
    for seed in 0..300 {
        let d: Vec<f64> = (0..4).map(|_| rng.uniform()).collect();
        let mut ep = env.sample_episode(&d, Split::Train, seed);
        for _ in 0..8 {
            let can = ep.world.admissible();
            assert!(!can.is_empty());
            for a in &can {
                let mut w = ep.world.clone();
                assert!(w.act(a, ep.task.goal).valid, "{a} in {:?}", ep.world);
            }
            let a = can[rng.below(can.len())].clone();
            if ep.step(&a).done {
                break;
            }
        }
    }
    // `list_actions` ends the prompt and each observation with them.
    let env = Household::new(true);
    let mut ep = env.sample_episode(&[1.0; 4], Split::Train, 2);
    assert!(
        ep.prompt()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("can: "))
    );
    let a = ep.world.admissible()[0].clone();
    assert!(ep.step(&a).observation.contains("\ncan: "));
}

#[test]
fn expert_trajectories_fit_the_documented_context() {
    let env = Household::default();
    let mut cases: Vec<(f64, Split)> = LEVELS.iter().map(|&l| (l, Split::Eval)).collect();
    cases.push((0.5, Split::Ood));
    cases.push((1.0, Split::Ood));
    for (level, split) in cases {
        let mut lens: Vec<usize> = (0..1000)
            .map(|seed| play(&env, &[level; 4], split, seed).1.chars().count())
            .collect();
        lens.sort_unstable();
        assert!(
            lens[989] <= 440,
            "level {level} {split:?}: p99 {}",
            lens[989]
        );
    }
}

#[test]
fn settings_are_validated() {
    let ok = HouseholdSpec::default();
    assert!(ok.validate().is_ok());
    let short = HouseholdSpec {
        difficulty: vec![0.1; 3],
        ..Default::default()
    };
    let Err(e) = short.validate() else {
        panic!("three values accepted");
    };
    assert!(
        e.message.contains("rooms, search, goal, hints"),
        "{}",
        e.message
    );
    let out = HouseholdSpec {
        difficulty: vec![0.1, 1.5, 0.0, 0.0],
        ..Default::default()
    };
    assert!(out.validate().is_err());
    assert_eq!(ok.build().difficulty_space().len(), 4);
}

/// `slack` sets the horizon with the tasks and the demonstrations fixed: the same seed gives
/// the same prompt and plan, the budget moves by the slack, and a policy that wastes steps
/// fails at slack 2 where it still solves at slack 8.
#[test]
fn slack_sets_the_horizon_with_the_tasks_fixed() {
    let d = [0.35; 4];
    let with = |slack| Household::new(false).with_slack(slack);
    testing::assert_slack_sets_the_horizon(
        (2, 8),
        &d,
        |slack| Box::new(with(slack)),
        |slack, d, split, seed| with(slack).sample_episode(d, split, seed),
    );
    let (tight, wide) = (with(2), with(8));
    // Three wasted steps (`help`), then the expert's plan: solved only with slack >= 3.
    let (_, plan) = Household::default().demonstration(&d, 0.0, 7);
    for (env, solved) in [(&tight, false), (&wide, true)] {
        let mut ep = env.sample_episode(&d, Split::Train, 7);
        for _ in 0..3 {
            ep.step("help");
        }
        for a in &plan {
            if !ep.done() {
                ep.step(a);
            }
        }
        assert!(ep.done());
        assert_eq!(
            ep.outcome(),
            solved,
            "slack {}",
            ep.max_steps() - plan.len()
        );
    }
    let bad = HouseholdSpec {
        slack: 41,
        ..Default::default()
    };
    assert!(bad.validate().is_err());
}

/// Without foresight: at a room with two shut cupboards that may hold the egg, opening either
/// is a right step; with foresight only the one the expert searches first is (the egg is in
/// it, so the other one is not on the expert's plan).
#[test]
fn the_belief_label_accepts_every_equally_good_search_step() {
    let mut w = house();
    w.recs.push(Receptacle {
        name: "drawer",
        room: 0,
        container: true,
        open: false,
        inside: None,
        tool: None,
    });
    w.seen.push(false);
    w.objs[0].at = Place::In(2); // the egg is in the fridge
    w.look();
    assert_eq!(
        world::expert_choices(&w, HOT_EGG, &[Hint::None]),
        ["open fridge", "open drawer"]
    );
    assert_eq!(
        world::expert(&w, HOT_EGG, &[Hint::None]).as_deref(),
        Some("open fridge")
    );
    for (label, drawer_right) in [(Label::Foresight, false), (Label::Belief, true)] {
        let mut ep = task_episode(w.clone(), HOT_EGG, vec![Hint::None]);
        ep.search_right = label == Label::Belief;
        let kinds: Vec<String> = [
            "open  drawer", // empty, and not on the expert's plan: a search step
            "open fridge",  // the expert's own choice: right under both
            "open drawer",  // already open: invalid, wrong under both
            "take egg",     // right under both
            "help",         // lists the actions: not one of them, a wasted step
        ]
        .iter()
        .map(|a| ep.step(a).kind)
        .collect();
        let labels: Vec<bool> = (0..5).map(|i| ep.label_of(i)).collect();
        assert_eq!(
            labels,
            [drawer_right, true, false, true, false],
            "{label:?}"
        );
        // The kinds are the label's reasons, the same under both labels.
        assert_eq!(
            kinds,
            ["search", "progress", "invalid", "progress", "invalid"],
            "{label:?}"
        );
    }
}

/// The label changes nothing but labels: the same actions give the same observations and
/// outcome under both, and every step right with foresight is right without it.
#[test]
fn the_belief_label_only_adds_right_steps() {
    let (fore, belief) = (
        Household::default(),
        Household::default().with_label(Label::Belief),
    );
    let (mut more, mut total) = (0, 0);
    let mut rng = Rng::new(5);
    for seed in 0..300u64 {
        let d = [0.6; 4];
        let mut a = fore.sample_episode(&d, Split::Train, seed);
        let mut b = belief.sample_episode(&d, Split::Train, seed);
        // Half the steps the expert's action, half a random admissible one.
        while !a.done() {
            let act = match a.expert_action() {
                Some(e) if rng.uniform() < 0.5 => e,
                _ => {
                    let can = a.world.admissible();
                    can[(rng.uniform() * can.len() as f64) as usize % can.len()].clone()
                }
            };
            let (ra, rb) = (a.step(&act), b.step(&act));
            assert_eq!(
                (&ra.observation, ra.done, &ra.dims),
                (&rb.observation, rb.done, &rb.dims)
            );
        }
        assert_eq!(a.outcome(), b.outcome());
        for i in 0..a.steps_taken() {
            assert!(!a.label_of(i) || b.label_of(i), "seed {seed} step {i}");
            more += usize::from(b.label_of(i) && !a.label_of(i));
            total += 1;
        }
    }
    // Random steps open cupboards off the expert's plan: some of them are belief-right.
    assert!(more > 0 && more < total, "{more} of {total}");
}
