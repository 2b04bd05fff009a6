//! `desktop`: computer control on a simulated application, like OSWorld without a virtual
//! machine.
//!
//! The application is a document editor with a menu bar (`File`, `Edit`, `View`, `Format`,
//! `Tools`), menus and submenus, dialogs with tabs, check boxes, drop-down lists (which show
//! [`app::VISIBLE_OPTIONS`] options at a time and scroll) and text fields. The agent sees the
//! *visible layer* as a compact accessibility text with element ids, after every action, and
//! acts with `click(ID)`, `type(ID, "TEXT")`, `key(NAME)` (`enter`, `escape`, `ctrl+s`) and
//! `scroll(ID, N)`. The model, the actions and the expert planner are in [`app`].
//!
//! # What the agent sees
//!
//! ```text
//! set size 16, save                          ← the goal
//! size: Edit > Font                          ← the hint (this layout moved Font to Edit)
//! [1]File [2]Edit [3]View [4]Format [5]Tools ← the menu bar
//! click(2)                                   (the expert's actions; after each, the view:)
//! Edit: [7]Undo [8]Font                      ← an open menu (`name>` is a submenu)
//! click(8)
//! Font: [13]size=10 [14]bold=off [15]font=Arial [18]OK [19]Cancel   ← a dialog
//! click(13)
//! size: -2 [40]10 [41]11 [42]12 [43]14 +3    ← a drop-down list: 2 above, 3 below
//! scroll(13, 3)
//! size: -5 [43]14 [44]16 [45]18 [46]20
//! click(44)
//! [13]size=16
//! click(18)
//! applied size=16                            ← what OK changed
//! key(ctrl+s)                                ← the episode ends when the goal holds
//! ```
//!
//! Any action text is accepted: it is parsed ([`app::parse`]), never executed; a text that
//! does not parse, or an element that is not on the visible layer, is a wasted step with the
//! observation `error: <why>` and no change. Text typed into a field keeps its first 16
//! letters and digits.
//!
//! # Element ids
//!
//! Ids are stable automation ids, like the `AutomationId` of Windows UI Automation: every
//! real element (a menu, `Save`, an entry point, a control, a tab, a button, an option) has
//! the same id in every task, whatever the layout, depth or distractors — `size` is always
//! 13 and the Font dialog's OK always 18. What varies from task to task (distractor items,
//! `More>` submenus, distractor check boxes) is numbered after them (a test checks both).
//! So an agent can learn where an element's id is, but not where the element is: which
//! menu holds an entry point (the layout), whether it sits in a submenu or on a second tab
//! (depth), and which items are noise, it must read from the views. An earlier version
//! numbered elements in creation order, so the ids of real elements shifted with the
//! distractors; a small character-level policy then could not bind a setting's name to the
//! id in front of it (reports/results/archive/desktop-pilot/PILOT.md).
//!
//! # Settings and where they are
//!
//! | setting   | control                                  | dialog (entry) | home menu |
//! |-----------|------------------------------------------|----------------|-----------|
//! | `size`    | drop-down 8 9 10 11 12 14 16 18 20 (10)  | Font           | Format    |
//! | `bold`    | check box (off)                          | Font           | Format    |
//! | `font`    | drop-down Arial Serif Mono Sans (Arial)  | Font           | Format    |
//! | `spacing` | drop-down 1 1.5 2 3 (1)                  | Paragraph      | Format    |
//! | `indent`  | check box (off)                          | Paragraph      | Format    |
//! | `autosave`| check box (off)                          | Options        | Tools     |
//! | `minutes` | field (10)                               | Options        | Tools     |
//! | `theme`   | drop-down light dark blue gray (light)   | Options        | Tools     |
//! | `title`   | field (Untitled)                         | Properties     | File      |
//! | `ruler`   | checkable menu item (off)                | —              | View      |
//!
//! `File` also holds `Save`; `Edit` holds `Undo` (does nothing). Which menu an entry point
//! (a dialog's item, or the ruler) sits under is the task's *layout*: its home menu, or with
//! probability 1/4 another one.
//!
//! # Goals
//!
//! `set NAME VALUE, NAME VALUE, save`: one or two settings to change (check boxes and the
//! ruler to `on`, drop-downs to another option, `minutes` to a number, `title` to a word),
//! then perhaps saving. The verifier checks the application's final state: every named
//! setting has its value *applied* (a dialog's values apply on OK or `key(enter)`), and the
//! document was saved after the last change if the goal says `save`. Nothing else counts,
//! whatever the actions were.
//!
//! # Difficulty space (4 dims, each clamped to `[0, 1]`, NaN → 0, missing → 0)
//!
//! | index | name          | meaning                                                       | lo | hi |
//! |-------|---------------|---------------------------------------------------------------|----|----|
//! | 0     | `depth`       | each entry point sits in its menu's submenu `More>`, and each control on its dialog's second tab `More`, with probability `0.5·d0` | 0 | 0.5 |
//! | 1     | `subgoals`    | `n = 1 + sround(2·d1)`: 1 setting; 1 setting + save; 2 settings + save | 1 | 3 |
//! | 2     | `distractors` | `sround(2·d2)` extra do-nothing items in every menu and extra check boxes in every dialog | 0 | 2 |
//! | 3     | `hints`       | `sround(2·d3)`: 0 the instruction names each setting's menu path; 1 its menu-bar menu; 2 nothing | 0 | 2 |
//!
//! (`sround(y) = ⌊y⌋ + [u < frac(y)]` with `u` from the count's own stream: mean `y`,
//! monotone in `y`.) A deeper path is more clicks and something to find inside a menu or a
//! dialog; more sub-goals are more to remember; distractors are more to read and wrong
//! things to click; without hints the agent explores the menus, as the paper's OSWorld
//! rewriter removes hints to make a task harder.
//!
//! # Rewrites (same seed, another difficulty)
//!
//! Every part is drawn from its own stream (`Rng::derive(seed, "desktop/<part>")`) with a
//! fixed number of draws: the layout (`layout`: a move coin and a menu per entry point),
//! depth coins (`depth`: one per entry point and per control), the goal (`goal`: two
//! settings and their values, and the rounding), the distractor labels (`distractors`) and
//! each count's rounding. A change of `depth` moves only what crosses its coin; `subgoals`
//! keeps the first goal setting and the whole application; `distractors` keeps the goal and
//! every real element's place; `hints` changes only the hint line.
//!
//! # Splits
//!
//! `Train` draws from the seed, `Eval` from `Rng::derive(seed, "desktop/split/eval")` (same
//! distribution, disjoint seeds). One (entry point, menu) pair per entry point is held out of
//! Train and Eval: Font under Tools, Paragraph under File, Options under Format, Properties
//! under View, the ruler under Edit (a move that would land there lands on the next menu
//! instead). `Ood` (`Rng::derive(seed, "desktop/split/ood")`) puts the first goal setting's
//! entry point under its held-out menu; the rest is drawn as in training — a menu arrangement
//! never seen in training.
//!
//! # Oracle labels, step dims, blame
//!
//! The episode ends when the goal holds or after `max_steps` steps (the
//! expert's plan + `slack`, 4 by default). A step is labelled right when it was valid and the expert planner
//! ([`app::expert`], which acts on the hints and the menus the agent has opened) needs fewer
//! actions from the new state than from the old. Step `i`'s `dims` is what the expert's action
//! at that state exercises: opening a submenu or a second tab → `depth`; opening a
//! menu-bar menu while the path is not hinted (searching among the menus' items) →
//! `distractors`; the save, and any step towards the second setting → `subgoals`; after the
//! goal holds, all three. `hints` is never listed (it changes the evidence, not the action).
//! Step `i`'s `blame` is step `i`'s `dims` for a valid step that made no progress, nothing for an
//! invalid one.
//!
//! # Flawed expert ([`Environment::demonstration`])
//!
//! With probability `noise` the expert makes one realistic mistake for the whole episode,
//! drawn from the `slip` stream: it *forgets a sub-goal* (the save, or the second setting),
//! *picks the neighbouring option* of a drop-down (or types the number off by one), or
//! *cancels the dialog* instead of pressing OK. Before each action, with probability
//! `noise / 4`, it *wanders*: opens a random menu-bar menu (or escapes), then resumes.

//!
//! # Length
//!
//! A prompt is a goal line, a hint line and the menu bar: at most [`MAX_PROMPT_CHARS`]
//! characters (a test samples many). Expert
//! trajectories (prompt, actions, views, one delimiter after each) are long for a
//! character-level model: 99% of them have at most 340 characters at level 0 of the eval
//! grid, 440 at 0.25, 470 at 0.5 and 900 at 0.75 and 1 (no hints, two settings, submenus,
//! distractors), in-domain and OOD (a test checks these bounds). A character-level policy
//! for the whole grid needs a context of about 900; training at low difficulty needs about
//! 480.

pub mod app;

use crate::draw;
/// Steps beyond the expert's plan before an episode ends, by default (`slack`).
pub use crate::planner::STEP_SLACK;
use crate::planner::{self, Plan, PlanEpisode, check_settings, is_default_slack};
use app::{Action, App, Control, Dialog, Elem, Goal, Hint, Id, Setting};
use rlany_contract::check::Checked;
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Rng, Split};
use serde::{Deserialize, Serialize};

/// Index of the `depth` dimension.
pub const DEPTH: usize = 0;
/// Index of the `subgoals` dimension.
pub const SUBGOALS: usize = 1;
/// Index of the `distractors` dimension.
pub const DISTRACTORS: usize = 2;
/// Index of the `hints` dimension.
pub const HINTS: usize = 3;
/// The longest prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 160;
/// The probability that an entry point is not under its home menu.
const MOVE_RATE: f64 = 0.25;
/// The largest probability of a submenu / second-tab placement (at `depth = 1`).
const MAX_DEPTH_RATE: f64 = 0.5;
/// Distractors per menu and per dialog at `distractors = 1`.
const MAX_DISTRACTORS: usize = 2;

const BAR: [&str; 5] = ["File", "Edit", "View", "Format", "Tools"];
const FILE: usize = 0;
const EDIT: usize = 1;
const VIEW: usize = 2;
const FORMAT: usize = 3;
const TOOLS: usize = 4;
/// Entry points: `(label, home menu, held-out menu)`; the last is the ruler's toggle.
const ENTRIES: [(&str, usize, usize); 5] = [
    ("Font", FORMAT, TOOLS),
    ("Paragraph", FORMAT, FILE),
    ("Options", TOOLS, FORMAT),
    ("Properties", FILE, VIEW),
    ("ruler", VIEW, EDIT),
];
const RULER: usize = 4;
const DUD_ITEMS: [&str; 6] = ["Zoom", "Print", "Find", "Share", "Macros", "Spelling"];
const DUD_CHECKS: [&str; 6] = ["kerning", "caps", "hyphens", "tips", "backup", "locked"];
const TITLES: [&str; 5] = ["Budget", "Notes", "Plan", "Report", "Draft"];

/// `(name, control, default, entry)` for the real settings.
fn settings_table() -> Vec<(&'static str, Control, &'static str, usize)> {
    vec![
        (
            "size",
            Control::Drop(vec!["8", "9", "10", "11", "12", "14", "16", "18", "20"]),
            "10",
            0,
        ),
        ("bold", Control::Check, "off", 0),
        (
            "font",
            Control::Drop(vec!["Arial", "Serif", "Mono", "Sans"]),
            "Arial",
            0,
        ),
        ("spacing", Control::Drop(vec!["1", "1.5", "2", "3"]), "1", 1),
        ("indent", Control::Check, "off", 1),
        ("autosave", Control::Check, "off", 2),
        ("minutes", Control::Field, "10", 2),
        (
            "theme",
            Control::Drop(vec!["light", "dark", "blue", "gray"]),
            "light",
            2,
        ),
        ("title", Control::Field, "Untitled", 3),
        ("ruler", Control::Check, "off", RULER),
    ]
}

/// The `desktop` settings of an experiment file:
/// `environment: Desktop(difficulty: [0.2, 0.2, 0.2, 0.2])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DesktopSpec {
    /// Starting difficulty of every task slot, one value in `[0, 1]` per dimension
    /// (`depth`, `subgoals`, `distractors`, `hints`).
    pub difficulty: Vec<f64>,
    /// The step budget beyond the expert's plan: an episode ends after `plan + slack` steps
    /// (the horizon, with the tasks fixed). The expert's demonstrations are written for
    /// `plan + 4` whatever this is (the warm start replays them through an episode, so a
    /// `slack` below 4 cuts its longest ones). Left out of a written file at its default.
    #[serde(skip_serializing_if = "is_default_slack")]
    pub slack: usize,
}

impl Default for DesktopSpec {
    fn default() -> Self {
        Self {
            difficulty: vec![0.2; 4],
            slack: STEP_SLACK,
        }
    }
}

impl EnvironmentPlugin for DesktopSpec {
    fn validate(&self) -> Checked {
        check_settings(
            self.slack,
            &self.difficulty,
            &["depth", "subgoals", "distractors", "hints"],
        )
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    fn build(&self) -> Box<dyn Environment> {
        Box::new(Desktop::with_slack(self.slack))
    }
}

/// One drawn task.
#[derive(Debug, Clone, PartialEq)]
struct Task {
    app: App,
    goal: Goal,
    hints: Vec<Hint>,
    prompt: String,
}

/// The `desktop` environment (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Desktop {
    slack: usize,
}

impl Default for Desktop {
    /// Episodes end [`STEP_SLACK`] steps after the expert's plan.
    fn default() -> Self {
        Self::with_slack(STEP_SLACK)
    }
}

impl Desktop {
    /// The environment with episodes ending `slack` steps after the expert's plan.
    pub fn with_slack(slack: usize) -> Self {
        Self { slack }
    }

    /// Like [`Environment::sample`], but returns the concrete episode type.
    fn sample_episode(&self, d: &[f64], split: Split, seed: u64) -> DesktopEpisode {
        let task = self.draw(d, split, seed);
        let app = task.app.clone();
        PlanEpisode::new(task, app, self.slack)
    }

    fn draw(&self, d: &[f64], split: Split, seed: u64) -> Task {
        let coord = |i: usize| draw::coord(d, i);
        let base = match split {
            Split::Train => seed,
            Split::Eval => Rng::derive(seed, "desktop/split/eval").next_u64(),
            Split::Ood => Rng::derive(seed, "desktop/split/ood").next_u64(),
        };
        let stream = |part: &str| Rng::derive(base, &format!("desktop/{part}"));
        let sround = |y: f64, part: &str| draw::stochastic_round(y, stream(part).uniform());
        let depth_rate = coord(DEPTH) * MAX_DEPTH_RATE;
        let n_sub = 1 + sround(coord(SUBGOALS) * 2.0, "subgoals/round");
        let n_dud = sround(
            coord(DISTRACTORS) * MAX_DISTRACTORS as f64,
            "distractors/round",
        );
        let hint_level = sround(coord(HINTS) * 2.0, "hints/round");
        let table = settings_table();

        // The goal: two distinct settings and their values (always drawn), the first n used.
        let mut g = stream("goal");
        let first = draw::index(g.uniform(), table.len());
        // The second setting shares the first one's dialog when the dialog has another
        // ("autosave on, minutes 5"), else it is any other setting.
        let u_second = g.uniform();
        let mates: Vec<usize> = (0..table.len())
            .filter(|&s| s != first && table[s].3 == table[first].3)
            .collect();
        let second = if mates.is_empty() {
            (first + 1 + draw::index(u_second, table.len() - 1)) % table.len()
        } else {
            mates[draw::index(u_second, mates.len())]
        };
        let value_u = [g.uniform(), g.uniform()];
        let count = if n_sub == 3 { 2 } else { 1 };
        let save = n_sub >= 2;
        let goal_settings = [first, second];
        let target = |s: usize, u: f64| -> String {
            let (_, control, default, _) = &table[s];
            match control {
                Control::Check => "on".to_string(),
                Control::Drop(options) => {
                    let others: Vec<&&str> = options.iter().filter(|o| *o != default).collect();
                    others[draw::index(u, others.len())].to_string()
                }
                Control::Field if table[s].0 == "title" => {
                    TITLES[draw::index(u, TITLES.len())].into()
                }
                Control::Field => {
                    let m = 2 + draw::index(u, 58);
                    (if m >= 10 { m + 1 } else { m }).to_string()
                }
            }
        };
        let set: Vec<(usize, String)> = (0..count)
            .map(|i| (goal_settings[i], target(goal_settings[i], value_u[i])))
            .collect();

        // Layout: each entry point's menu.
        let mut lay = stream("layout");
        let mut menu_of = [0usize; ENTRIES.len()];
        for (e, &(_, home, held)) in ENTRIES.iter().enumerate() {
            let (coin, which) = (lay.uniform(), lay.uniform());
            let mut m = home;
            if coin < MOVE_RATE {
                m = (home + 1 + draw::index(which, BAR.len() - 1)) % BAR.len();
                if m == held {
                    m = (m + 1) % BAR.len();
                    if m == home {
                        m = (m + 1) % BAR.len();
                    }
                }
            }
            menu_of[e] = m;
        }
        if split == Split::Ood {
            let e = table[set[0].0].3;
            menu_of[e] = ENTRIES[e].2;
        }
        // Depth coins: per entry point (submenu) and per setting (second tab).
        let mut dep = stream("depth");
        let in_sub: Vec<bool> = (0..ENTRIES.len())
            .map(|_| dep.uniform() < depth_rate)
            .collect();
        let on_tab2: Vec<bool> = (0..table.len())
            .map(|_| dep.uniform() < depth_rate)
            .collect();
        // Distractor labels: one draw per menu and per dialog slot.
        let mut dis = stream("distractors");
        let dud_u: Vec<f64> = (0..BAR.len() * MAX_DISTRACTORS)
            .map(|_| dis.uniform())
            .collect();
        let chk_u: Vec<f64> = (0..4 * MAX_DISTRACTORS).map(|_| dis.uniform()).collect();

        // Build the elements. Real elements first, in a fixed order, so that each has the
        // same id in every task (a stable automation id): the bar menus (ids 1..=5), Save,
        // Undo, the entry points, each dialog's controls, two tabs, OK and Cancel, then the
        // drop-down options. What varies from task to task comes after them: distractor
        // items, `More>` submenus and distractor check boxes.
        let mut elems: Vec<Elem> = BAR
            .iter()
            .map(|&label| Elem::Menu {
                label,
                items: Vec::new(),
            })
            .collect();
        let mut settings: Vec<Setting> = table
            .iter()
            .map(|(name, control, _, _)| Setting {
                name,
                control: control.clone(),
            })
            .collect();
        let mut values: Vec<String> = table.iter().map(|t| t.2.to_string()).collect();
        let push = |elems: &mut Vec<Elem>, e: Elem| -> Id {
            elems.push(e);
            elems.len()
        };
        let mut bar_items: Vec<Vec<Id>> = vec![Vec::new(); BAR.len()];
        let mut sub_items: Vec<Vec<Id>> = vec![Vec::new(); BAR.len()];
        // Fixed items.
        bar_items[FILE].push(push(&mut elems, Elem::Save));
        bar_items[EDIT].push(push(&mut elems, Elem::Dud { label: "Undo" }));
        // Entry points.
        for (e, &(label, _, _)) in ENTRIES.iter().enumerate() {
            let item = if e == RULER {
                Elem::Toggle { setting: 9 }
            } else {
                Elem::Opens { label, dialog: e }
            };
            let id = push(&mut elems, item);
            if in_sub[e] {
                sub_items[menu_of[e]].push(id);
            } else {
                bar_items[menu_of[e]].push(id);
            }
        }
        // Dialogs: controls, both tabs (used only when the second one has a control),
        // buttons.
        let mut dialogs: Vec<Dialog> = Vec::new();
        for (dl, &(label, _, _)) in ENTRIES.iter().enumerate().take(4) {
            let mut tabs: Vec<(&'static str, Vec<Id>)> =
                vec![("Main", Vec::new()), ("More", Vec::new())];
            for s in (0..table.len()).filter(|&s| table[s].3 == dl) {
                let id = push(&mut elems, Elem::Ctrl { setting: s });
                tabs[usize::from(on_tab2[s])].1.push(id);
            }
            let both: Vec<Id> = (0..2)
                .map(|t| push(&mut elems, Elem::Tab { dialog: dl, tab: t }))
                .collect();
            let tab_ids = if tabs[1].1.is_empty() {
                tabs.pop();
                Vec::new()
            } else {
                both
            };
            let ok = push(&mut elems, Elem::Ok);
            let cancel = push(&mut elems, Elem::Cancel);
            dialogs.push(Dialog {
                label,
                tabs,
                tab_ids,
                ok,
                cancel,
            });
        }
        for (s, row) in table.iter().enumerate() {
            if let Control::Drop(options) = &row.1 {
                for index in 0..options.len() {
                    push(&mut elems, Elem::Opt { setting: s, index });
                }
            }
        }
        // Distractor items, after each menu's real items.
        for m in 0..BAR.len() {
            for k in 0..n_dud {
                let label = DUD_ITEMS[draw::index(dud_u[m * MAX_DISTRACTORS + k], DUD_ITEMS.len())];
                if !bar_items[m]
                    .iter()
                    .any(|&i| elems[i - 1] == Elem::Dud { label })
                {
                    let id = push(&mut elems, Elem::Dud { label });
                    bar_items[m].push(id);
                }
            }
        }
        // Submenus, last in their menu.
        for m in 0..BAR.len() {
            if !sub_items[m].is_empty() {
                let items = std::mem::take(&mut sub_items[m]);
                let id = push(
                    &mut elems,
                    Elem::Menu {
                        label: "More",
                        items,
                    },
                );
                bar_items[m].push(id);
            }
        }
        for (m, items) in bar_items.into_iter().enumerate() {
            if let Elem::Menu { items: slot, .. } = &mut elems[m] {
                *slot = items;
            }
        }
        // Distractor check boxes, on each dialog's first tab after its controls.
        for (dl, dialog) in dialogs.iter_mut().enumerate() {
            for k in 0..n_dud.min(1) {
                let name =
                    DUD_CHECKS[draw::index(chk_u[dl * MAX_DISTRACTORS + k], DUD_CHECKS.len())];
                if settings.iter().any(|st| st.name == name) {
                    continue;
                }
                settings.push(Setting {
                    name,
                    control: Control::Check,
                });
                values.push("off".into());
                let id = push(
                    &mut elems,
                    Elem::Ctrl {
                        setting: settings.len() - 1,
                    },
                );
                dialog.tabs[0].1.push(id);
            }
        }
        let n = elems.len();
        let settings_len = settings.len();
        let app = App {
            elems,
            bar: (1..=BAR.len()).collect(),
            dialogs,
            settings,
            values,
            open_menus: Vec::new(),
            dialog: None,
            list: None,
            saved: false,
            seen: vec![false; n],
            home: (0..settings_len)
                .map(|s| table.get(s).map(|t| ENTRIES[t.3].1 + 1))
                .collect(),
        };
        let hints: Vec<Hint> = set
            .iter()
            .map(|(s, _)| match hint_level {
                0 => Hint::Path,
                1 => app
                    .entry_of(*s)
                    .and_then(|e| app.path_to(e).first().copied())
                    .map_or(Hint::None, Hint::Menu),
                _ => Hint::None,
            })
            .collect();
        let goal = Goal { set, save };
        let prompt = prompt(&app, &goal, hint_level);
        Task {
            app,
            goal,
            hints,
            prompt,
        }
    }
}

fn menu_label(app: &App, id: Id) -> &'static str {
    match app.elems.get(id.wrapping_sub(1)) {
        Some(Elem::Menu { label, .. } | Elem::Opens { label, .. } | Elem::Dud { label }) => label,
        Some(Elem::Toggle { .. }) => "ruler",
        _ => "",
    }
}

fn prompt(app: &App, goal: &Goal, hint_level: usize) -> String {
    let mut parts: Vec<String> = goal
        .set
        .iter()
        .map(|(s, v)| format!("{} {v}", app.settings[*s].name))
        .collect();
    if goal.save {
        parts.push("save".into());
    }
    let mut p = format!("set {}\n", parts.join(", "));
    if hint_level < 2 {
        let hints: Vec<String> = goal
            .set
            .iter()
            .filter_map(|(s, _)| {
                let entry = app.entry_of(*s)?;
                let mut path: Vec<&str> = app
                    .path_to(entry)
                    .iter()
                    .map(|&m| menu_label(app, m))
                    .collect();
                if hint_level == 0 {
                    path.push(menu_label(app, entry));
                } else {
                    path.truncate(1);
                }
                Some(format!("{}: {}", app.settings[*s].name, path.join(" > ")))
            })
            .collect();
        p.push_str(&hints.join("; "));
        p.push('\n');
    }
    p.push_str(&app.bar_text());
    p.push('\n');
    p
}

impl Environment for Desktop {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![
            Dim::new("depth", 0.0, MAX_DEPTH_RATE),
            Dim::new("subgoals", 1.0, 3.0),
            Dim::new("distractors", 0.0, MAX_DISTRACTORS as f64),
            Dim::new("hints", 0.0, 2.0),
        ]
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.sample_episode(d, split, seed))
    }

    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let task = self.draw(d, Split::Train, seed);
        let (mut slip, noise) = planner::slips(seed, "desktop/slip", noise);
        let (coin, kind) = (slip.uniform(), slip.uniform());
        let mistake = (coin < noise).then(|| draw::index(kind, 3));
        // Mistake 0: forget a sub-goal (the save, else the second setting, else the only
        // setting's save… a one-setting goal without save forgets nothing and slips instead).
        let mut believed = task.goal.clone();
        let mut mistake = mistake;
        if mistake == Some(0) {
            if believed.save {
                believed.save = false;
            } else if believed.set.len() > 1 {
                believed.set.pop();
            } else {
                mistake = Some(1);
            }
        }
        // Mistake 1: the neighbouring option / a number off by one, for the first setting.
        if mistake == Some(1)
            && let Some((s, v)) = believed.set.first_mut()
        {
            match &task.app.settings[*s].control {
                Control::Drop(options) => {
                    let k = options.iter().position(|o| o == v).unwrap_or(0);
                    let j = if k + 1 < options.len() {
                        k + 1
                    } else {
                        k.saturating_sub(1)
                    };
                    *v = options[j].to_string();
                }
                Control::Field => {
                    *v = match v.parse::<u32>() {
                        Ok(n) => (n + 1).to_string(),
                        Err(_) => format!("{v}s"),
                    }
                }
                // A check box has no neighbour: cancel instead.
                Control::Check => mistake = Some(2),
            }
        }
        let steps = planner::demonstrate(&task, &task.app, &mut slip, |a, u, v| {
            let wander = (u < noise / 4.0).then(|| {
                if a.dialog.is_some() || a.list.is_some() {
                    "key(escape)".to_string()
                } else {
                    format!("click({})", a.bar[draw::index(v, a.bar.len())])
                }
            });
            let action = wander.or_else(|| app::expert(a, &believed, &task.hints))?;
            // Mistake 2: cancel the dialog the expert would confirm, and stop there.
            if mistake == Some(2)
                && let Some((d, ..)) = &a.dialog
                && action == format!("click({})", a.dialogs[*d].ok)
            {
                return Some((format!("click({})", a.dialogs[*d].cancel), true));
            }
            Some((action, false))
        });
        (task.prompt, steps)
    }
}

impl Plan for Task {
    type World = App;
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;
    fn prompt(&self) -> &str {
        &self.prompt
    }
    fn task_key(&self) -> String {
        format!("{}|{:?}", self.prompt, self.app.elems)
    }
    fn distance(&self, app: &App) -> usize {
        app::distance(app, &self.goal, &self.hints)
    }
    fn satisfied(&self, app: &App) -> bool {
        app.satisfied(&self.goal)
    }
    fn act(&self, app: &mut App, action: &str) -> (String, bool) {
        let out = app.act(action);
        (out.text, out.valid)
    }
    fn expert(&self, app: &App) -> Option<String> {
        app::expert(app, &self.goal, &self.hints)
    }

    /// The dims the expert's next action exercises (see the module docs).
    fn step_dims(&self, app: &App) -> Vec<usize> {
        let Some(a) = self.expert(app) else {
            return vec![DEPTH, SUBGOALS, DISTRACTORS];
        };
        if a == "key(ctrl+s)" {
            return vec![SUBGOALS];
        }
        let id = match app::parse(&a) {
            Ok(Action::Click(id) | Action::Type(id, _) | Action::Scroll(id, _)) => id,
            _ => return Vec::new(),
        };
        let mut dims = Vec::new();
        match app.elems.get(id.wrapping_sub(1)) {
            Some(Elem::Menu { .. }) if !app.bar.contains(&id) => dims.push(DEPTH),
            Some(Elem::Tab { .. }) => dims.push(DEPTH),
            Some(Elem::Menu { .. }) => {
                // A menu-bar menu opened while the path is not hinted: exploring.
                let g = self.goal.set.iter().position(|(s, v)| app.values[*s] != *v);
                if g.is_some_and(|g| self.hints.get(g) != Some(&Hint::Path)) {
                    dims.push(DISTRACTORS);
                }
            }
            _ => {}
        }
        // A step towards the second setting.
        if let Some((s2, _)) = self.goal.set.get(1)
            && app.values[self.goal.set[0].0] == self.goal.set[0].1
            && app.values[*s2] != self.goal.set[1].1
        {
            dims.push(SUBGOALS);
        }
        dims
    }
}

/// One `desktop` task being played (see the module docs): the planner episode on the
/// editor.
type DesktopEpisode = PlanEpisode<Task>;

/// What a pretrained chat model is told before the task (see [`Episode::instructions`]).
const INSTRUCTIONS: &str = "You control a document editor through its accessibility view: every element is shown \
as `[ID]name`. Do the settings the first line below asks for, then save. Reply with exactly \
one action per message: `click(ID)`, `type(ID, \"TEXT\")`, `key(enter)`, `key(escape)`, \
`key(ctrl+s)` or `scroll(ID, N)` (a drop-down list shows a few options; N moves it). \
After each action I show the new view, what OK applied, or `error: <why>`.";

#[cfg(test)]
mod tests;
