//! `process`: an environment that lives in another process, spoken to in JSON lines.
//!
//! `environment: Process(command: ["python3", "environments/process/reference.py"], ...)`
//! starts the command (an argument list: no shell is involved) and speaks protocol 1 with
//! it on its stdin and stdout, one JSON object per line; the protocol is specified in
//! `environments/process/PROTOCOL.md`, its serving side in Python (no dependencies) is
//! `environments/process/rlany_protocol.py`, and `environments/process/reference.py` is the
//! reference environment the tests and `experiments/process_smoke.ron` use.
//!
//! # What maps to what
//!
//! | the loop asks                        | the host sends (the child answers)               |
//! |--------------------------------------|--------------------------------------------------|
//! | build: difficulty space, eval grid   | `hello` (`name`, `dims`, `eval_levels`)          |
//! | `sample(d, split, seed)`             | `reset` (`prompt`, `instructions`, `key`)        |
//! | `Episode::step(action)`              | `step` (`observation`, `done`, `won`, `label`, `dims`, `blame`, `kind`) |
//! | `outcome`                            | nothing: kept from the last `step` reply (`won`) |
//! | `demonstration(d, noise, seed)`      | `reset` (for the prompt), `close`, `demo` (`actions`) |
//! | the episode is dropped               | `close` (its reply is not waited for)            |
//!
//! # Children, failures, the fault
//!
//! `children` processes run side by side; episodes are dealt to them round robin, and each
//! child holds many episodes (the host names each by an id). The loop's
//! [`Environment::sample_many`] and [`Episode::submit`] let the host send a whole step's
//! resets, or a turn's steps, before it awaits any reply, so the children work in parallel. A child is started when it is
//! first needed; one call waits at most `timeout_s` for its reply, and a reply line may
//! have at most `max_line_kib` KiB. A call that fails — the child crashed or exited, did not
//! answer in time, wrote something that is not a reply of the protocol or too long a line,
//! or answered `error` — fails its episode: the episode ends at once, unsolved, its step
//! labelled wrong (`sample` hands out an episode that is already over). Except after an
//! `error` reply the child is killed and the next call starts a new one; the other episodes
//! it held end the same way at their next step. After `max_failures` failed calls with no
//! successful `step` between them the environment is *faulted* ([`Environment::fault`]): nothing more is started, and the
//! loop stops the run with that message (naming the command, the failure and the end of
//! the child's stderr) before its next checkpoint, so the run resumes from the last one.
//! A child that fails often but not in a row faults it too: more than `max_failure_rate` of
//! the last `failure_window` outcomes (successful steps and failed calls) failed — with the
//! defaults (0.25 of 20) a child that crashes at every third step stops the run within its
//! first training step, and one timeout in a long run does not. Every failure is counted
//! ([`Environment::health`]): the loop writes `env/failed_calls`, `env/timeouts`,
//! `env/restarts` and `env/failed_episodes` per step and warns when they are not zero.
//! A restarted child that describes another difficulty space than the first is a failure
//! too. How many failures are tolerated is the experiment's choice: `max_failures: 1` stops
//! at the first.
//!
//! Everything the environment promises (a task is a pure function of `(difficulty, split,
//! seed)`; any action text is accepted; the expert's trajectory solves its task) is the
//! child's promise; `rlany env` checks it on a few tasks before it shows one
//! ([`conformance`]).

pub mod child;
pub mod conformance;
pub mod pool;
pub mod reply;

use child::Limits;
use pool::{CallFailed, Launch, Pool, Sent};
use rlany_contract::check::{self, Checked, FieldError};
use rlany_contract::plugin::EnvironmentPlugin;
use rlany_contract::{Difficulty, Dim, Environment, Episode, Split, StepResult};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The prompt of an episode whose `reset` failed.
pub const FAILED_PROMPT: &str = "(the environment process failed)\n";

/// The `process` settings of an experiment file:
/// `environment: Process(command: ["python3", "env.py"], difficulty: [0.2, 0.2])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessSpec {
    /// The program and its arguments, run without a shell.
    pub command: Vec<String>,
    /// The child's working directory (empty: the current directory).
    pub cwd: String,
    /// Starting difficulty of every task slot, one value in `[0, 1]` per dimension the
    /// child describes (checked when the environment is built).
    pub difficulty: Vec<f64>,
    /// Child processes run side by side.
    pub children: usize,
    /// How long one call may wait for its reply, in seconds.
    pub timeout_s: f64,
    /// The longest reply line, in KiB.
    pub max_line_kib: usize,
    /// Failed calls in a row that stop the run.
    pub max_failures: usize,
    /// The largest fraction of failed calls among the last `failure_window` outcomes
    /// (successful steps and failed calls) before the run stops; 1 turns the bound off.
    #[serde(skip_serializing_if = "is_default_rate")]
    pub max_failure_rate: f64,
    /// How many recent outcomes `max_failure_rate` is taken over.
    #[serde(skip_serializing_if = "is_default_window")]
    pub failure_window: usize,
}

/// The default `max_failure_rate`.
const DEFAULT_FAILURE_RATE: f64 = 0.25;
/// The default `failure_window`.
const DEFAULT_FAILURE_WINDOW: usize = 20;

// Left out of a resolved experiment at their defaults, so that files and warm-start keys
// written before these fields existed stay the same.
fn is_default_rate(r: &f64) -> bool {
    *r == DEFAULT_FAILURE_RATE
}

fn is_default_window(w: &usize) -> bool {
    *w == DEFAULT_FAILURE_WINDOW
}

impl Default for ProcessSpec {
    fn default() -> Self {
        Self {
            command: Vec::new(),
            cwd: String::new(),
            difficulty: Vec::new(),
            children: 2,
            timeout_s: 30.0,
            max_line_kib: 1024,
            max_failures: 3,
            max_failure_rate: DEFAULT_FAILURE_RATE,
            failure_window: DEFAULT_FAILURE_WINDOW,
        }
    }
}

/// Longest command element, in characters.
const MAX_ARG_CHARS: usize = 4096;

impl ProcessSpec {
    fn launch(&self) -> Launch {
        Launch {
            command: self.command.clone(),
            cwd: (!self.cwd.is_empty()).then(|| PathBuf::from(&self.cwd)),
            limits: Limits {
                timeout: Duration::from_secs_f64(self.timeout_s.clamp(0.001, 86_400.0)),
                max_line_bytes: self.max_line_kib.saturating_mul(1024),
            },
        }
    }

    /// The environment, or why its first child did not start and describe itself.
    pub fn try_build(&self) -> Result<ProcessEnv, child::ProcessError> {
        let tolerance = pool::Tolerance {
            max_failures: self.max_failures,
            max_rate: self.max_failure_rate,
            window: self.failure_window,
        };
        let pool = Pool::start(self.launch(), self.children, tolerance)?;
        Ok(ProcessEnv {
            pool: Ok(Arc::new(pool)),
        })
    }
}

impl EnvironmentPlugin for ProcessSpec {
    fn validate(&self) -> Checked {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(FieldError::new(
                "command",
                "give the program and its arguments, e.g. [\"python3\", \"environments/process/reference.py\"]",
            ));
        }
        check::count("command", self.command.len(), 1, 256)?;
        if let Some(a) = self
            .command
            .iter()
            .find(|a| a.len() > MAX_ARG_CHARS || a.contains('\0'))
        {
            return Err(FieldError::new(
                "command",
                format!(
                    "an argument is longer than {MAX_ARG_CHARS} characters or holds a NUL: {:.40}…",
                    a
                ),
            ));
        }
        check::count("difficulty", self.difficulty.len(), 1, reply::MAX_DIMS)?;
        if let Some(x) = self.difficulty.iter().find(|x| !(0.0..=1.0).contains(*x)) {
            return Err(FieldError::new(
                "difficulty",
                format!("{x} is outside [0, 1]"),
            ));
        }
        check::count("children", self.children, 1, 64)?;
        check::positive("timeout_s", self.timeout_s, 86_400.0)?;
        check::count("max_line_kib", self.max_line_kib, 1, 1 << 20)?;
        check::count("max_failures", self.max_failures, 1, 1_000_000)?;
        if !(0.0..=1.0).contains(&self.max_failure_rate) {
            return Err(FieldError::new(
                "max_failure_rate",
                format!(
                    "{} is outside [0, 1] (1 turns the bound off)",
                    self.max_failure_rate
                ),
            ));
        }
        check::count("failure_window", self.failure_window, 1, 1_000_000)
    }

    fn start_difficulty(&self) -> Difficulty {
        self.difficulty.clone()
    }

    /// Starts the first child; an environment that could not start is returned faulted
    /// (its [`Environment::fault`] says why, and it has no dimensions).
    fn build(&self) -> Box<dyn Environment> {
        match self.try_build() {
            Ok(env) => Box::new(env),
            Err(e) => Box::new(ProcessEnv {
                pool: Err(e.to_string()),
            }),
        }
    }
}

/// The environment: a pool of children (or why there is none).
#[derive(Debug)]
pub struct ProcessEnv {
    pool: Result<Arc<Pool>, String>,
}

fn split_name(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Eval => "eval",
        Split::Ood => "ood",
    }
}

/// A JSON body of `(key, value)` pairs.
fn body<const N: usize>(fields: [(&str, Value); N]) -> Map<String, Value> {
    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

impl ProcessEnv {
    /// The child's name and version (`hello`).
    pub fn name(&self) -> Option<(String, Option<String>)> {
        let p = self.pool.as_ref().ok()?;
        Some((p.describe().name.clone(), p.describe().version.clone()))
    }

    /// Failed calls so far (each failed one episode).
    pub fn failed_calls(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.failed_calls())
    }

    /// Like [`Environment::sample`], with the reason when the episode failed at `reset`.
    pub fn try_sample(&self, d: &[f64], split: Split, seed: u64) -> Result<ProcessEpisode, String> {
        let pool = self.pool.as_ref().map_err(Clone::clone)?;
        let started = self.start_reset(pool, d, split, seed);
        Self::finish_reset(pool, started)
    }

    /// Sends the `reset` of one task to the next child: `(slot, episode id, the request)`.
    fn start_reset(
        &self,
        pool: &Pool,
        d: &[f64],
        split: Split,
        seed: u64,
    ) -> (usize, u64, Result<Sent, String>) {
        let (slot, id) = pool.assign();
        let dims = pool.describe().dims.len();
        let d: Vec<f64> = (0..dims)
            .map(|i| {
                d.get(i)
                    .copied()
                    .filter(|x| !x.is_nan())
                    .unwrap_or(0.0)
                    .clamp(0.0, 1.0)
            })
            .collect();
        let req = body([
            ("episode", id.into()),
            ("difficulty", d.into()),
            ("split", split_name(split).into()),
            ("seed", seed.into()),
        ]);
        let sent = pool
            .submit(slot, None, "reset", req)
            .map_err(|CallFailed(e)| e);
        (slot, id, sent)
    }

    /// The episode a [`Self::start_reset`] started.
    fn finish_reset(
        pool: &Arc<Pool>,
        started: (usize, u64, Result<Sent, String>),
    ) -> Result<ProcessEpisode, String> {
        let result = Self::read_reset(pool, started);
        if result.is_err() {
            pool.episode_failed();
        }
        result
    }

    fn read_reset(
        pool: &Arc<Pool>,
        (slot, id, sent): (usize, u64, Result<Sent, String>),
    ) -> Result<ProcessEpisode, String> {
        let sent = sent?;
        let r = pool
            .collect(slot, sent, "reset")
            .map_err(|CallFailed(e)| e)?;
        let reset = reply::Reset::read(&r)
            .map_err(|why| pool.bad_reply(slot, sent.generation, "reset", why).0)?;
        Ok(ProcessEpisode {
            pool: Some(Arc::clone(pool)),
            slot,
            generation: sent.generation,
            id,
            key: reset.key.unwrap_or_else(|| reset.prompt.clone()),
            prompt: reset.prompt,
            instructions: reset.instructions,
            pending: None,
            done: false,
            won: false,
            error: None,
        })
    }

    /// Like [`Environment::demonstration`], with the reason when it failed.
    pub fn try_demonstration(
        &self,
        d: &[f64],
        noise: f64,
        seed: u64,
    ) -> Result<(String, Vec<String>), String> {
        let prompt = self.try_sample(d, Split::Train, seed)?.prompt.clone();
        let pool = self.pool.as_ref().map_err(Clone::clone)?;
        let dims = pool.describe().dims.len();
        let d: Vec<f64> = (0..dims)
            .map(|i| d.get(i).copied().unwrap_or(0.0).clamp(0.0, 1.0))
            .collect();
        let (slot, _) = pool.assign();
        let req = body([
            ("difficulty", d.into()),
            ("noise", noise.into()),
            ("seed", seed.into()),
        ]);
        let (r, generation) = pool
            .call(slot, None, "demo", req)
            .map_err(|CallFailed(e)| e)?;
        let actions =
            reply::demo(&r).map_err(|why| pool.bad_reply(slot, generation, "demo", why).0)?;
        Ok((prompt, actions))
    }
}

impl Environment for ProcessEnv {
    fn difficulty_space(&self) -> Vec<Dim> {
        self.pool
            .as_ref()
            .map_or_else(|_| Vec::new(), |p| p.describe().dims.clone())
    }

    fn sample(&self, d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        match self.try_sample(d, split, seed) {
            Ok(ep) => Box::new(ep),
            Err(e) => Box::new(ProcessEpisode::failed(e)),
        }
    }

    /// Every `reset` is sent before any reply is awaited: the children work in parallel.
    fn sample_many(&self, tasks: &[(Difficulty, Split, u64)]) -> Vec<Box<dyn Episode>> {
        let pool = match &self.pool {
            Ok(p) => p,
            Err(e) => {
                return tasks
                    .iter()
                    .map(|_| Box::new(ProcessEpisode::failed(e.clone())) as Box<dyn Episode>)
                    .collect();
            }
        };
        let started: Vec<_> = tasks
            .iter()
            .map(|(d, split, seed)| self.start_reset(pool, d, *split, *seed))
            .collect();
        started
            .into_iter()
            .map(|s| match Self::finish_reset(pool, s) {
                Ok(ep) => Box::new(ep) as Box<dyn Episode>,
                Err(e) => Box::new(ProcessEpisode::failed(e)),
            })
            .collect()
    }

    /// The child's `demo`; empty (no actions, the failed prompt) when a call failed.
    fn demonstration(&self, d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        self.try_demonstration(d, noise, seed)
            .unwrap_or_else(|_| (FAILED_PROMPT.to_owned(), Vec::new()))
    }

    fn eval_levels(&self) -> Vec<f64> {
        self.pool.as_ref().map_or_else(
            |_| vec![0.0, 0.25, 0.5, 0.75, 1.0],
            |p| p.describe().eval_levels.clone(),
        )
    }

    /// `name version` from `hello` (the version is optional).
    fn identity(&self) -> Option<String> {
        self.name().map(|(name, version)| match version {
            Some(v) => format!("{name} {v}"),
            None => name,
        })
    }

    fn fault(&self) -> Option<String> {
        match &self.pool {
            Ok(p) => p.fault(),
            Err(e) => Some(e.clone()),
        }
    }

    fn health(&self) -> Option<rlany_contract::EnvHealth> {
        Some(
            self.pool
                .as_ref()
                .map_or_else(|_| rlany_contract::EnvHealth::default(), |p| p.health()),
        )
    }
}

/// One episode living in a child.
#[derive(Debug)]
pub struct ProcessEpisode {
    pool: Option<Arc<Pool>>,
    slot: usize,
    generation: u64,
    id: u64,
    prompt: String,
    instructions: Option<String>,
    key: String,
    /// A `step` sent by [`Episode::submit`]: its action and the request.
    pending: Option<(String, Result<Sent, String>)>,
    done: bool,
    won: bool,
    error: Option<String>,
}

impl ProcessEpisode {
    /// An episode that is over before it began (its `reset` failed).
    fn failed(error: String) -> Self {
        Self {
            pool: None,
            slot: 0,
            generation: 0,
            id: 0,
            prompt: FAILED_PROMPT.to_owned(),
            instructions: None,
            key: FAILED_PROMPT.to_owned(),
            pending: None,
            done: true,
            won: false,
            error: Some(error),
        }
    }

    /// Why the episode failed, if it did.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn send_step(&self, pool: &Pool, action: &str) -> Result<Sent, String> {
        let req = body([("episode", self.id.into()), ("action", action.into())]);
        pool.submit(self.slot, Some(self.generation), "step", req)
            .map_err(|CallFailed(e)| e)
    }

    /// Like [`Episode::step`], with the reason when the call failed (the episode is then over).
    pub fn try_step(&mut self, action: &str) -> Result<StepResult, String> {
        if self.done {
            return Ok(StepResult::ended());
        }
        let Some(pool) = self.pool.clone() else {
            return Err("the episode has no environment process".into());
        };
        let sent = match self.pending.take() {
            Some((submitted, sent)) if submitted == action => sent,
            Some((submitted, _)) => Err(format!(
                "step({action:?}) after submit({submitted:?}): a step must follow the submit of its own action"
            )),
            None => self.send_step(&pool, action),
        };
        let dims = pool.describe().dims.len();
        let result = sent.and_then(|sent| {
            let r = pool
                .collect(self.slot, sent, "step")
                .map_err(|CallFailed(e)| e)?;
            reply::Step::read(&r, dims)
                .map_err(|why| pool.bad_reply(self.slot, sent.generation, "step", why).0)
        });
        match result {
            Ok(s) => {
                self.won = s.won;
                self.done = s.done || s.won;
                // The child's observation is kept even on the last step (a game's closing
                // message is part of the episode's text).
                Ok(StepResult {
                    observation: s.observation,
                    done: self.done,
                    label: s.label,
                    dims: s.dims,
                    blame: s.blame,
                    kind: s.kind,
                })
            }
            Err(e) => {
                pool.episode_failed();
                self.done = true;
                self.won = false;
                self.error = Some(e.clone());
                Err(e)
            }
        }
    }
}

impl Episode for ProcessEpisode {
    fn prompt(&self) -> String {
        self.prompt.clone()
    }

    fn instructions(&self) -> Option<String> {
        self.instructions.clone()
    }

    /// The child's answer; a failed call ends the episode unsolved with an empty observation.
    fn step(&mut self, action: &str) -> StepResult {
        self.try_step(action)
            .unwrap_or_else(|_| StepResult::ended())
    }

    /// Sends the `step` request; [`Episode::step`] with the same action awaits its reply.
    fn submit(&mut self, action: &str) {
        if self.done || self.pending.is_some() {
            return;
        }
        if let Some(pool) = self.pool.clone() {
            self.pending = Some((action.to_owned(), self.send_step(&pool, action)));
        }
    }

    fn done(&self) -> bool {
        self.done
    }

    fn outcome(&self) -> bool {
        self.won
    }

    fn task_key(&self) -> String {
        self.key.clone()
    }
}

impl Drop for ProcessEpisode {
    fn drop(&mut self) {
        if let (Some(pool), None) = (&self.pool, &self.error) {
            let unanswered = match &self.pending {
                Some((_, Ok(sent))) => Some(*sent),
                _ => None,
            };
            pool.close(self.slot, self.generation, self.id, unanswered);
        }
    }
}

#[cfg(test)]
mod tests;
