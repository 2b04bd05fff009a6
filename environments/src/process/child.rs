//! One child process speaking the protocol: started without a shell, read with a bounded
//! line length and a per-call timeout, and killed on any failure.
//!
//! A reader thread turns the child's stdout into lines (each at most `max_line_bytes`,
//! checked before the line is complete, so a child that never writes a newline cannot grow
//! memory); a second thread keeps the last [`STDERR_TAIL`] bytes of its stderr for the
//! error message. [`Child::send`] writes one request and returns its `seq`;
//! [`Child::receive`] waits for the reply with that `seq` until the deadline, keeping the
//! replies to other outstanding requests for their own `receive` (so requests to several
//! children can be in flight at once); replies to requests sent with
//! [`Child::send_ignored`] (`close`) are dropped when they arrive.

use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The protocol version this host speaks.
pub const PROTOCOL: u64 = 1;
/// Bytes of the child's stderr kept for error messages.
pub const STDERR_TAIL: usize = 2048;
/// Reply bytes read but not yet received, in units of the line limit: more is a child
/// flooding its stdout.
const QUEUED_LINES: usize = 64;

/// Limits of every call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// How long one call may wait for its reply.
    pub timeout: Duration,
    /// The longest reply line, in bytes (without the newline).
    pub max_line_bytes: usize,
}

/// What went wrong with the child.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    /// The program could not be started.
    #[error("could not be started: {0}")]
    Spawn(String),
    /// No reply within the per-call timeout.
    #[error("sent no reply to `{op}` within {secs} s (the child was killed)")]
    Timeout {
        /// The request's `op`.
        op: String,
        /// The timeout.
        secs: f64,
    },
    /// Its stdout closed (it exited or crashed).
    #[error("exited during `{op}` ({status})")]
    Exited {
        /// The request's `op`.
        op: String,
        /// The exit status, as far as it is known.
        status: String,
    },
    /// A reply line over the limit.
    #[error("wrote a line longer than {limit} bytes during `{op}` (the child was killed)")]
    Oversized {
        /// The request's `op`.
        op: String,
        /// The limit.
        limit: usize,
    },
    /// More unread output than any outstanding requests explain.
    #[error(
        "wrote more than {limit} bytes that were not asked for during `{op}` (the child was killed)"
    )]
    Flood {
        /// The request's `op`.
        op: String,
        /// The limit.
        limit: usize,
    },
    /// A line that is not a reply of this protocol.
    #[error(
        "answered `{op}` with a line that is not a protocol-{PROTOCOL} reply ({why}): {excerpt}"
    )]
    Garbage {
        /// The request's `op`.
        op: String,
        /// What is wrong with it.
        why: String,
        /// The line's first characters.
        excerpt: String,
    },
    /// An `error` reply.
    #[error("answered `{op}` with an error: {message}")]
    Refused {
        /// The request's `op`.
        op: String,
        /// The child's message.
        message: String,
    },
    /// The request could not be written (the child closed its stdin).
    #[error("did not take the `{op}` request: {why}")]
    Write {
        /// The request's `op`.
        op: String,
        /// The I/O error.
        why: String,
    },
}

/// A failed call, naming the command and ending with the child's last stderr lines.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("environment process `{command}` {failure}{}", stderr_note(.stderr))]
pub struct ProcessError {
    /// The command, its arguments joined by spaces.
    pub command: String,
    /// What happened.
    pub failure: Failure,
    /// The end of its stderr (may be empty).
    pub stderr: String,
}

fn stderr_note(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with: {s}")
    }
}

/// The first 120 characters of `bytes`, lossily decoded.
fn excerpt(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(480)]);
    let mut e: String = s.chars().take(120).collect();
    if s.chars().count() > 120 {
        e.push('…');
    }
    e
}

/// Why the reader thread stopped.
enum End {
    Closed,
    Oversized,
    Flood,
}

/// A running child.
pub struct Child {
    command: String,
    process: std::process::Child,
    /// Request lines to the writer thread (which owns the child's stdin: a child that stops
    /// reading never blocks the host).
    stdin: Option<Sender<Vec<u8>>>,
    lines: Receiver<Result<Vec<u8>, End>>,
    /// Bytes the reader thread holds that no `receive` has taken yet.
    queued: Arc<AtomicUsize>,
    stderr: Arc<Mutex<Vec<u8>>>,
    limits: Limits,
    next_seq: u64,
    ignored: HashSet<u64>,
    /// Sent, reply not yet received.
    outstanding: HashSet<u64>,
    /// Replies that arrived while another was awaited.
    arrived: HashMap<u64, Map<String, Value>>,
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Child({})", self.command)
    }
}

impl Child {
    /// Starts `command[0]` with the other elements as its arguments (no shell), in `cwd`
    /// when given.
    pub fn spawn(
        command: &[String],
        cwd: Option<&Path>,
        limits: Limits,
    ) -> Result<Self, ProcessError> {
        let name = command.join(" ");
        let spawn_err = |why: String| ProcessError {
            command: name.clone(),
            failure: Failure::Spawn(why),
            stderr: String::new(),
        };
        let (program, args) = command
            .split_first()
            .ok_or_else(|| spawn_err("the command is empty".into()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let mut process = cmd.spawn().map_err(|e| {
            spawn_err(match cwd {
                Some(d) => format!("{e} (in {})", d.display()),
                None => e.to_string(),
            })
        })?;
        let (stdin, stdout, stderr_pipe) = match (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => {
                let _ = process.kill();
                let _ = process.wait();
                return Err(spawn_err("its pipes could not be opened".into()));
            }
        };
        let (tx, lines) = mpsc::channel();
        let max = limits.max_line_bytes;
        let queued = Arc::new(AtomicUsize::new(0));
        let q = Arc::clone(&queued);
        thread::spawn(move || read_lines(stdout, max, max.saturating_mul(QUEUED_LINES), q, tx));
        let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>();
        thread::spawn(move || write_lines(stdin, stdin_rx));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::clone(&stderr);
        thread::spawn(move || keep_tail(stderr_pipe, tail));
        Ok(Self {
            command: name,
            process,
            stdin: Some(stdin_tx),
            queued,
            lines,
            stderr,
            limits,
            next_seq: 0,
            ignored: HashSet::new(),
            outstanding: HashSet::new(),
            arrived: HashMap::new(),
        })
    }

    /// The command, joined by spaces.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// An error of this child, with its stderr tail.
    fn error(&mut self, failure: Failure) -> ProcessError {
        // Give the stderr thread a moment to read what a dying child wrote last.
        if matches!(failure, Failure::Exited { .. }) {
            thread::sleep(Duration::from_millis(50));
        }
        let stderr = self
            .stderr
            .lock()
            .map(|t| String::from_utf8_lossy(&t).into_owned())
            .unwrap_or_default();
        ProcessError {
            command: self.command.clone(),
            failure,
            stderr,
        }
    }

    /// Writes one request (`op` and `body`, with a fresh `seq`); returns the `seq`.
    fn write(&mut self, op: &str, mut body: Map<String, Value>) -> Result<u64, ProcessError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        body.insert("seq".into(), seq.into());
        body.insert("op".into(), op.into());
        let mut line = Value::Object(body).to_string();
        line.push('\n');
        let result = match self.stdin.as_ref() {
            Some(s) => s
                .send(line.into_bytes())
                .map_err(|_| std::io::Error::other("its stdin is closed")),
            None => Err(std::io::Error::other("its stdin is closed")),
        };
        match result {
            Ok(()) => Ok(seq),
            Err(e) => {
                // A child that closed its stdin usually exited: say so if it did.
                let status = self.status_after(Duration::from_millis(100));
                let failure = match status {
                    Some(s) => Failure::Exited {
                        op: op.into(),
                        status: s.to_string(),
                    },
                    None => Failure::Write {
                        op: op.into(),
                        why: e.to_string(),
                    },
                };
                self.kill();
                Err(self.error(failure))
            }
        }
    }

    /// Sends a request whose reply nobody waits for (it is dropped when it arrives).
    pub fn send_ignored(&mut self, op: &str, body: Map<String, Value>) -> Result<(), ProcessError> {
        let seq = self.write(op, body)?;
        self.ignored.insert(seq);
        Ok(())
    }

    /// Gives up on the reply to request `seq`: it is dropped when it arrives.
    pub fn forget(&mut self, seq: u64) {
        if self.arrived.remove(&seq).is_none() && self.outstanding.remove(&seq) {
            self.ignored.insert(seq);
        }
    }

    /// One request and its reply (without `seq`): [`Self::send`], then [`Self::receive`].
    pub fn call(
        &mut self,
        op: &str,
        body: Map<String, Value>,
    ) -> Result<Map<String, Value>, ProcessError> {
        let seq = self.send(op, body)?;
        self.receive(op, seq)
    }

    /// Writes a request whose reply [`Self::receive`] will wait for; returns its `seq`.
    pub fn send(&mut self, op: &str, body: Map<String, Value>) -> Result<u64, ProcessError> {
        let seq = self.write(op, body)?;
        self.outstanding.insert(seq);
        Ok(seq)
    }

    /// The reply to request `seq` (an `op` request), waiting at most the per-call timeout.
    /// An `error` reply is [`Failure::Refused`]; every other failure kills the child, which
    /// must then be replaced.
    pub fn receive(&mut self, op: &str, seq: u64) -> Result<Map<String, Value>, ProcessError> {
        let refused = |child: &mut Self, reply: Map<String, Value>| match reply.get("error") {
            Some(e) => {
                let message = e.as_str().map_or_else(|| e.to_string(), str::to_owned);
                Err(child.error(Failure::Refused {
                    op: op.into(),
                    message,
                }))
            }
            None => Ok(reply),
        };
        if let Some(reply) = self.arrived.remove(&seq) {
            self.outstanding.remove(&seq);
            return refused(self, reply);
        }
        let deadline = Instant::now() + self.limits.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(Ok(line)) => {
                    self.queued.fetch_sub(line.len(), Ordering::Relaxed);
                    line
                }
                Ok(Err(End::Flood)) => {
                    self.kill();
                    let limit = self.limits.max_line_bytes.saturating_mul(QUEUED_LINES);
                    return Err(self.error(Failure::Flood {
                        op: op.into(),
                        limit,
                    }));
                }
                Ok(Err(End::Oversized)) => {
                    self.kill();
                    let limit = self.limits.max_line_bytes;
                    return Err(self.error(Failure::Oversized {
                        op: op.into(),
                        limit,
                    }));
                }
                Ok(Err(End::Closed)) | Err(RecvTimeoutError::Disconnected) => {
                    let status = self
                        .status_after(Duration::from_millis(500))
                        .map_or("no exit status yet".to_string(), |s| s.to_string());
                    self.kill();
                    return Err(self.error(Failure::Exited {
                        op: op.into(),
                        status,
                    }));
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.kill();
                    let secs = self.limits.timeout.as_secs_f64();
                    return Err(self.error(Failure::Timeout {
                        op: op.into(),
                        secs,
                    }));
                }
            };
            let garbage = |why: &str| Failure::Garbage {
                op: op.into(),
                why: why.into(),
                excerpt: excerpt(&line),
            };
            let mut reply = match serde_json::from_slice::<Value>(&line) {
                Ok(Value::Object(m)) => m,
                Ok(_) => {
                    let f = garbage("not a JSON object");
                    self.kill();
                    return Err(self.error(f));
                }
                Err(e) => {
                    let f = garbage(&format!("not JSON: {e}"));
                    self.kill();
                    return Err(self.error(f));
                }
            };
            let got = reply.remove("seq").and_then(|s| s.as_u64());
            match got {
                Some(s) if s == seq => {
                    self.outstanding.remove(&seq);
                    return refused(self, reply);
                }
                Some(s) if self.ignored.remove(&s) => continue,
                Some(s) if self.outstanding.contains(&s) && !self.arrived.contains_key(&s) => {
                    self.arrived.insert(s, reply);
                    continue;
                }
                _ => {
                    let f = garbage(&format!("its seq is not {seq}, the request's"));
                    self.kill();
                    return Err(self.error(f));
                }
            }
        }
    }

    /// The exit status if the child ends within `wait`.
    fn status_after(&mut self, wait: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + wait;
        loop {
            match self.process.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }

    /// Kills the child and reaps it.
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for Child {
    /// Closes its stdin (a well-behaved child exits at end of input), waits briefly, then
    /// kills it.
    fn drop(&mut self) {
        self.stdin = None;
        if self.status_after(Duration::from_millis(200)).is_none() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// The writer thread: request lines to the child's stdin until either side closes.
fn write_lines(mut stdin: ChildStdin, rx: Receiver<Vec<u8>>) {
    while let Ok(line) = rx.recv() {
        if stdin.write_all(&line).and_then(|_| stdin.flush()).is_err() {
            return;
        }
    }
}

/// The reader thread: lines of at most `max` bytes to `tx`, at most `cap` bytes not yet
/// received (`queued`), then why it stopped.
fn read_lines(
    stdout: impl Read,
    max: usize,
    cap: usize,
    queued: Arc<AtomicUsize>,
    tx: Sender<Result<Vec<u8>, End>>,
) {
    let mut r = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        let buf = match r.fill_buf() {
            Ok(b) if !b.is_empty() => b,
            _ => {
                let _ = tx.send(Err(End::Closed));
                return;
            }
        };
        let (chunk, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + chunk > max {
            let _ = tx.send(Err(End::Oversized));
            return;
        }
        line.extend_from_slice(&buf[..chunk]);
        r.consume(chunk + usize::from(complete));
        if complete {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if queued.fetch_add(line.len(), Ordering::Relaxed) + line.len() > cap {
                let _ = tx.send(Err(End::Flood));
                return;
            }
            if tx.send(Ok(std::mem::take(&mut line))).is_err() {
                return;
            }
        }
    }
}

/// The stderr thread: keeps the last [`STDERR_TAIL`] bytes.
fn keep_tail(mut stderr: impl Read, tail: Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf) {
        if n == 0 {
            return;
        }
        let Ok(mut t) = tail.lock() else { return };
        t.extend_from_slice(&buf[..n]);
        let excess = t.len().saturating_sub(STDERR_TAIL);
        t.drain(..excess);
    }
}
