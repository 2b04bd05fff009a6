//! The household world: rooms, receptacles and objects; what each action does to them, how
//! the world is shown in text, and the expert planner that acts on what it has seen.
//!
//! Everything here is plain data and pure functions of it; the task generator and the
//! episode live in the parent module.

/// What a device does to the object the agent holds (`clean`, `heat`, `cool`, `examine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// The sink: `clean`.
    Clean,
    /// The oven: `heat`.
    Heat,
    /// The fridge: `cool`.
    Cool,
    /// The lamp: `examine`.
    Light,
}

impl Tool {
    /// The action verb.
    pub fn verb(self) -> &'static str {
        match self {
            Self::Clean => "clean",
            Self::Heat => "heat",
            Self::Cool => "cool",
            Self::Light => "examine",
        }
    }
}

/// An object's state that a device changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    /// Cleaned at a sink.
    pub clean: bool,
    /// Heated (`Some(true)`) in an oven or cooled (`Some(false)`) in a fridge; the later wins.
    pub hot: Option<bool>,
}

impl State {
    fn adjective(self) -> &'static str {
        match (self.hot, self.clean) {
            (Some(true), _) => "hot ",
            (Some(false), _) => "cold ",
            (None, true) => "clean ",
            (None, false) => "",
        }
    }
}

/// What a goal asks of the object beyond where it ends up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing.
    Plain,
    /// Cleaned.
    Clean,
    /// Hot.
    Hot,
    /// Cold.
    Cold,
}

impl Need {
    /// Whether an object in state `s` meets the need.
    pub fn met(self, s: State) -> bool {
        match self {
            Self::Plain => true,
            Self::Clean => s.clean,
            Self::Hot => s.hot == Some(true),
            Self::Cold => s.hot == Some(false),
        }
    }

    /// The device that provides it.
    pub fn tool(self) -> Option<Tool> {
        match self {
            Self::Plain => None,
            Self::Clean => Some(Tool::Clean),
            Self::Hot => Some(Tool::Heat),
            Self::Cold => Some(Tool::Cool),
        }
    }

    /// The adjective in the goal text.
    pub fn word(self) -> &'static str {
        match self {
            Self::Plain => "",
            Self::Clean => "clean ",
            Self::Hot => "hot ",
            Self::Cold => "cold ",
        }
    }
}

/// What the episode must reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// `count` objects named `obj` meeting `need` inside receptacle `dest`.
    Put {
        /// Object name.
        obj: &'static str,
        /// Receptacle index.
        dest: usize,
        /// What the object must have undergone.
        need: Need,
        /// How many (1 or 2).
        count: usize,
    },
    /// Hold an object named `obj` while using the lamp.
    Examine {
        /// Object name.
        obj: &'static str,
    },
}

impl Goal {
    /// The object the goal is about.
    pub fn obj(self) -> &'static str {
        match self {
            Self::Put { obj, .. } | Self::Examine { obj } => obj,
        }
    }
}

/// A receptacle or device, fixed in one room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receptacle {
    /// Its name (unique in the house).
    pub name: &'static str,
    /// The room it stands in.
    pub room: usize,
    /// Holds objects (a device that is not a container, like the sink, does not).
    pub container: bool,
    /// Open (a surface is always open; a cupboard starts shut).
    pub open: bool,
    /// The receptacle it stands inside (seen only while that one is open).
    pub inside: Option<usize>,
    /// What it does to a held object, if it is a device.
    pub tool: Option<Tool>,
}

/// Where an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Inside (or on) a receptacle.
    In(usize),
    /// In the agent's hands.
    Held,
}

/// One object instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its type name (instances of a type share it).
    pub name: &'static str,
    /// Where it is.
    pub at: Place,
    /// What devices did to it.
    pub state: State,
}

/// The whole state of a house: the true world plus what the agent has seen of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    /// Room names, in the order the prompt lists them.
    pub rooms: Vec<&'static str>,
    /// Receptacles; a room lists its own in index order.
    pub recs: Vec<Receptacle>,
    /// Object instances.
    pub objs: Vec<Object>,
    /// The agent's room.
    pub agent: usize,
    /// Whether the goal object was examined under the lamp.
    pub examined: bool,
    /// Per receptacle: its contents have been shown to the agent (by entering the room while
    /// it was open, or by opening it). The planner acts on this, not on the true contents.
    pub seen: Vec<bool>,
    /// Per room: the agent has been in it.
    pub visited: Vec<bool>,
}

/// The longest action text that is parsed at all (longer texts are rejected unread).
pub const MAX_ACTION_CHARS: usize = 40;

/// What one action did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The text shown to the agent.
    pub text: String,
    /// The action was understood and possible (it changed or showed something).
    pub valid: bool,
}

impl World {
    /// Whether receptacle `r` can be seen from its room: every receptacle it stands in is open.
    pub fn visible(&self, r: usize) -> bool {
        let mut cur = self.recs[r].inside;
        while let Some(p) = cur {
            if !self.recs[p].open {
                return false;
            }
            cur = self.recs[p].inside;
        }
        true
    }

    /// The receptacles visible in the agent's room, in listing order (a nested receptacle
    /// right after the one it stands in).
    fn here(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for r in 0..self.recs.len() {
            if self.recs[r].room == self.agent && self.recs[r].inside.is_none() {
                self.push_tree(r, &mut out);
            }
        }
        out
    }

    fn push_tree(&self, r: usize, out: &mut Vec<usize>) {
        out.push(r);
        if self.recs[r].open {
            for c in 0..self.recs.len() {
                if self.recs[c].inside == Some(r) {
                    self.push_tree(c, out);
                }
            }
        }
    }

    /// The object the agent holds.
    pub fn held(&self) -> Option<usize> {
        self.objs.iter().position(|o| o.at == Place::Held)
    }

    fn find_rec(&self, name: &str) -> Option<usize> {
        self.recs.iter().position(|r| r.name == name)
    }

    /// `name[contents]` for an open container, `name?` for a shut one, `name` for a device
    /// that holds nothing.
    pub fn describe(&self, r: usize) -> String {
        let rec = &self.recs[r];
        if !rec.container {
            return rec.name.to_string();
        }
        if !rec.open {
            return format!("{}?", rec.name);
        }
        let mut items: Vec<String> = self
            .objs
            .iter()
            .filter(|o| o.at == Place::In(r))
            .map(|o| format!("{}{}", o.state.adjective(), o.name))
            .collect();
        items.extend(
            (0..self.recs.len())
                .filter(|&c| self.recs[c].inside == Some(r))
                .map(|c| self.describe(c)),
        );
        format!("{}[{}]", rec.name, items.join(", "))
    }

    /// `room: rec rec …` for the agent's room.
    pub fn describe_room(&self) -> String {
        let recs: Vec<String> = (0..self.recs.len())
            .filter(|&r| self.recs[r].room == self.agent && self.recs[r].inside.is_none())
            .map(|r| self.describe(r))
            .collect();
        format!("{}: {}", self.rooms[self.agent], recs.join(" "))
    }

    /// Marks what the agent sees in its room as seen.
    pub fn look(&mut self) {
        self.visited[self.agent] = true;
        for r in self.here() {
            if self.recs[r].open {
                self.seen[r] = true;
            }
        }
    }

    /// The goal holds.
    pub fn satisfied(&self, goal: Goal) -> bool {
        match goal {
            Goal::Put {
                obj,
                dest,
                need,
                count,
            } => self.placed(obj, dest, need) >= count,
            Goal::Examine { .. } => self.examined,
        }
    }

    fn placed(&self, obj: &str, dest: usize, need: Need) -> usize {
        self.objs
            .iter()
            .filter(|o| o.name == obj && o.at == Place::In(dest) && need.met(o.state))
            .count()
    }

    /// Every action that is possible now (`go`, `open`, `take`, `put`, the devices'), in a
    /// fixed order.
    pub fn admissible(&self) -> Vec<String> {
        let mut out: Vec<String> = (0..self.rooms.len())
            .filter(|&r| r != self.agent)
            .map(|r| format!("go {}", self.rooms[r]))
            .collect();
        let here = self.here();
        for &r in &here {
            if self.recs[r].container && !self.recs[r].open {
                out.push(format!("open {}", self.recs[r].name));
            }
        }
        match self.held() {
            None => {
                let mut names: Vec<&str> = Vec::new();
                for &r in &here {
                    if self.recs[r].container && self.recs[r].open {
                        for o in self.objs.iter().filter(|o| o.at == Place::In(r)) {
                            if !names.contains(&o.name) {
                                names.push(o.name);
                            }
                        }
                    }
                }
                out.extend(names.iter().map(|n| format!("take {n}")));
            }
            Some(_) => {
                for &r in &here {
                    if self.recs[r].container && self.recs[r].open {
                        out.push(format!("put {}", self.recs[r].name));
                    }
                    if let Some(t) = self.recs[r].tool {
                        out.push(t.verb().to_string());
                    }
                }
            }
        }
        out
    }

    /// Applies one action text (any text: it is parsed, never executed). The world changes
    /// only for a valid action.
    pub fn act(&mut self, action: &str, goal: Goal) -> Outcome {
        let bad = |text: String| Outcome { text, valid: false };
        if action.chars().count() > MAX_ACTION_CHARS {
            return bad("error: too long".into());
        }
        let words: Vec<&str> = action.split_whitespace().collect();
        let held = self.held();
        match words.as_slice() {
            ["go", room] => match self.rooms.iter().position(|r| r == room) {
                None => bad(format!("error: no room {room}")),
                Some(r) if r == self.agent => bad(format!("error: in {room} already")),
                Some(r) => {
                    self.agent = r;
                    self.look();
                    self.ok(self.describe_room())
                }
            },
            ["open", name] => match self.find_rec(name) {
                Some(r) if self.here().contains(&r) && self.recs[r].container => {
                    if self.recs[r].open {
                        return bad(format!("error: {name} is open"));
                    }
                    self.recs[r].open = true;
                    self.look();
                    self.ok(self.describe(r))
                }
                _ => bad(format!("error: no {name} to open here")),
            },
            ["take", obj] => {
                if let Some(h) = held {
                    return bad(format!("error: holding {}", self.objs[h].name));
                }
                let found = self.here().into_iter().find_map(|r| {
                    let rec = &self.recs[r];
                    (rec.container && rec.open)
                        .then(|| {
                            self.objs
                                .iter()
                                .position(|o| o.name == *obj && o.at == Place::In(r))
                        })
                        .flatten()
                });
                match found {
                    None => bad(format!("error: no {obj} here")),
                    Some(o) => {
                        self.objs[o].at = Place::Held;
                        let o = &self.objs[o];
                        self.ok(format!("holding {}{}", o.state.adjective(), o.name))
                    }
                }
            }
            ["put", name] => {
                let Some(h) = held else {
                    return bad("error: hands empty".into());
                };
                match self.find_rec(name) {
                    Some(r) if self.here().contains(&r) && self.recs[r].container => {
                        if !self.recs[r].open {
                            return bad(format!("error: {name} is shut"));
                        }
                        self.objs[h].at = Place::In(r);
                        self.seen[r] = true;
                        self.ok(self.describe(r))
                    }
                    _ => bad(format!("error: no {name} here")),
                }
            }
            [verb] if ["clean", "heat", "cool", "examine"].contains(verb) => {
                let Some(h) = held else {
                    return bad("error: hands empty".into());
                };
                let tool = [Tool::Clean, Tool::Heat, Tool::Cool, Tool::Light]
                    .into_iter()
                    .find(|t| t.verb() == *verb)
                    .unwrap_or(Tool::Light);
                let device = self
                    .here()
                    .into_iter()
                    .find(|&r| self.recs[r].tool == Some(tool));
                let Some(device) = device else {
                    return bad(format!("error: cannot {verb} here"));
                };
                if tool == Tool::Light {
                    if self.objs[h].name == goal.obj() && matches!(goal, Goal::Examine { .. }) {
                        self.examined = true;
                    }
                    let text = format!("{} under {}", self.objs[h].name, self.recs[device].name);
                    return self.ok(text);
                }
                let o = &mut self.objs[h];
                match tool {
                    Tool::Clean => o.state.clean = true,
                    Tool::Heat => o.state.hot = Some(true),
                    _ => o.state.hot = Some(false),
                }
                let text = format!("{} {}", o.name, o.state.adjective().trim_end());
                self.ok(text)
            }
            ["help"] => Outcome {
                text: format!("can: {}", self.admissible().join(", ")),
                valid: false,
            },
            _ => bad("error: unknown action".into()),
        }
    }

    fn ok(&self, text: String) -> Outcome {
        Outcome { text, valid: true }
    }
}

/// Where the agent was told (or saw) that an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// Nothing: search.
    None,
    /// Its room.
    Room(usize),
    /// Its receptacle.
    Rec(usize),
}

/// The expert's next action towards `goal` from `w`, acting only on what the agent could
/// know: the hints (one per goal instance: `hints[i]` is about `w.objs[i]`, the goal's
/// instances come first) and what has been seen. `None` when
/// the goal holds (or nothing is left to try).
///
/// 1. Holding a goal object that still needs its device: go to the device's room and use it.
/// 2. Holding a goal object that is ready: go to the destination's room, open it, put it in
///    (for `Examine`: go to the lamp's room and examine).
/// 3. Holding anything else: put it in the first open container of the room.
/// 4. Hands empty, a goal object known (seen, or hinted by receptacle) and not yet in place:
///    go to its room, open what it is inside, take it.
/// 5. Otherwise search: open the first unseen container of this room (if this room may hold
///    it), else go to the first room (in the prompt's order) that may hold it and was not
///    visited yet or has a cupboard not yet looked into.
pub fn expert(w: &World, goal: Goal, hints: &[Hint]) -> Option<String> {
    expert_choices(w, goal, hints).into_iter().next()
}

/// Every action the expert could take next if it broke its ties another way: its one action
/// in rules 1–4 (nothing hidden decides them), and in rule 5 (search) every unseen container
/// of this room when this room may hold an unfound goal object, else every other room that
/// may hold one and is unexplored. [`expert`] takes the first (listing order). Empty when the
/// goal holds or nothing is left to try. These are the steps on an optimal plan *given what
/// the agent has observed*: no search choice among them is better than another before the
/// containers are opened.
pub fn expert_choices(w: &World, goal: Goal, hints: &[Hint]) -> Vec<String> {
    choices(w, goal, hints).unwrap_or_default()
}

fn choices(w: &World, goal: Goal, hints: &[Hint]) -> Option<Vec<String>> {
    if w.satisfied(goal) {
        return None;
    }
    let go = |room: usize| format!("go {}", w.rooms[room]);
    let obj = goal.obj();
    if let Some(h) = w.held() {
        let o = &w.objs[h];
        if o.name == obj {
            let (need, dest) = match goal {
                Goal::Put { need, dest, .. } => (need, Some(dest)),
                Goal::Examine { .. } => (Need::Plain, None),
            };
            let tool = if need.met(o.state) {
                need_tool_after(goal)
            } else {
                need.tool()
            };
            if let Some(tool) = tool {
                let device = w.recs.iter().position(|r| r.tool == Some(tool))?;
                if w.recs[device].room != w.agent {
                    return Some(vec![go(w.recs[device].room)]);
                }
                return Some(vec![tool.verb().to_string()]);
            }
            let dest = dest?;
            if w.recs[dest].room != w.agent {
                return Some(vec![go(w.recs[dest].room)]);
            }
            return Some(vec![open_or(w, dest, || {
                format!("put {}", w.recs[dest].name)
            })]);
        }
        let spot = w
            .here()
            .into_iter()
            .find(|&r| w.recs[r].container && w.recs[r].open)?;
        return Some(vec![format!("put {}", w.recs[spot].name)]);
    }
    // Hands empty: the goal objects not yet in place, and which of them are known.
    let in_place = |o: &Object| match goal {
        Goal::Put { dest, need, .. } => o.at == Place::In(dest) && need.met(o.state),
        Goal::Examine { .. } => false,
    };
    let wanted: Vec<usize> = (0..w.objs.len())
        .filter(|&i| w.objs[i].name == obj && !in_place(&w.objs[i]))
        .collect();
    let known = |i: usize| -> Option<usize> {
        let Place::In(r) = w.objs[i].at else {
            return None;
        };
        let hinted = hints.get(i) == Some(&Hint::Rec(r));
        (w.seen[r] || hinted).then_some(r)
    };
    // A known one, this room's first.
    let mut targets: Vec<usize> = wanted.iter().filter_map(|&i| known(i)).collect();
    targets.sort_by_key(|&r| (w.recs[r].room != w.agent, r));
    if let Some(&r) = targets.first() {
        if w.recs[r].room != w.agent {
            return Some(vec![go(w.recs[r].room)]);
        }
        // Open the outermost shut receptacle on the way to it.
        let mut chain = vec![r];
        while let Some(p) = w.recs[*chain.last()?].inside {
            chain.push(p);
        }
        if let Some(&shut) = chain.iter().rev().find(|&&c| !w.recs[c].open) {
            return Some(vec![format!("open {}", w.recs[shut].name)]);
        }
        return Some(vec![format!("take {obj}")]);
    }
    // Search the rooms that may hold an unfound one.
    let unknown: Vec<usize> = wanted
        .iter()
        .copied()
        .filter(|&i| known(i).is_none())
        .collect();
    let may_hold = |room: usize| {
        unknown.iter().any(|&i| match hints.get(i) {
            Some(Hint::Room(h)) => *h == room,
            Some(Hint::Rec(r)) => w.recs[*r].room == room,
            _ => true,
        })
    };
    if may_hold(w.agent) {
        let here: Vec<String> = w
            .here()
            .into_iter()
            .filter(|&r| w.recs[r].container && !w.seen[r])
            .map(|r| format!("open {}", w.recs[r].name))
            .collect();
        if !here.is_empty() {
            return Some(here);
        }
    }
    // A room not yet visited, or one where an open cupboard showed a shut one inside.
    let unexplored = |room: usize| {
        !w.visited[room]
            || (0..w.recs.len()).any(|r| {
                w.recs[r].room == room && w.recs[r].container && !w.seen[r] && w.visible(r)
            })
    };
    let rooms: Vec<String> = (0..w.rooms.len())
        .filter(|&r| r != w.agent && unexplored(r) && may_hold(r))
        .map(go)
        .collect();
    (!rooms.is_empty()).then_some(rooms)
}

/// The device an already-prepared goal object still needs: the lamp for `Examine`.
fn need_tool_after(goal: Goal) -> Option<Tool> {
    matches!(goal, Goal::Examine { .. }).then_some(Tool::Light)
}

/// `open R` if receptacle `r` is shut, else `then()`.
fn open_or(w: &World, r: usize, then: impl FnOnce() -> String) -> String {
    if w.recs[r].open {
        then()
    } else {
        format!("open {}", w.recs[r].name)
    }
}

/// The expert's remaining number of actions from `w` (64, the simulation's cap, if it
/// cannot finish).
pub fn distance(w: &World, goal: Goal, hints: &[Hint]) -> usize {
    crate::draw::plan_length(
        w,
        |w| expert(w, goal, hints),
        |w, a| w.act(a, goal).valid,
        |w| w.satisfied(goal),
    )
}
