//! The ranks of an MPI job (`mpirun -n N rlany run …`, `srun` under Slurm) as the framework's
//! [`Collective`]: every gather is one `MPI_Allgather` of the lengths and one
//! `MPI_Allgatherv` of the bytes, on one communicator for the whole job.
//!
//! MPI lives on a thread of its own (`MPI_THREAD_FUNNELED`): the training thread hands it each
//! exchange and waits for the answer. The thread runs the collectives non-blocking and polls
//! them against the deadline (`--peer-timeout`), so that a rank that hangs cannot hang the
//! others: at the deadline the job ends with `MPI_Abort`, and the message names the exchange
//! and the rank that kept it from completing. To know who that is, every rank sends rank 0 a
//! note with the number of the last exchange it entered, on entering each and every half
//! second besides (a heartbeat, from this thread, whatever the training thread does), and
//! rank 0 sends every rank its own (8-byte buffered sends, read back while waiting). So rank 0
//! tells a rank that is alive but never reached the exchange (still computing, or hung outside
//! MPI) from one it has not heard from (stopped, frozen, gone). Rank 0's deadline comes first,
//! the others' 2 s later, so the message a user sees is the one that can name the late rank. A rank that dies is the
//! launcher's to report (`mpirun` names the rank and ends the job at once); a rank whose run
//! fails prints its error and aborts the job ([`MpiJob::abort`]).

use std::sync::Mutex;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::datatype::PartitionMut;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use rlany_framework::{Collective, PlacementError};

/// The tag of the notes (the number of the last exchange a rank entered).
const NOTE: i32 = 7;
/// How often a rank sends its note when it has nothing else to say.
const BEAT: Duration = Duration::from_millis(500);
/// A rank not heard from for this long is taken for stopped.
const SILENT: Duration = Duration::from_secs(2);
/// How much later than rank 0 the other ranks give up on an exchange.
const GRACE: Duration = Duration::from_secs(2);

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

    /// A plain `MPI_Allreduce` sum of `values` (what `rlany bench --exchange` compares the
    /// exact gather with).
    pub fn all_reduce_sum(&self, values: Vec<f32>) -> Result<Vec<f32>, PlacementError> {
        let (reply, answer) = mpsc::channel();
        self.send(Job::Sum { values, reply })?;
        answer
            .recv()
            .map_err(|_| PlacementError::Collective("the MPI thread stopped".into()))
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
        let (reply, answer) = mpsc::channel();
        self.send(Job::Gather {
            mine,
            what: what.to_string(),
            reply,
        })?;
        answer
            .recv()
            .map_err(|_| PlacementError::Collective("the MPI thread stopped".into()))
    }
}

/// The MPI thread: initialises MPI, serves exchanges until the job's handle is dropped, then
/// finalises.
fn serve(started: &mpsc::Sender<Started>, jobs: mpsc::Receiver<Job>, timeout: Duration) {
    let Some((mut universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        let _ = started.send(Err("MPI was initialised already in this process".into()));
        return;
    };
    // The arrival notes go out through a buffer of their own: a send never waits.
    universe.set_buffer_size(1 << 20);
    {
        let world = universe.world();
        let local = world.split_shared(world.rank());
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let _ = started.send(Ok((rank, size, local.rank() as usize, host.clone())));
        let now = Instant::now();
        let mut ex = Exchanges {
            world,
            host,
            rank,
            size,
            timeout,
            entered: 0,
            arrived: vec![0; size],
            heard: vec![now; size],
            beat: now,
        };
        loop {
            let job = match jobs.recv_timeout(BEAT) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    ex.beat();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
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
    }
    drop(universe);
}

/// The MPI thread's state: the communicator and who reached which exchange.
struct Exchanges {
    world: SimpleCommunicator,
    host: String,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// The exchanges this rank entered.
    entered: u64,
    /// The last exchange each rank is known to have entered (rank 0 hears from all; the
    /// others from rank 0).
    arrived: Vec<u64>,
    /// When each rank's last note came in.
    heard: Vec<Instant>,
    /// When this rank last sent its note.
    beat: Instant,
}

impl Exchanges {
    /// Sends this rank's note: to rank 0, or from rank 0 to every rank.
    fn note(&mut self) {
        let k = self.entered;
        if self.rank == 0 {
            for r in 1..self.size {
                self.world
                    .process_at_rank(r as i32)
                    .buffered_send_with_tag(&k, NOTE);
            }
        } else {
            self.world
                .process_at_rank(0)
                .buffered_send_with_tag(&k, NOTE);
        }
        self.beat = Instant::now();
    }

    /// The heartbeat: the note again once `BEAT` has passed, and the notes that came in.
    fn beat(&mut self) {
        if self.beat.elapsed() >= BEAT {
            self.note();
        }
        self.drain();
    }

    /// Notes that this rank enters its next exchange, and when to give up on it.
    fn enter(&mut self, what: &str) -> Watch {
        self.entered += 1;
        self.arrived[self.rank] = self.entered;
        self.note();
        let late = if self.rank == 0 {
            Duration::ZERO
        } else {
            GRACE
        };
        Watch {
            number: self.entered,
            what: what.to_string(),
            deadline: Instant::now() + self.timeout + late,
        }
    }

    /// Reads the notes that came in.
    fn drain(&mut self) {
        while let Some((msg, status)) = self
            .world
            .any_process()
            .immediate_matched_probe_with_tag(NOTE)
        {
            let (k, _) = msg.matched_receive::<u64>();
            let from = status.source_rank() as usize;
            if let (Some(a), Some(h)) = (self.arrived.get_mut(from), self.heard.get_mut(from)) {
                *a = (*a).max(k);
                *h = Instant::now();
            }
        }
    }

    /// Every rank's `mine`, in rank order.
    fn gather(&mut self, mine: &[u8], what: &str) -> Vec<Vec<u8>> {
        let watch = self.enter(what);
        let n = mine.len() as u64;
        let mut lens = vec![0u64; self.size];
        mpi::request::scope(|scope| {
            let req = self
                .world
                .immediate_all_gather_into(scope, &n, &mut lens[..]);
            self.wait(req, &watch);
        });
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
            self.fail(&format!(
                "exchange #{} ({}) carries {} bytes, more than one MPI call takes (8 GiB)",
                watch.number,
                watch.what,
                4 * total
            ))
        };
        let mut send = vec![0u32; words(n) as usize];
        for (w, b) in send.iter_mut().zip(mine.chunks(4)) {
            let mut four = [0u8; 4];
            four[..b.len()].copy_from_slice(b);
            *w = u32::from_le_bytes(four);
        }
        let mut recv = vec![0u32; total as usize];
        let mut part = PartitionMut::new(&mut recv[..], counts, &displs[..]);
        mpi::request::scope(|scope| {
            let req = self
                .world
                .immediate_all_gather_varcount_into(scope, &send[..], &mut part);
            self.wait(req, &watch);
        });
        drop(part);
        let mut at = 0usize;
        lens.iter()
            .map(|&l| {
                let w = words(l) as usize;
                let mut bytes: Vec<u8> = recv[at..at + w]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                bytes.truncate(l as usize);
                at += w;
                bytes
            })
            .collect()
    }

    /// A plain all-reduce sum.
    fn sum(&mut self, values: &[f32]) -> Vec<f32> {
        let watch = self.enter("a plain all-reduce");
        let mut out = vec![0f32; values.len()];
        mpi::request::scope(|scope| {
            let req = self.world.immediate_all_reduce_into(
                scope,
                values,
                &mut out[..],
                mpi::collective::SystemOperation::sum(),
            );
            self.wait(req, &watch);
        });
        out
    }

    /// Polls `req` to completion; at the watch's deadline, names the late ranks and aborts.
    fn wait<'a, R: ?Sized, S: Scope<'a>>(&mut self, mut req: Request<'a, R, S>, watch: &Watch) {
        let mut tries = 0u32;
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            tries += 1;
            if tries < 200 {
                std::thread::yield_now();
                continue;
            }
            if Instant::now() >= watch.deadline {
                self.drain();
                let why = self.late(watch.number);
                self.fail(&format!(
                    "exchange #{} ({}) did not complete within {} s (--peer-timeout): {why}",
                    watch.number,
                    watch.what,
                    self.timeout.as_secs()
                ));
            }
            if tries % 64 == 0 {
                self.beat();
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Who kept exchange `k` from completing, as far as this rank knows (rank 0 knows every
    /// rank; the others know rank 0).
    fn late(&self, k: u64) -> String {
        let mut why = Vec::new();
        let watched = (0..self.size).filter(|&r| r != self.rank && (self.rank == 0 || r == 0));
        for r in watched {
            let silent = self.heard[r].elapsed();
            if silent >= SILENT {
                why.push(format!(
                    "rank {r} has not been heard from for {:.0} s (its last exchange was #{}): \
                     its process is stopped, frozen or gone",
                    silent.as_secs_f64(),
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

    /// Prints why this rank gives up and ends the job.
    fn fail(&self, why: &str) -> ! {
        eprintln!(
            "error: rank {} of {} ({}): {why}; aborting the job",
            self.rank, self.size, self.host
        );
        self.world.abort(1)
    }
}

/// The exchange under way: its number, its name and when to give up on it.
struct Watch {
    number: u64,
    what: String,
    deadline: Instant,
}
