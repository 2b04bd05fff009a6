//! The simulated application: menus, dialogs with tabs, check boxes, drop-downs and text
//! fields, each with an element id; what each action does, how the visible layer is shown,
//! and the expert planner that acts on what it has seen.

/// An element id as the agent sees it (`[7]`): its index in [`App::elems`] plus one.
pub type Id = usize;

/// The kind of control a setting has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// On or off (`on` / `off`).
    Check,
    /// One of the options, chosen from a list that shows [`VISIBLE_OPTIONS`] at a time.
    Drop(Vec<&'static str>),
    /// Free text (at most [`MAX_TEXT_CHARS`] characters).
    Field,
}

/// Options a drop-down list shows at once; `scroll` shows others.
pub const VISIBLE_OPTIONS: usize = 4;
/// The longest text a field keeps.
pub const MAX_TEXT_CHARS: usize = 16;
/// The longest action text that is parsed at all.
pub const MAX_ACTION_CHARS: usize = 48;

/// One setting of the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Its name as controls show it (`size`).
    pub name: &'static str,
    /// Its control.
    pub control: Control,
}

/// One element of the interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elem {
    /// A menu (on the menu bar, or a submenu `name>` inside another); clicking opens it.
    Menu {
        /// Its label.
        label: &'static str,
        /// Its items, in order.
        items: Vec<Id>,
    },
    /// A menu item that opens dialog `dialog`.
    Opens {
        /// Its label.
        label: &'static str,
        /// Index into [`App::dialogs`].
        dialog: usize,
    },
    /// A checkable menu item: clicking flips `setting` and closes the menus.
    Toggle {
        /// Index into [`App::settings`].
        setting: usize,
    },
    /// `Save`: saves the document.
    Save,
    /// A distractor menu item: clicking it closes the menus and does nothing else.
    Dud {
        /// Its label.
        label: &'static str,
    },
    /// A dialog's tab button.
    Tab {
        /// Dialog index.
        dialog: usize,
        /// Tab index within the dialog.
        tab: usize,
    },
    /// A control of `setting` in a dialog.
    Ctrl {
        /// Index into [`App::settings`].
        setting: usize,
    },
    /// Option `index` of a drop-down's list.
    Opt {
        /// Index into [`App::settings`].
        setting: usize,
        /// Index into the drop-down's options.
        index: usize,
    },
    /// A dialog's OK button: applies its pending values.
    Ok,
    /// A dialog's Cancel button: discards them.
    Cancel,
}

/// A dialog: tabs of controls, and its buttons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dialog {
    /// Its title.
    pub label: &'static str,
    /// `(tab label, control ids)`; one tab means no tab buttons are shown.
    pub tabs: Vec<(&'static str, Vec<Id>)>,
    /// Tab button ids (empty with one tab).
    pub tab_ids: Vec<Id>,
    /// The OK button.
    pub ok: Id,
    /// The Cancel button.
    pub cancel: Id,
}

/// The goal: settings to reach, then perhaps save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Goal {
    /// `(setting, value)` pairs, in the order the instruction names them.
    pub set: Vec<(usize, String)>,
    /// The document must be saved after the last change.
    pub save: bool,
}

/// The whole application state, plus what the agent has seen of its menus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    /// Every element; id `i + 1` is `elems[i]`.
    pub elems: Vec<Elem>,
    /// The menu bar's menus.
    pub bar: Vec<Id>,
    /// The dialogs.
    pub dialogs: Vec<Dialog>,
    /// The settings.
    pub settings: Vec<Setting>,
    /// Applied values, one per setting.
    pub values: Vec<String>,
    /// Open menus, outermost first.
    pub open_menus: Vec<Id>,
    /// The open dialog, its shown tab and its pending values (one per setting).
    pub dialog: Option<(usize, usize, Vec<String>)>,
    /// The open drop-down list: its control and the first option shown.
    pub list: Option<(Id, usize)>,
    /// Saved since the last change.
    pub saved: bool,
    /// Per element: a menu the agent has opened (its items were shown).
    pub seen: Vec<bool>,
    /// Per setting: the menu-bar menu where such a setting usually is (the application's
    /// conventions, which a user knows): the expert looks there first.
    pub home: Vec<Option<Id>>,
}

/// What one action did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The text shown to the agent.
    pub text: String,
    /// The action was understood and possible.
    pub valid: bool,
}

/// An action, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `click(ID)`.
    Click(Id),
    /// `type(ID, "TEXT")`.
    Type(Id, String),
    /// `key(NAME)`: `enter`, `escape`, `ctrl+s`.
    Key(String),
    /// `scroll(ID, N)`: move a drop-down list by `N` options (negative: up).
    Scroll(Id, i64),
}

/// Parses `click(7)`, `type(9, "Budget")`, `key(enter)`, `scroll(5, 2)` (spaces allowed
/// around the parts; nothing else).
pub fn parse(text: &str) -> Result<Action, &'static str> {
    if text.chars().count() > MAX_ACTION_CHARS {
        return Err("too long");
    }
    let t = text.trim();
    let (verb, rest) = t
        .split_once('(')
        .ok_or("expected click(ID), type(ID, \"TEXT\"), key(NAME) or scroll(ID, N)")?;
    let inner = rest.strip_suffix(')').ok_or("missing )")?;
    let id = |s: &str| s.trim().parse::<Id>().map_err(|_| "bad id");
    match verb.trim() {
        "click" => Ok(Action::Click(id(inner)?)),
        "key" => Ok(Action::Key(inner.trim().to_string())),
        "scroll" => {
            let (a, b) = inner.split_once(',').ok_or("expected scroll(ID, N)")?;
            let n = b.trim().parse::<i64>().map_err(|_| "bad count")?;
            Ok(Action::Scroll(id(a)?, n.clamp(-99, 99)))
        }
        "type" => {
            let (a, b) = inner.split_once(',').ok_or("expected type(ID, \"TEXT\")")?;
            let s = b.trim();
            let text = s
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .ok_or("text must be quoted")?;
            Ok(Action::Type(id(a)?, text.to_string()))
        }
        _ => Err("unknown action"),
    }
}

impl App {
    fn elem(&self, id: Id) -> Option<&Elem> {
        id.checked_sub(1).and_then(|i| self.elems.get(i))
    }

    /// The dialog and tab holding control `id`.
    pub fn place_of(&self, id: Id) -> Option<(usize, usize)> {
        self.dialogs.iter().enumerate().find_map(|(d, dl)| {
            dl.tabs
                .iter()
                .position(|(_, ctrls)| ctrls.contains(&id))
                .map(|t| (d, t))
        })
    }

    /// The control id of `setting` (`None` for a menu toggle).
    pub fn ctrl_of(&self, setting: usize) -> Option<Id> {
        self.elems
            .iter()
            .position(|e| *e == Elem::Ctrl { setting })
            .map(|i| i + 1)
    }

    /// The menu item that reaches `setting`: its toggle, or what opens its dialog.
    pub fn entry_of(&self, setting: usize) -> Option<Id> {
        if let Some(i) = self
            .elems
            .iter()
            .position(|e| *e == Elem::Toggle { setting })
        {
            return Some(i + 1);
        }
        let (d, _) = self.place_of(self.ctrl_of(setting)?)?;
        self.elems
            .iter()
            .position(|e| matches!(e, Elem::Opens { dialog, .. } if *dialog == d))
            .map(|i| i + 1)
    }

    /// The menu chain (outermost first) that shows item `id`.
    pub fn path_to(&self, id: Id) -> Vec<Id> {
        let mut path = Vec::new();
        let mut cur = id;
        while let Some(parent) = self.parent_menu(cur) {
            path.push(parent);
            cur = parent;
        }
        path.reverse();
        path
    }

    fn parent_menu(&self, id: Id) -> Option<Id> {
        self.elems.iter().enumerate().find_map(|(i, e)| match e {
            Elem::Menu { items, .. } if items.contains(&id) => Some(i + 1),
            _ => None,
        })
    }

    fn label(&self, id: Id) -> String {
        match self.elem(id) {
            Some(Elem::Menu { label, .. }) if !self.bar.contains(&id) => format!("{label}>"),
            Some(Elem::Menu { label, .. } | Elem::Opens { label, .. } | Elem::Dud { label }) => {
                label.to_string()
            }
            Some(Elem::Toggle { setting }) => {
                format!("{}={}", self.settings[*setting].name, self.values[*setting])
            }
            Some(Elem::Save) => "Save".into(),
            _ => String::new(),
        }
    }

    fn pending(&self, setting: usize) -> &str {
        match &self.dialog {
            Some((_, _, p)) => &p[setting],
            None => &self.values[setting],
        }
    }

    /// The visible layer: an open list, else the open dialog's tab, else the deepest open
    /// menu, else the menu bar.
    pub fn view(&self) -> String {
        if let Some((ctrl, first)) = self.list {
            let Some(Elem::Ctrl { setting }) = self.elem(ctrl) else {
                return String::new();
            };
            let Control::Drop(options) = &self.settings[*setting].control else {
                return String::new();
            };
            let mut parts = vec![format!("{}:", self.settings[*setting].name)];
            if first > 0 {
                parts.push(format!("-{first}"));
            }
            let end = (first + VISIBLE_OPTIONS).min(options.len());
            for (k, opt) in options.iter().enumerate().take(end).skip(first) {
                let id = self.opt_id(*setting, k).unwrap_or(0);
                parts.push(format!("[{id}]{opt}"));
            }
            if end < options.len() {
                parts.push(format!("+{}", options.len() - end));
            }
            return parts.join(" ");
        }
        if let Some((d, tab, _)) = &self.dialog {
            let dl = &self.dialogs[*d];
            let mut parts = vec![format!("{}:", dl.label)];
            for (t, id) in dl.tab_ids.iter().enumerate() {
                let mark = if t == *tab { "*" } else { "" };
                parts.push(format!("[{id}]{}{mark}", dl.tabs[t].0));
            }
            for &c in &dl.tabs[*tab].1 {
                if let Some(Elem::Ctrl { setting }) = self.elem(c) {
                    let v = self.pending(*setting);
                    parts.push(format!("[{c}]{}={v}", self.settings[*setting].name));
                }
            }
            parts.push(format!("[{}]OK [{}]Cancel", dl.ok, dl.cancel));
            return parts.join(" ");
        }
        if let Some(&m) = self.open_menus.last() {
            let Some(Elem::Menu { label, items }) = self.elem(m) else {
                return String::new();
            };
            let shown: Vec<String> = items
                .iter()
                .map(|&i| format!("[{i}]{}", self.label(i)))
                .collect();
            return format!("{label}: {}", shown.join(" "));
        }
        self.bar_text()
    }

    /// `[1]File [2]Edit …`.
    pub fn bar_text(&self) -> String {
        let shown: Vec<String> = self
            .bar
            .iter()
            .map(|&i| format!("[{i}]{}", self.label(i)))
            .collect();
        shown.join(" ")
    }

    fn opt_id(&self, setting: usize, index: usize) -> Option<Id> {
        self.elems
            .iter()
            .position(|e| *e == Elem::Opt { setting, index })
            .map(|i| i + 1)
    }

    /// Whether element `id` can be clicked now.
    fn clickable(&self, id: Id) -> bool {
        if let Some((ctrl, first)) = self.list {
            let setting = match self.elem(ctrl) {
                Some(Elem::Ctrl { setting }) => *setting,
                _ => return false,
            };
            return matches!(self.elem(id), Some(Elem::Opt { setting: s, index })
                if *s == setting && (first..first + VISIBLE_OPTIONS).contains(index));
        }
        if let Some((d, tab, _)) = &self.dialog {
            let dl = &self.dialogs[*d];
            return dl.tab_ids.contains(&id)
                || dl.tabs[*tab].1.contains(&id)
                || id == dl.ok
                || id == dl.cancel;
        }
        self.bar.contains(&id)
            || self.open_menus.iter().any(
                |&m| matches!(self.elem(m), Some(Elem::Menu { items, .. }) if items.contains(&id)),
            )
    }

    /// The goal holds: every named setting has its value (applied), and the document was
    /// saved after the last change if the goal says so.
    pub fn satisfied(&self, goal: &Goal) -> bool {
        goal.set.iter().all(|(s, v)| self.values[*s] == *v) && (!goal.save || self.saved)
    }

    /// Applies one action text (any text: it is parsed, never executed). The state changes
    /// only for a valid action.
    pub fn act(&mut self, text: &str) -> Outcome {
        let bad = |text: String| Outcome { text, valid: false };
        let action = match parse(text) {
            Ok(a) => a,
            Err(e) => return bad(format!("error: {e}")),
        };
        match action {
            Action::Key(k) => match k.as_str() {
                "escape" => {
                    if self.list.take().is_some() {
                        self.ok(self.view())
                    } else if self.dialog.take().is_some() {
                        self.ok("cancelled".into())
                    } else if !self.open_menus.is_empty() {
                        self.open_menus.clear();
                        self.ok("closed".into())
                    } else {
                        bad("error: nothing to close".into())
                    }
                }
                "enter" => match &self.dialog {
                    Some((d, ..)) if self.list.is_none() => {
                        let ok = self.dialogs[*d].ok;
                        self.click(ok)
                    }
                    _ => bad("error: no dialog".into()),
                },
                "ctrl+s" if self.dialog.is_none() => {
                    self.open_menus.clear();
                    self.saved = true;
                    self.ok("saved".into())
                }
                "ctrl+s" => bad("error: a dialog is open".into()),
                _ => bad("error: unknown key".into()),
            },
            Action::Click(id) => {
                if !self.clickable(id) {
                    return bad(format!("error: no element {id} here"));
                }
                self.click(id)
            }
            Action::Scroll(id, n) => match self.list {
                Some((ctrl, first)) if ctrl == id => {
                    let len = match self.elem(ctrl) {
                        Some(Elem::Ctrl { setting }) => match &self.settings[*setting].control {
                            Control::Drop(o) => o.len(),
                            _ => 0,
                        },
                        _ => 0,
                    };
                    let last = len.saturating_sub(VISIBLE_OPTIONS) as i64;
                    let to = (first as i64 + n).clamp(0, last) as usize;
                    if to == first {
                        return bad("error: cannot scroll further".into());
                    }
                    self.list = Some((ctrl, to));
                    self.ok(self.view())
                }
                _ => bad(format!("error: no list {id} open")),
            },
            Action::Type(id, text) => {
                let setting = match self.elem(id) {
                    Some(Elem::Ctrl { setting })
                        if self.clickable(id)
                            && self.settings[*setting].control == Control::Field =>
                    {
                        *setting
                    }
                    _ => return bad(format!("error: no field {id} here")),
                };
                let text: String = text
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric())
                    .take(MAX_TEXT_CHARS)
                    .collect();
                if let Some((_, _, p)) = &mut self.dialog {
                    p[setting] = text;
                }
                let name = self.settings[setting].name;
                self.ok(format!("[{id}]{name}={}", self.pending(setting)))
            }
        }
    }

    /// Clicks a clickable element.
    fn click(&mut self, id: Id) -> Outcome {
        let Some(elem) = self.elem(id).cloned() else {
            return Outcome {
                text: format!("error: no element {id} here"),
                valid: false,
            };
        };
        match elem {
            Elem::Menu { .. } => {
                if self.bar.contains(&id) {
                    self.open_menus = vec![id];
                } else {
                    let parent = self.parent_menu(id);
                    if let Some(p) =
                        parent.and_then(|p| self.open_menus.iter().position(|&m| m == p))
                    {
                        self.open_menus.truncate(p + 1);
                    }
                    self.open_menus.push(id);
                }
                self.seen[id - 1] = true;
                self.ok(self.view())
            }
            Elem::Opens { dialog, .. } => {
                self.open_menus.clear();
                self.dialog = Some((dialog, 0, self.values.clone()));
                self.ok(self.view())
            }
            Elem::Toggle { setting } => {
                self.open_menus.clear();
                let v = if self.values[setting] == "on" {
                    "off"
                } else {
                    "on"
                };
                self.values[setting] = v.to_string();
                self.saved = false;
                self.ok(format!("{}={v}", self.settings[setting].name))
            }
            Elem::Save => {
                self.open_menus.clear();
                self.saved = true;
                self.ok("saved".into())
            }
            Elem::Dud { label } => {
                self.open_menus.clear();
                self.ok(format!("{label}: nothing to do"))
            }
            Elem::Tab { tab, .. } => {
                if let Some((_, t, _)) = &mut self.dialog {
                    *t = tab;
                }
                self.ok(self.view())
            }
            Elem::Ctrl { setting } => match &self.settings[setting].control {
                Control::Check => {
                    if let Some((_, _, p)) = &mut self.dialog {
                        p[setting] = if p[setting] == "on" { "off" } else { "on" }.to_string();
                    }
                    let name = self.settings[setting].name;
                    self.ok(format!("[{id}]{name}={}", self.pending(setting)))
                }
                Control::Drop(options) => {
                    // Open the list where its current value shows.
                    let cur = options
                        .iter()
                        .position(|o| *o == self.pending(setting))
                        .unwrap_or(0);
                    let first = cur.min(options.len().saturating_sub(VISIBLE_OPTIONS));
                    self.list = Some((id, first));
                    self.ok(self.view())
                }
                Control::Field => Outcome {
                    text: format!("error: type into field {id}"),
                    valid: false,
                },
            },
            Elem::Opt { setting, index } => {
                let Control::Drop(options) = &self.settings[setting].control else {
                    return Outcome {
                        text: String::new(),
                        valid: false,
                    };
                };
                let v = options[index].to_string();
                if let Some((_, _, p)) = &mut self.dialog {
                    p[setting] = v;
                }
                self.list = None;
                let ctrl = self.ctrl_of(setting).unwrap_or(0);
                let name = self.settings[setting].name;
                self.ok(format!("[{ctrl}]{name}={}", self.pending(setting)))
            }
            Elem::Ok => {
                let Some((_, _, pending)) = self.dialog.take() else {
                    return Outcome {
                        text: String::new(),
                        valid: false,
                    };
                };
                let changed: Vec<String> = (0..self.values.len())
                    .filter(|&s| pending[s] != self.values[s])
                    .map(|s| format!("{}={}", self.settings[s].name, pending[s]))
                    .collect();
                if !changed.is_empty() {
                    self.saved = false;
                }
                self.values = pending;
                if changed.is_empty() {
                    self.ok("applied nothing".into())
                } else {
                    self.ok(format!("applied {}", changed.join(" ")))
                }
            }
            Elem::Cancel => {
                self.dialog = None;
                self.ok("cancelled".into())
            }
        }
    }

    fn ok(&self, text: String) -> Outcome {
        Outcome { text, valid: true }
    }
}

/// What the agent knows of where an entry point is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// Nothing: explore the menus.
    None,
    /// The menu-bar menu it is under.
    Menu(Id),
    /// The whole path (the menu chain to it).
    Path,
}

/// The expert's next action towards `goal`, acting on what the agent can know: the hints
/// (one per goal setting) and the menus it has opened.
///
/// 1. A list is open: click the goal's option if shown, else scroll to it; a list of no goal
///    setting (or already right) is closed with `key(escape)`.
/// 2. A dialog is open: for the first goal setting of this dialog whose pending value is
///    wrong, show its tab, then click (check box, drop-down) or type (field); when none is
///    wrong, click OK if some goal setting here changes, else Cancel.
/// 3. Otherwise, for the first goal setting not yet applied: if its entry point is known
///    (hinted path, or seen in an opened menu), open the menus on the way and click it; if
///    only its menu is known, open that menu and its submenus not yet seen; if nothing is
///    known, open the setting's usual menu first, then the menu-bar menus in order (each
///    one's submenus before the next) not yet seen.
/// 4. All applied and the goal wants a save: `key(ctrl+s)`.
pub fn expert(app: &App, goal: &Goal, hints: &[Hint]) -> Option<String> {
    if app.satisfied(goal) {
        return None;
    }
    let target = |s: usize| goal.set.iter().find(|(g, _)| *g == s).map(|(_, v)| v);
    if let Some((ctrl, first)) = app.list {
        let Some(Elem::Ctrl { setting }) = app.elem(ctrl) else {
            return Some("key(escape)".into());
        };
        let Control::Drop(options) = &app.settings[*setting].control else {
            return Some("key(escape)".into());
        };
        return match target(*setting) {
            Some(v) if app.pending(*setting) != v => {
                let k = options.iter().position(|o| o == v)?;
                if (first..first + VISIBLE_OPTIONS).contains(&k) {
                    Some(format!("click({})", app.opt_id(*setting, k)?))
                } else {
                    let last = options.len().saturating_sub(VISIBLE_OPTIONS);
                    let to = k.min(last) as i64;
                    Some(format!("scroll({ctrl}, {})", to - first as i64))
                }
            }
            _ => Some("key(escape)".into()),
        };
    }
    if let Some((d, tab, pending)) = &app.dialog {
        let dl = &app.dialogs[*d];
        let here: Vec<(usize, Id, usize)> = goal
            .set
            .iter()
            .filter_map(|(s, _)| {
                let c = app.ctrl_of(*s)?;
                let (dd, t) = app.place_of(c)?;
                (dd == *d).then_some((*s, c, t))
            })
            .collect();
        if let Some(&(s, c, t)) = here.iter().find(|(s, ..)| Some(&pending[*s]) != target(*s)) {
            if t != *tab {
                return Some(format!("click({})", dl.tab_ids[t]));
            }
            let v = target(s)?;
            return Some(match app.settings[s].control {
                Control::Field => format!("type({c}, \"{v}\")"),
                _ => format!("click({c})"),
            });
        }
        let changes = here.iter().any(|(s, ..)| pending[*s] != app.values[*s]);
        return Some(format!(
            "click({})",
            if changes { dl.ok } else { dl.cancel }
        ));
    }
    let next = goal
        .set
        .iter()
        .enumerate()
        .find(|(_, (s, v))| app.values[*s] != *v);
    let Some((g, (s, _))) = next else {
        return goal.save.then(|| "key(ctrl+s)".to_string());
    };
    let entry = app.entry_of(*s)?;
    let path = app.path_to(entry);
    let hint = hints.get(g).copied().unwrap_or(Hint::None);
    // Known: hinted, or shown (its own menu was opened).
    let known = hint == Hint::Path || path.last().is_some_and(|&m| app.seen[m - 1]);
    if known {
        // Open the first menu on the path that is not open, else click the entry.
        for (i, &m) in path.iter().enumerate() {
            if app.open_menus.get(i) != Some(&m) {
                return Some(format!("click({m})"));
            }
        }
        return Some(format!("click({entry})"));
    }
    // Explore: the hinted menu, else the bar in order; inside an open menu, its unseen
    // submenus first.
    let candidates: Vec<Id> = match hint {
        Hint::Menu(m) => vec![m],
        _ => {
            let home = app.home.get(*s).copied().flatten();
            home.into_iter()
                .chain(app.bar.iter().copied().filter(|&m| Some(m) != home))
                .collect()
        }
    };
    if let Some(&open) = app.open_menus.last()
        && let Some(Elem::Menu { items, .. }) = app.elem(open)
        && let Some(&sub) = items
            .iter()
            .find(|&&i| matches!(app.elem(i), Some(Elem::Menu { .. })) && !app.seen[i - 1])
    {
        return Some(format!("click({sub})"));
    }
    let unexplored = |m: Id| {
        !app.seen[m - 1]
            || matches!(app.elem(m), Some(Elem::Menu { items, .. })
                if items.iter().any(|&i| matches!(app.elem(i), Some(Elem::Menu { .. })) && !app.seen[i - 1]))
    };
    candidates
        .into_iter()
        .find(|&m| unexplored(m) && app.open_menus.first() != Some(&m))
        .map(|m| format!("click({m})"))
}

/// The expert's remaining number of actions from `app` (64, the simulation's cap, if it
/// cannot finish).
pub fn distance(app: &App, goal: &Goal, hints: &[Hint]) -> usize {
    crate::draw::plan_length(
        app,
        |a| expert(a, goal, hints),
        |a, action| a.act(action).valid,
        |a| a.satisfied(goal),
    )
}
