//! `household`: a text household game like AlfWorld, small enough to train on a CPU.
//!
//! A house has rooms (every room has a door to every other); each room has receptacles:
//! an open surface (`table`, `shelf`, `desk`), shut cupboards (`drawer`, `cabinet`, and a
//! `box` that stands *inside* the cabinet), devices (`sink` cleans, `oven` heats, `fridge`
//! cools and is a shut cupboard too, `lamp` lights) and the goal's destination (`fridge`,
//! `counter` or `basket`). Objects (`egg`, `mug`, `cup`, `apple`, `plate`, `book`, `key`, `soap`)
//! lie in receptacles. The agent is in one room, holds at most one object, and sees the
//! contents of a cupboard only once it is open. The world model, the actions and the expert
//! planner are in [`world`].
//!
//! # What the agent sees
//!
//! ```text
//! put hot egg in fridge              ← the goal
//! egg: bath cabinet                  ← the hint (how much it says is a difficulty dimension)
//! rooms: kitchen bath                ← the rooms (when there are more than one)
//! kitchen: table[cup] oven fridge?   ← the room the agent starts in
//! go bath                            (the expert's actions; after each, the observation:)
//! bath: shelf[] cabinet?             ← `name[contents]` open, `name?` shut, `name` a device
//! open cabinet
//! cabinet[egg]
//! take egg
//! holding egg
//! go kitchen
//! kitchen: table[cup] oven fridge?
//! heat
//! egg hot
//! open fridge
//! fridge[]
//! put fridge                         ← the episode ends when the goal holds
//! ```
//!
//! Actions: `go ROOM`, `open RECEPTACLE`, `take OBJECT` (the first one visible in the room, in
//! listing order; the destination is listed last in its room), `put RECEPTACLE` (what the
//! agent holds), `clean`, `heat`, `cool`, `examine` (the held object, with that device in the
//! room) and `help` (the admissible actions; a wasted step). Anything else, or an action that
//! is impossible now, is a wasted step whose observation is `error: <why>`; the world does not
//! change. Any text is accepted: actions are parsed against the house's own names, never
//! executed, and texts over [`world::MAX_ACTION_CHARS`] characters are rejected unread.
//! With `list_actions: true` every observation (and the prompt) ends with a line
//! `can: go bath, open cabinet, …` — AlfWorld's admissible-action list, for models with a
//! long context; it is off by default because a character-level model pays for every
//! character.
//!
//! # Goals (AlfWorld's six types)
//!
//! | text                        | done when                                           |
//! |-----------------------------|-----------------------------------------------------|
//! | `put egg in basket`         | an egg is in the basket                             |
//! | `put clean egg in basket`   | an egg cleaned at the sink is in it                 |
//! | `put hot egg in basket`     | an egg heated in the oven (and not cooled since)    |
//! | `put cold egg in basket`    | an egg cooled at the fridge (and not heated since)  |
//! | `look at book under lamp`   | `examine` while holding a book in the lamp's room   |
//! | `put two eggs in basket`    | two eggs are in it                                  |
//!
//! # Difficulty space (4 dims, each clamped to `[0, 1]`, NaN → 0, missing → 0)
//!
//! Counts are rounded stochastically from their own stream (`⌊y⌋ + [u < frac(y)]`, mean
//! linear in `d`, monotone in `d` for a fixed `u`).
//!
//! | index | name     | meaning                                                          | lo | hi |
//! |-------|----------|------------------------------------------------------------------|----|----|
//! | 0     | `rooms`  | rooms `1 + sround(2·d0)`                                          | 1  | 3  |
//! | 1     | `search` | shut cupboards `sround(3·d1)` (drawer, cabinet, box in the cabinet); with none the goal objects lie on open surfaces, else each is in a cupboard | 0 | 3 |
//! | 2     | `goal`   | composition `sround(2·d2)`: 0 put; 1 clean/heat/cool-then-put or examine; 2 put two | 0 | 2 |
//! | 3     | `hints`  | `sround(2·d3)`: 0 the goal objects' room and receptacle; 1 their room; 2 nothing | 0 | 2 |
//!
//! More rooms are more to walk and more to search; more cupboards are more to open (and the
//! box is a cupboard in a cupboard); a composed goal has a sub-goal (a device, a second object)
//! to remember; fewer hints turn walking to a known place into a search.
//!
//! # Rewrites (same seed, another difficulty)
//!
//! Every part is drawn from its own stream (`Rng::derive(seed, "household/<part>")`) with a
//! fixed number of draws whatever `d` is: the room names (`rooms`, a permutation), the room
//! of every receptacle (`place`, one uniform per receptacle kind), the goal (`goal`: type,
//! object, destination), where each goal instance lies (`source`, two uniforms per instance),
//! the fillers (`fillers`, two uniforms per receptacle kind) and each count's rounding. So a
//! change of `rooms` keeps the goal and the hints' level and moves receptacles only by the
//! room count; `search` keeps the goal, the rooms and the fillers of the surfaces; `goal`
//! keeps the house; `hints` changes only the hint line.
//!
//! # Splits
//!
//! `Train` draws from the seed, `Eval` from `Rng::derive(seed, "household/split/eval")` (same
//! distribution, a disjoint seed space). Three (object, destination) pairs are held out of
//! Train and Eval: egg → basket, mug → fridge, apple → counter; every one of those objects
//! and destinations is trained in other pairs. `Ood` (`Rng::derive(seed,
//! "household/split/ood")`) draws its goal's object and destination from the held-out pairs
//! (an `examine` goal becomes a clean/heat/cool one), the rest as in training — as AlfWorld's
//! unseen split holds out combinations. The in-domain evaluation grid is the default
//! `[0, 0.25, 0.5, 0.75, 1]`.
//!
//! # Outcome, oracle labels, step dims, blame
//!
//! The episode ends when the goal holds (outcome true) or after `max_steps`
//! steps (the expert's plan length + `slack`, 4 by default: the horizon, set with the tasks
//! fixed; the warm start's demonstrations are cut at plan + 4 whatever `slack` is). The oracle label of a step is *progress by the
//! expert's distance*: the action was valid and the number of actions the expert planner
//! ([`world::expert`]) needs from the new state is smaller than from the old. The planner acts
//! on what the agent has seen (and the hints), so opening the cupboard the expert would open
//! first is progress even when it is empty, while opening another empty one is not — the
//! label's *foresight* (the default, `label: Foresight`). With `label: Belief` a step is also
//! right when it is one of the expert's equally good search choices given what the agent has
//! seen ([`world::expert_choices`]: any unseen cupboard of a room that may hold the object,
//! any unexplored room that may); the label changes nothing else.
//!
//! Step `i`'s `dims` is structural: what the expert's action at that state exercises — `go` →
//! `rooms`, `open` → `search`, a device or the second object's `take`/`put` → `goal`;
//! `hints` is never listed (it changes the evidence, not the action). Step `i`'s `blame` is
//! step `i`'s `dims` for a valid action that made no progress, and nothing for an invalid one.
//!
//! # Flawed expert ([`Environment::demonstration`])
//!
//! `demonstration(d, noise, seed)` plays the expert on `sample(d, Train, seed)` with two
//! documented failure modes drawn from the `slip` stream: with probability `noise` it
//! *forgets a sub-goal* for the whole episode (skips the device, brings one object of two,
//! puts the object on the destination room's surface instead of the destination, or leaves
//! the book by the lamp without examining it) and stops when it believes it is done; and
//! before each action, with probability `noise / 4`, it *wanders* (goes to a random other
//! room, or opens a random shut cupboard of the room), then resumes its plan. Its
//! trajectory is cut at the step limit.
//!
//! # Length bounds
//!
//! A prompt (without `list_actions`) has at most [`MAX_PROMPT_CHARS`] characters: a goal, a
//! hint, the room names and one room. Observations are one room or one receptacle (at most
//! a few names). With the defaults,
//! 99% of the expert's trajectories (prompt, actions, observations, one delimiter after
//! each) have at most 320 characters at every level of the eval grid and on the OOD split (a
//! test checks it), so a character-level model with `max_seq_len` 352 holds them.

pub mod world;

use crate::draw;
/// Steps beyond the expert's plan before an episode ends, by default (`slack`).
pub use crate::planner::STEP_SLACK;
use crate::planner::{self, Plan, PlanEpisode, check_settings, is_default_slack};
use rlany_contract::check::Checked;
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Rng, Split};
use serde::{Deserialize, Serialize};
use world::{Goal, Hint, Need, Object, Place, Receptacle, State, Tool, World};

/// Index of the `rooms` dimension.
pub const ROOMS: usize = 0;
/// Index of the `search` dimension.
pub const SEARCH: usize = 1;
/// Index of the `goal` dimension.
pub const GOAL: usize = 2;
/// Index of the `hints` dimension.
pub const HINTS: usize = 3;
/// Rooms at `rooms = 1`.
const MAX_ROOMS: usize = 3;
/// Shut cupboards at `search = 1`.
const MAX_SHUT: usize = 2;
/// The probability that a surface or cupboard holds a filler object.
const FILLER_RATE: f64 = 1.0 / 3.0;
/// The longest prompt (without `list_actions`), in characters (a test samples many).
pub const MAX_PROMPT_CHARS: usize = 160;

const ROOM_NAMES: [&str; 5] = ["kitchen", "hall", "bath", "study", "garage"];
const SURFACES: [&str; MAX_ROOMS] = ["table", "shelf", "desk"];
const CUPBOARDS: [&str; MAX_SHUT] = ["cabinet", "box"];
const PUT_OBJECTS: [&str; 5] = ["egg", "mug", "cup", "apple", "plate"];
const LOOK_OBJECTS: [&str; 2] = ["book", "key"];
const FILLERS: [&str; 8] = ["egg", "mug", "cup", "apple", "plate", "book", "key", "soap"];
const DESTINATIONS: [&str; 3] = ["fridge", "counter", "basket"];
/// The (object, destination) pairs of the OOD split, never in Train or Eval.
const HELD_OUT: [(&str, &str); 3] = [("egg", "basket"), ("mug", "fridge"), ("apple", "counter")];

/// The `household` settings of an experiment file:
/// `environment: Household(difficulty: [0.2, 0.2, 0.2, 0.2])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HouseholdSpec {
    /// Starting difficulty of every task slot, one value in `[0, 1]` per dimension
    /// (`rooms`, `search`, `goal`, `hints`).
    pub difficulty: Vec<f64>,
    /// End the prompt and every observation with the admissible actions (`can: …`).
    pub list_actions: bool,
    /// The step budget beyond the expert's plan: an episode ends after `plan + slack`
    /// steps (the horizon, with the tasks fixed). The expert's demonstrations are written for
    /// `plan + 4` whatever this is (the warm start replays them through an episode, so a
    /// `slack` below 4 cuts its longest ones). Left out of a written file at its default, so the
    /// warm-start cache keys of files that do not set it are the ones made before it.
    #[serde(skip_serializing_if = "is_default_slack")]
    pub slack: usize,
    /// What the oracle calls a right step (`Foresight`: the expert's distance in the true
    /// world shrank; `Belief`: that, or a search step the expert could have taken given what
    /// the agent has seen). Changes labels only (metrics, the synthetic judge, a learned
    /// judge's warm start), never the tasks, the outcome or the demonstrations.
    #[serde(skip_serializing_if = "Label::is_default")]
    pub label: Label,
}

/// Which oracle labels a household step (the module docs, "Outcome, oracle labels").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Label {
    /// Right iff the step shortened the expert's remaining plan in the true world: opening
    /// the cupboard the expert searches first is right even when it is empty, opening
    /// another cupboard that may equally hold the object and is empty is wrong.
    #[default]
    Foresight,
    /// Right iff `Foresight` says so or the step is one of the expert's equally good search
    /// choices given what the agent has seen ([`world::expert_choices`]): no foresight of
    /// what the shut cupboards hold.
    Belief,
}

impl Label {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for HouseholdSpec {
    fn default() -> Self {
        Self {
            difficulty: vec![0.2; 4],
            list_actions: false,
            slack: STEP_SLACK,
            label: Label::Foresight,
        }
    }
}

impl EnvironmentPlugin for HouseholdSpec {
    fn validate(&self) -> Checked {
        check_settings(
            self.slack,
            &self.difficulty,
            &["rooms", "search", "goal", "hints"],
        )
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn label_only_fields(&self) -> &'static [&'static str] {
        &["label"]
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(
            Household::new(self.list_actions)
                .with_slack(self.slack)
                .with_label(self.label),
        )
    }
}

/// One drawn task: the starting world, the goal and the hints.
#[derive(Debug, Clone, PartialEq)]
struct Task {
    world: World,
    goal: Goal,
    hints: Vec<Hint>,
    prompt: String,
    /// Every observation ends with the admissible actions (the environment's setting).
    list_actions: bool,
}

/// The `household` environment (see the module docs).
#[derive(Debug, Clone)]
pub struct Household {
    list_actions: bool,
    slack: usize,
    label: Label,
}

impl Default for Household {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Household {
    /// A new environment; `list_actions` adds the admissible actions to every observation.
    /// Episodes end `STEP_SLACK` steps after the expert's plan ([`Self::with_slack`]).
    pub fn new(list_actions: bool) -> Self {
        Self {
            list_actions,
            slack: STEP_SLACK,
            label: Label::Foresight,
        }
    }

    /// The same environment with the oracle `label`.
    pub fn with_label(mut self, label: Label) -> Self {
        self.label = label;
        self
    }

    /// The same environment with episodes ending `slack` steps after the expert's plan.
    pub fn with_slack(mut self, slack: usize) -> Self {
        self.slack = slack;
        self
    }

    /// Like [`Environment::sample`], but returns the concrete episode type.
    fn sample_episode(&self, d: &[f64], split: Split, seed: u64) -> HouseholdEpisode {
        let task = self.draw(d, split, seed);
        let world = task.world.clone();
        let mut ep = PlanEpisode::new(task, world, self.slack);
        ep.search_right = self.label == Label::Belief;
        ep
    }

    fn draw(&self, d: &[f64], split: Split, seed: u64) -> Task {
        let coord = |i: usize| draw::coord(d, i);
        let base = match split {
            Split::Train => seed,
            Split::Eval => Rng::derive(seed, "household/split/eval").next_u64(),
            Split::Ood => Rng::derive(seed, "household/split/ood").next_u64(),
        };
        let stream = |part: &str| Rng::derive(base, &format!("household/{part}"));
        let sround = |y: f64, part: &str| draw::stochastic_round(y, stream(part).uniform());
        let n_rooms = 1 + sround(coord(ROOMS) * (MAX_ROOMS - 1) as f64, "rooms/round");
        let n_shut = sround(coord(SEARCH) * MAX_SHUT as f64, "search/round");
        let level = sround(coord(GOAL) * 2.0, "goal/round");
        let hint_level = sround(coord(HINTS) * 2.0, "hints/round");

        // Rooms: the first `n_rooms` of a permutation of the names.
        let mut names = ROOM_NAMES.to_vec();
        stream("rooms").shuffle(&mut names);
        names.truncate(n_rooms);

        // The goal: type, object, destination.
        let mut g = stream("goal");
        let (u_type, u_obj, u_dest) = (g.uniform(), g.uniform(), g.uniform());
        let kind = match level {
            0 => Kind::Put(Need::Plain, 1),
            1 => {
                let kinds = [Need::Clean, Need::Hot, Need::Cold];
                if split == Split::Ood || draw::index(u_type, 4) < 3 {
                    let n = if split == Split::Ood { 3 } else { 4 };
                    Kind::Put(kinds[draw::index(u_type, n).min(2)], 1)
                } else {
                    Kind::Look
                }
            }
            _ => Kind::Put(Need::Plain, 2),
        };
        let (obj, dest_name) = match (kind, split) {
            (Kind::Look, _) => (LOOK_OBJECTS[draw::index(u_obj, LOOK_OBJECTS.len())], None),
            (_, Split::Ood) => {
                let (o, dn) = HELD_OUT[draw::index(u_obj, HELD_OUT.len())];
                (o, Some(dn))
            }
            _ => {
                let o = PUT_OBJECTS[draw::index(u_obj, PUT_OBJECTS.len())];
                let allowed: Vec<&str> = DESTINATIONS
                    .iter()
                    .copied()
                    .filter(|dn| !HELD_OUT.contains(&(o, *dn)))
                    .collect();
                (o, Some(allowed[draw::index(u_dest, allowed.len())]))
            }
        };

        // Receptacles, in listing order: surfaces, devices, cupboards, the destination last.
        let mut place = stream("place");
        let mut room_of = |n: usize| draw::index(place.uniform(), n);
        let mut recs: Vec<Receptacle> = Vec::new();
        let rec = |name, room, container, open, tool| Receptacle {
            name,
            room,
            container,
            open,
            inside: None,
            tool,
        };
        for (r, name) in SURFACES.iter().enumerate().take(n_rooms) {
            recs.push(rec(*name, r, true, true, None));
        }
        // One uniform per receptacle kind, drawn whether or not it is present.
        let device_rooms: Vec<usize> = (0..4).map(|_| room_of(n_rooms)).collect();
        let cupboard_rooms: Vec<usize> = (0..MAX_SHUT).map(|_| room_of(n_rooms)).collect();
        let dest_room = room_of(n_rooms);
        let tool = match kind {
            Kind::Put(need, _) => need.tool(),
            Kind::Look => Some(Tool::Light),
        };
        let fridge_needed = tool == Some(Tool::Cool) || dest_name == Some("fridge");
        match tool {
            Some(Tool::Clean) => recs.push(rec("sink", device_rooms[0], false, true, tool)),
            Some(Tool::Heat) => recs.push(rec("oven", device_rooms[1], false, true, tool)),
            Some(Tool::Light) => recs.push(rec("lamp", device_rooms[2], false, true, tool)),
            _ => {}
        }
        let first_cupboard = recs.len();
        for (i, name) in CUPBOARDS.iter().enumerate().take(n_shut) {
            let mut c = rec(*name, cupboard_rooms[i], true, false, None);
            if i == 1 {
                // The box stands in the cabinet.
                c.room = recs[first_cupboard].room;
                c.inside = Some(first_cupboard);
            }
            recs.push(c);
        }
        if let Some(dn) = dest_name {
            let room = if dn == "fridge" {
                device_rooms[3]
            } else {
                dest_room
            };
            let fridge = dn == "fridge";
            recs.push(rec(dn, room, true, !fridge, fridge.then_some(Tool::Cool)));
        }
        if fridge_needed && dest_name != Some("fridge") {
            // The fridge as a device only (to cool), listed before the destination.
            let at = recs.len() - usize::from(dest_name.is_some());
            recs.insert(
                at,
                rec("fridge", device_rooms[3], true, false, Some(Tool::Cool)),
            );
        }
        let dest = recs.iter().position(|r| Some(r.name) == dest_name);

        // The goal objects: on a surface when there is no cupboard, else in a cupboard.
        let count = match kind {
            Kind::Put(_, c) => c,
            Kind::Look => 1,
        };
        let mut source = stream("source");
        let mut objs = Vec::new();
        let (u_room, u_shut) = (source.uniform(), source.uniform());
        let at = if n_shut == 0 {
            draw::index(u_room, n_rooms)
        } else {
            first_cupboard + draw::index(u_shut, n_shut)
        };
        // A second instance (two-object goals) lies with the first.
        for _ in 0..count {
            objs.push(Object {
                name: obj,
                at: Place::In(at),
                state: State::default(),
            });
        }
        // Fillers: each surface and cupboard holds another object with probability 1/3.
        let mut fill = stream("fillers");
        let slots: Vec<usize> = (0..recs.len())
            .filter(|&r| recs[r].container && Some(r) != dest && recs[r].name != "fridge")
            .collect();
        let mut by_kind = [(0.0, 0.0); MAX_ROOMS + MAX_SHUT];
        for x in &mut by_kind {
            *x = (fill.uniform(), fill.uniform());
        }
        for r in slots {
            let k = SURFACES
                .iter()
                .chain(CUPBOARDS.iter())
                .position(|n| *n == recs[r].name)
                .unwrap_or(0);
            let (coin, which) = by_kind[k];
            if coin < FILLER_RATE {
                // Never the goal's object: its neighbour in the list instead.
                let i = draw::index(which, FILLERS.len());
                let name = if FILLERS[i] == obj {
                    FILLERS[(i + 1) % FILLERS.len()]
                } else {
                    FILLERS[i]
                };
                objs.push(Object {
                    name,
                    at: Place::In(r),
                    state: State::default(),
                });
            }
        }

        let goal = match (kind, dest) {
            (Kind::Put(need, count), Some(dest)) => Goal::Put {
                obj,
                dest,
                need,
                count,
            },
            _ => Goal::Examine { obj },
        };
        let hints: Vec<Hint> = (0..count)
            .map(|i| match (hint_level, objs[i].at) {
                (0, Place::In(r)) => Hint::Rec(r),
                (1, Place::In(r)) => Hint::Room(recs[r].room),
                _ => Hint::None,
            })
            .collect();
        let n_recs = recs.len();
        let mut world = World {
            rooms: names,
            recs,
            objs,
            agent: 0,
            examined: false,
            seen: vec![false; n_recs],
            visited: vec![false; n_rooms],
        };
        world.look();
        let prompt = prompt(&world, goal, &hints, self.list_actions);
        Task {
            world,
            goal,
            hints,
            prompt,
            list_actions: self.list_actions,
        }
    }
}

/// The goal's shape before the house exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put(Need, usize),
    Look,
}

/// The goal text.
fn goal_text(w: &World, goal: Goal) -> String {
    match goal {
        Goal::Put {
            obj,
            dest,
            need,
            count: 2,
        } => format!("put two {}{obj}s in {}", need.word(), w.recs[dest].name),
        Goal::Put {
            obj, dest, need, ..
        } => format!("put {}{obj} in {}", need.word(), w.recs[dest].name),
        Goal::Examine { obj } => format!("look at {obj} under lamp"),
    }
}

/// The hint line (without its newline), if the hints say anything.
fn hint_text(w: &World, goal: Goal, hints: &[Hint]) -> Option<String> {
    let parts: Vec<String> = hints
        .iter()
        .filter_map(|h| match *h {
            Hint::None => None,
            Hint::Room(room) => Some(w.rooms[room].to_string()),
            Hint::Rec(r) => {
                let mut chain = vec![w.recs[r].name];
                let mut cur = w.recs[r].inside;
                while let Some(p) = cur {
                    chain.push(w.recs[p].name);
                    cur = w.recs[p].inside;
                }
                chain.push(w.rooms[w.recs[r].room]);
                chain.reverse();
                Some(chain.join(" "))
            }
        })
        .collect();
    (!parts.is_empty()).then(|| {
        let s = if parts.len() > 1 { "s" } else { "" };
        format!("{}{s}: {}", goal.obj(), parts.join("; "))
    })
}

fn prompt(w: &World, goal: Goal, hints: &[Hint], list_actions: bool) -> String {
    let mut p = goal_text(w, goal);
    p.push('\n');
    if let Some(h) = hint_text(w, goal, hints) {
        p.push_str(&h);
        p.push('\n');
    }
    if w.rooms.len() > 1 {
        p.push_str(&format!("rooms: {}\n", w.rooms.join(" ")));
    }
    p.push_str(&w.describe_room());
    p.push('\n');
    if list_actions {
        p.push_str(&format!("can: {}\n", w.admissible().join(", ")));
    }
    p
}

impl Environment for Household {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![
            Dim::new("rooms", 1.0, MAX_ROOMS as f64),
            Dim::new("search", 0.0, MAX_SHUT as f64),
            Dim::new("goal", 0.0, 2.0),
            Dim::new("hints", 0.0, 2.0),
        ]
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.sample_episode(d, split, seed))
    }

    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let task = self.draw(d, Split::Train, seed);
        let (mut slip, noise) = planner::slips(seed, "household/slip", noise);
        let believed = if slip.uniform() < noise {
            forgotten(&task.world, task.goal)
        } else {
            task.goal
        };
        let steps = planner::demonstrate(&task, &task.world, &mut slip, |w, u, v| {
            let action = if u < noise / 4.0 { wander(w, v) } else { None };
            let action = action.or_else(|| world::expert(w, believed, &task.hints))?;
            Some((action, false))
        });
        (task.prompt, steps)
    }
}

/// The goal the flawed expert pursues when it forgets a sub-goal (see the module docs).
fn forgotten(w: &World, goal: Goal) -> Goal {
    let surface_of = |room: usize| {
        w.recs
            .iter()
            .position(|r| r.room == room && r.inside.is_none() && SURFACES.contains(&r.name))
            .unwrap_or(0)
    };
    match goal {
        Goal::Put {
            obj,
            dest,
            need,
            count,
        } => match (need, count) {
            (Need::Plain, 1) => Goal::Put {
                obj,
                dest: surface_of(w.recs[dest].room),
                need,
                count,
            },
            (Need::Plain, _) => Goal::Put {
                obj,
                dest,
                need,
                count: 1,
            },
            _ => Goal::Put {
                obj,
                dest,
                need: Need::Plain,
                count,
            },
        },
        Goal::Examine { obj } => {
            let lamp = w.recs.iter().position(|r| r.tool == Some(Tool::Light));
            Goal::Put {
                obj,
                dest: surface_of(lamp.map_or(0, |l| w.recs[l].room)),
                need: Need::Plain,
                count: 1,
            }
        }
    }
}

/// A wasted step: go to another room (`v` picks which), or else open a shut cupboard here.
fn wander(w: &World, v: f64) -> Option<String> {
    let n = w.rooms.len();
    if n > 1 {
        let other = (w.agent + 1 + draw::index(v, n - 1)) % n;
        return Some(format!("go {}", w.rooms[other]));
    }
    let shut: Vec<&Receptacle> = w
        .recs
        .iter()
        .enumerate()
        .filter(|(i, r)| r.room == w.agent && r.container && !r.open && w.visible(*i))
        .map(|(_, r)| r)
        .collect();
    (!shut.is_empty()).then(|| format!("open {}", shut[draw::index(v, shut.len())].name))
}

impl Plan for Task {
    type World = World;
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;
    fn prompt(&self) -> &str {
        &self.prompt
    }
    fn task_key(&self) -> String {
        format!("{}|{:?}", self.prompt, self.world.objs)
    }
    fn distance(&self, world: &World) -> usize {
        world::distance(world, self.goal, &self.hints)
    }
    fn satisfied(&self, world: &World) -> bool {
        world.satisfied(self.goal)
    }
    fn act(&self, world: &mut World, action: &str) -> (String, bool) {
        let out = world.act(action.trim(), self.goal);
        (out.text, out.valid)
    }
    fn expert(&self, world: &World) -> Option<String> {
        world::expert(world, self.goal, &self.hints)
    }

    /// What the expert's action here exercises (see the module docs).
    fn step_dims(&self, world: &World) -> Vec<usize> {
        let expert = self.expert(world);
        let verb = expert.as_deref().and_then(|a| a.split_whitespace().next());
        let placed = match self.goal {
            Goal::Put { obj, dest, .. } => world
                .objs
                .iter()
                .filter(|o| o.name == obj && o.at == Place::In(dest))
                .count(),
            Goal::Examine { .. } => 0,
        };
        let second = matches!(self.goal, Goal::Put { count: 2, .. }) && placed >= 1;
        match verb {
            None => vec![ROOMS, SEARCH, GOAL],
            Some("go") => vec![ROOMS],
            Some("open") => vec![SEARCH],
            Some("take" | "put") if second => vec![GOAL],
            Some("take" | "put") => Vec::new(),
            Some(_) => vec![GOAL],
        }
    }

    /// One of the expert's equally good choices given what the agent has seen.
    fn search_choice(&self, world: &World, said: &str) -> bool {
        world::expert_choices(world, self.goal, &self.hints)
            .iter()
            .any(|c| c == said)
    }

    fn observe(&self, world: &World, mut text: String) -> String {
        if self.list_actions {
            text.push_str(&format!("\ncan: {}", world.admissible().join(", ")));
        }
        text
    }
}

/// One `household` task being played (see the module docs): the planner episode on the
/// house. With `Label::Belief` a search step is right ([`PlanEpisode::search_right`]).
type HouseholdEpisode = PlanEpisode<Task>;

/// What a pretrained chat model is told before the task (see [`Episode::instructions`]).
const INSTRUCTIONS: &str = "You are in a house and must reach the goal on the first line below. \
Reply with exactly one action per message: `go ROOM`, `open RECEPTACLE`, `take OBJECT`, \
`put RECEPTACLE` (what you hold), `clean`, `heat` or `cool` (the held object, at the sink, \
oven or fridge), `examine` (the held object, under the lamp) or `help`. After each action I \
show what changed: a room as `name[contents]` for an open receptacle and `name?` for a shut \
one, `holding OBJECT`, or `error: <why>`. The episode ends when the goal holds.";

#[cfg(test)]
mod tests;
