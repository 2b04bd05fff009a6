//! The ranks of an MPI job (`mpirun -n N rlany run …`, `srun` under Slurm) as the framework's
//! [`Collective`]: every gather is one `MPI_Allgather` of the lengths and one
//! `MPI_Allgatherv` of the bytes, on one communicator for the whole job.
//!
//! MPI lives on a thread of its own: the training thread hands it each exchange and waits for
//! the answer. The collectives are MPI's blocking ones (Open MPI 4.1's non-blocking
//! collectives measured 9 ms against 0.1 ms for a 0.4 MB all-reduce here), so a watchdog
//! thread (`MPI_THREAD_MULTIPLE`) keeps the deadline (`--peer-timeout`): a rank that hangs
//! cannot hang the others, since at the deadline the job ends with `MPI_Abort` and a message
//! that names the exchange and the rank that kept it from completing. To know who that is,
//! every rank's watchdog sends rank 0, every half second, a note with the number of the last
//! exchange its rank entered (a heartbeat, whatever the training thread does), and rank 0's
//! sends every rank its own (8-byte buffered sends). So rank 0 tells a rank that is alive but
//! never reached the exchange (still computing, or hung outside MPI) from one it has not
//! heard from in the 2 s after the deadline (stopped, frozen, gone). Rank 0's deadline comes
//! first, the others' 4 s later, so the message a user sees is the one that can name the late
//! rank. A rank that dies is the launcher's to report (`mpirun` names the rank and ends the
//! job at once); a rank whose run fails prints its error and aborts the job
//! ([`MpiJob::abort`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::datatype::PartitionMut;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use rlany_framework::{Collective, PlacementError};

/// The tag of the notes (the number of the last exchange a rank entered).
const NOTE: i32 = 7;
/// How often a rank's watchdog sends its note.
const BEAT: Duration = Duration::from_millis(500);
/// How long a watchdog listens for notes after the deadline: a rank not heard from in it is
/// taken for stopped.
const SILENT: Duration = Duration::from_secs(2);
/// How much later than rank 0 the other ranks give up on an exchange (rank 0 has listened
/// and spoken by then).
const GRACE: Duration = Duration::from_secs(4);

/// This process's place in the MPI job, and its exchange.
pub struct MpiJob {
    /// This rank, `0..size`.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// This rank among the ranks on its machine (picks its GPU).
    pub local_rank: usize,
    /// The machine's name as MPI reports it.
    pub host: String,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<JoinHandle<()>>,
}

/// What the training thread asks of the MPI thread.
enum Job {
    Gather {
        mine: Vec<u8>,
        what: String,
        reply: mpsc::Sender<Vec<Vec<u8>>>,
    },
    Sum {
        values: Vec<f32>,
        reply: mpsc::Sender<Vec<f32>>,
    },
    Abort(i32),
}

/// The rank, size, local rank and host the MPI thread reports once MPI is up.
type Started = Result<(usize, usize, usize, String), String>;

impl MpiJob {
    /// Initialises MPI on a thread of its own; every exchange waits at most `timeout`.
    pub fn start(timeout: Duration) -> Result<Self, String> {
        let (started_tx, started_rx) = mpsc::channel::<Started>();
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("mpi".into())
            .spawn(move || serve(&started_tx, jobs_rx, timeout))
            .map_err(|e| format!("starting the MPI thread: {e}"))?;
        let (rank, size, local_rank, host) = started_rx
            .recv()
            .map_err(|_| "the MPI thread stopped while MPI started".to_string())??;
        Ok(Self {
            rank,
            size,
            local_rank,
            host,
            jobs: Mutex::new(Some(jobs_tx)),
            thread: Some(thread),
        })
    }

    fn send(&self, job: Job) -> Result<(), PlacementError> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| PlacementError::Collective("the MPI thread has stopped".into()))
    }

    /// Hands the MPI thread the job `make` builds around a reply channel, and waits for the
    /// reply.
    fn ask<T>(&self, make: impl FnOnce(mpsc::Sender<T>) -> Job) -> Result<T, PlacementError> {
        let (reply, answer) = mpsc::channel();
        self.send(make(reply))?;
        answer
            .recv()
            .map_err(|_| PlacementError::Collective("the MPI thread stopped".into()))
    }

    /// A plain `MPI_Allreduce` sum of `values` (what `rlany bench --exchange` compares the
    /// exact gather with).
    pub fn all_reduce_sum(&self, values: Vec<f32>) -> Result<Vec<f32>, PlacementError> {
        self.ask(|reply| Job::Sum { values, reply })
    }

    /// Ends the whole job (`MPI_Abort` with `code`): the other ranks may be waiting in an
    /// exchange this rank will never enter.
    pub fn abort(&self, code: i32) -> ! {
        let _ = self.send(Job::Abort(code));
        // MPI_Abort ends this process too; should it not, exit anyway.
        std::thread::sleep(Duration::from_secs(30));
        std::process::exit(code)
    }
}

impl Drop for MpiJob {
    /// Closes the exchange: the MPI thread finalises MPI and ends.
    fn drop(&mut self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Collective for MpiJob {
    fn peers(&self) -> usize {
        self.size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_gather(&self, mine: Vec<u8>, what: &str) -> Result<Vec<Vec<u8>>, PlacementError> {
        self.ask(|reply| Job::Gather {
            mine,
            what: what.to_string(),
            reply,
        })
    }
}

/// The MPI thread: initialises MPI, starts the watchdog, serves exchanges until the job's
/// handle is dropped, then stops the watchdog and finalises.
fn serve(started: &mpsc::Sender<Started>, jobs: mpsc::Receiver<Job>, timeout: Duration) {
    let Some((mut universe, level)) = mpi::initialize_with_threading(mpi::Threading::Multiple)
    else {
        let _ = started.send(Err("MPI was initialised already in this process".into()));
        return;
    };
    if level < mpi::Threading::Multiple {
        let _ = started.send(Err(format!(
            "this MPI library gives {level:?} threading, and the exchange's deadline needs \
             MPI_THREAD_MULTIPLE (Open MPI and MPICH have it)"
        )));
        return;
    }
    // The notes go out through a buffer of their own: a send never waits.
    universe.set_buffer_size(1 << 20);
    {
        let world = universe.world();
        let local = world.split_shared(world.rank());
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let shared = Arc::new(Shared {
            entered: AtomicU64::new(0),
            current: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let dog = Watchdog {
            shared: shared.clone(),
            host: host.clone(),
            rank,
            size,
            timeout,
            arrived: vec![0; size],
            heard: vec![Instant::now(); size],
        };
        // Without its watchdog an exchange would have no deadline: MPI does not start.
        let watchdog = match std::thread::Builder::new()
            .name("mpi-watchdog".into())
            .spawn(move || dog.run())
        {
            Ok(w) => w,
            Err(e) => {
                let _ = started.send(Err(format!("starting the MPI watchdog thread: {e}")));
                return;
            }
        };
        let _ = started.send(Ok((rank, size, local.rank() as usize, host)));
        let ex = Exchanges {
            world,
            shared: shared.clone(),
            rank,
            size,
            timeout,
        };
        for job in jobs {
            match job {
                Job::Gather { mine, what, reply } => {
                    let _ = reply.send(ex.gather(&mine, &what));
                }
                Job::Sum { values, reply } => {
                    let _ = reply.send(ex.sum(&values));
                }
                Job::Abort(code) => ex.world.abort(code),
            }
        }
        shared.stop.store(true, Ordering::Relaxed);
        let _ = watchdog.join();
    }
    drop(universe);
}

/// What the MPI thread and the watchdog share.
struct Shared {
    /// The exchanges this rank entered.
    entered: AtomicU64,
    /// The exchange under way, if any.
    current: Mutex<Option<Watch>>,
    /// Set when the job's handle is dropped.
    stop: AtomicBool,
}

/// The MPI thread's side: the communicator and the exchanges.
struct Exchanges {
    world: SimpleCommunicator,
    shared: Arc<Shared>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl Exchanges {
    /// Runs `f` as this rank's next exchange, `what`, under the watchdog's deadline.
    fn watched<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        let number = self.shared.entered.fetch_add(1, Ordering::Relaxed) + 1;
        let late = if self.rank == 0 {
            Duration::ZERO
        } else {
            GRACE
        };
        let watch = Watch {
            number,
            what: what.to_string(),
            deadline: Instant::now() + self.timeout + late,
        };
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(watch);
        let out = f();
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        out
    }

    /// Every rank's `mine`, in rank order.
    fn gather(&self, mine: &[u8], what: &str) -> Vec<Vec<u8>> {
        self.watched(what, || {
            let n = mine.len() as u64;
            let mut lens = vec![0u64; self.size];
            self.world.all_gather_into(&n, &mut lens[..]);
            // The bytes travel as 4-byte words, so that MPI's 32-bit counts reach 8 GiB.
            let words = |len: u64| len.div_ceil(4);
            let total: u64 = lens.iter().map(|&l| words(l)).sum();
            let fits = |x: u64| i32::try_from(x).ok();
            let counts: Option<Vec<i32>> = lens.iter().map(|&l| fits(words(l))).collect();
            let displs: Option<Vec<i32>> = lens
                .iter()
                .scan(0u64, |at, &l| {
                    let d = *at;
                    *at += words(l);
                    Some(fits(d))
                })
                .collect();
            let (Some(counts), Some(displs)) = (counts, displs) else {
                eprintln!(
                    "error: rank {} of {}: the exchange of {what} carries {} bytes, more than \
                     one MPI call takes (8 GiB); aborting the job",
                    self.rank,
                    self.size,
                    4 * total
                );
                self.world.abort(1)
            };
            let mut send = Vec::with_capacity(words(n) as usize);
            let whole = mine.chunks_exact(4);
            let tail = whole.remainder();
            send.extend(whole.map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
            if !tail.is_empty() {
                let mut four = [0u8; 4];
                four[..tail.len()].copy_from_slice(tail);
                send.push(u32::from_le_bytes(four));
            }
            let mut recv = vec![0u32; total as usize];
            {
                let mut part = PartitionMut::new(&mut recv[..], counts, &displs[..]);
                self.world.all_gather_varcount_into(&send[..], &mut part);
            }
            let mut at = 0usize;
            lens.iter()
                .map(|&l| {
                    let w = words(l) as usize;
                    let mut bytes = Vec::with_capacity(4 * w);
                    for x in &recv[at..at + w] {
                        bytes.extend_from_slice(&x.to_le_bytes());
                    }
                    bytes.truncate(l as usize);
                    at += w;
                    bytes
                })
                .collect()
        })
    }

    /// A plain all-reduce sum.
    fn sum(&self, values: &[f32]) -> Vec<f32> {
        self.watched("a plain all-reduce", || {
            let mut out = vec![0f32; values.len()];
            self.world.all_reduce_into(
                values,
                &mut out[..],
                mpi::collective::SystemOperation::sum(),
            );
            out
        })
    }
}

/// The watchdog's side: the notes, and the deadline of the exchange under way.
struct Watchdog {
    shared: Arc<Shared>,
    host: String,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// The last exchange each rank is known to have entered (rank 0 hears from all; the
    /// others from rank 0).
    arrived: Vec<u64>,
    /// When each rank's last note came in.
    heard: Vec<Instant>,
}

impl Watchdog {
    /// Until told to stop: a note every `BEAT`, the notes that came in, and the deadline.
    fn run(mut self) {
        let world = SimpleCommunicator::world();
        let mut beat = Instant::now() - BEAT;
        // When the exchange under way passed its deadline.
        let mut verdict: Option<Instant> = None;
        while !self.shared.stop.load(Ordering::Relaxed) {
            if beat.elapsed() >= BEAT {
                self.note(&world);
                beat = Instant::now();
            }
            self.drain(&world);
            let overdue = {
                let current = self
                    .shared
                    .current
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                current
                    .as_ref()
                    .filter(|w| Instant::now() >= w.deadline)
                    .map(|w| (w.number, w.what.clone()))
            };
            match (overdue, verdict) {
                // Overdue: listen for `SILENT` more, then judge who was heard from meanwhile.
                (Some(_), None) => verdict = Some(Instant::now()),
                (Some((number, what)), Some(since)) if since.elapsed() >= SILENT => {
                    let why = self.late(number, since);
                    eprintln!(
                        "error: rank {} of {} ({}): exchange #{number} ({what}) did not \
                         complete within {} s (--peer-timeout): {why}; aborting the job",
                        self.rank,
                        self.size,
                        self.host,
                        self.timeout.as_secs()
                    );
                    world.abort(1);
                }
                (Some(_), Some(_)) => {}
                (None, _) => verdict = None,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends this rank's note: to rank 0, or from rank 0 to every rank.
    fn note(&mut self, world: &SimpleCommunicator) {
        let k = self.shared.entered.load(Ordering::Relaxed);
        self.arrived[self.rank] = k;
        if self.rank == 0 {
            for r in 1..self.size {
                world
                    .process_at_rank(r as i32)
                    .buffered_send_with_tag(&k, NOTE);
            }
        } else {
            world.process_at_rank(0).buffered_send_with_tag(&k, NOTE);
        }
    }

    /// Reads the notes that came in.
    fn drain(&mut self, world: &SimpleCommunicator) {
        while let Some((msg, status)) = world.any_process().immediate_matched_probe_with_tag(NOTE) {
            let (k, _) = msg.matched_receive::<u64>();
            let from = status.source_rank() as usize;
            if let (Some(a), Some(h)) = (self.arrived.get_mut(from), self.heard.get_mut(from)) {
                *a = (*a).max(k);
                *h = Instant::now();
            }
        }
    }

    /// Who kept exchange `k` from completing, as far as this rank knows (rank 0 knows every
    /// rank; the others know rank 0): a rank not heard from since `since` (the deadline) is
    /// taken for stopped.
    fn late(&self, k: u64, since: Instant) -> String {
        let mut why = Vec::new();
        let watched = (0..self.size).filter(|&r| r != self.rank && (self.rank == 0 || r == 0));
        for r in watched {
            if self.heard[r] < since {
                why.push(format!(
                    "rank {r} has not been heard from for {:.0} s (its last exchange was #{}): \
                     its process is stopped, frozen or gone",
                    self.heard[r].elapsed().as_secs_f64(),
                    self.arrived[r]
                ));
            } else if self.arrived[r] < k {
                why.push(format!(
                    "rank {r} is alive but never reached it (its last was #{}): it is still \
                     computing, or hangs outside MPI",
                    self.arrived[r]
                ));
            }
        }
        if why.is_empty() {
            return "every rank this one hears from reached it and is alive, so it stalled \
                    inside MPI (the network failed, or a rank's MPI thread hangs)"
                .into();
        }
        why.join("; ")
    }
}

/// The exchange under way: its number, its name and when to give up on it.
struct Watch {
    number: u64,
    what: String,
    deadline: Instant,
}
