//! `rlany run --peers N` and `--nodes N --node-rank R --coordinator HOST:PORT`: one run spread
//! over several replicas, joined by burn-collective (its all-reduce is the framework's
//! [`Collective`]). Local peers are threads of this process, each with its own replica (on
//! CUDA, peer `i` on `cuda:<index + i>`); nodes are processes, on this machine or others,
//! that meet at the coordinator (burn-collective's global orchestrator, which node 0 starts).
//!
//! Placement is a launch choice, never part of the experiment: `shards` fixes the numbers,
//! and every placement of the same shards gives the same metrics (framework/METHOD.md,
//! "Placement"). Every exchange has a deadline (`--peer-timeout`): a peer that dies, stalls
//! or never arrives makes the others stop with an error naming what is known, never hang.
//!
//! # One session per exchange over several nodes
//!
//! burn-collective 0.21's multi-node all-reduce finishes its first call and never its
//! second: its node sync (global/node/sync.rs) clears a *copy* of its list of synced nodes,
//! so from the second call on the list never equals the set of nodes. A registration builds
//! that list afresh, so over several nodes every exchange is a session of its own: register,
//! all-reduce once, finish. Sessions alternate between two coordinators (node 0 runs both,
//! on the coordinator's port and the next) and two tensor-service ports per node, so that a
//! node already registering for exchange `k + 1` never meets a coordinator or a port that
//! another node is still leaving from exchange `k`: it reaches `k + 1` only after every node
//! has entered `k`, that is has left `k − 1`, the session on the same coordinator. The local
//! peers of a node leave a session together before any of them registers again (a barrier).

use crate::UsageError;
use anyhow::Result;
use rlany_framework::TrainOptions;

/// Where the peers of a run are (`rlany run`'s placement options).
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Peers in this process: replicas on threads of their own (on CUDA, peer i uses
    /// cuda:<index + i> unless --devices says otherwise). The experiment's `shards` must be
    /// at least the number of peers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub peers: u32,
    /// The backend and device of each local peer, in order (e.g. cuda:0,cuda:0 for two peers
    /// on one GPU); as many as --peers.
    #[arg(long, value_delimiter = ',', value_name = "BACKEND,...")]
    pub devices: Vec<String>,
    /// Processes (nodes) in the run, each with `--peers` peers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nodes: u32,
    /// This node's rank, 0..nodes; node 0 runs the coordinator and writes the run directory.
    #[arg(long, default_value_t = 0)]
    pub node_rank: u32,
    /// HOST:PORT where the nodes meet (node 0 listens on PORT and PORT + 1).
    #[arg(long, value_name = "HOST:PORT")]
    pub coordinator: Option<String>,
    /// HOST:PORT at which the other nodes reach this one's tensor service, on PORT and
    /// PORT + 1 (default 127.0.0.1:<coordinator port + 2 + 2 × node rank>: right for nodes
    /// on one machine).
    #[arg(long, value_name = "HOST:PORT")]
    pub node_address: Option<String>,
    /// Seconds any exchange (or the meeting at the start) may wait for the other peers.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub peer_timeout: u64,
}

impl PlacementArgs {
    /// Whether these options spread the run over more than one peer.
    pub fn is_spread(&self) -> bool {
        self.peers * self.nodes > 1 || self.coordinator.is_some() || !self.devices.is_empty()
    }

    /// Every inconsistency between the options and with the experiment, as a usage error.
    fn validate(&self, shards: usize) -> Result<(), UsageError> {
        let total = (self.peers * self.nodes) as usize;
        if self.node_rank >= self.nodes {
            return Err(UsageError(format!(
                "--node-rank {} is not below --nodes {}",
                self.node_rank, self.nodes
            )));
        }
        if !self.devices.is_empty() && self.devices.len() != self.peers as usize {
            return Err(UsageError(format!(
                "--devices names {} devices for --peers {}: give one per peer",
                self.devices.len(),
                self.peers
            )));
        }
        if self.nodes > 1 && self.coordinator.is_none() {
            return Err(UsageError(
                "--nodes > 1 needs --coordinator HOST:PORT (where the nodes meet)".into(),
            ));
        }
        if total > shards {
            return Err(UsageError(format!(
                "a placement of {total} peers needs the experiment's shards ≥ {total} (it has \
                 shards: {shards}); add --set shards={total}, and compare it with runs at the \
                 same shards, since shards change the numbers and placements do not"
            )));
        }
        Ok(())
    }
}

/// Trains every seed with the run spread as `args` say; `opts(seed)` gives the options a run
/// alone would have. Peer 0 (node 0's first) writes the run directory and prints the summary.
pub fn run_spread(
    exp: &crate::Experiment,
    seeds: &[u64],
    args: &PlacementArgs,
    opts: &(dyn Fn(u64) -> TrainOptions + Sync),
) -> Result<()> {
    // Without the distributed build, say so first: no setting can make the run possible.
    if cfg!(not(feature = "distributed")) {
        return imp::run_spread(exp, seeds, args, &[], opts);
    }
    args.validate(exp.shards)?;
    let devices = args
        .devices
        .iter()
        .map(|d| crate::parse_backend(d))
        .collect::<Result<Vec<_>>>()?;
    imp::run_spread(exp, seeds, args, &devices, opts)
}

/// What `rlany bench --exchange` measures.
#[derive(Debug, Clone)]
pub struct ExchangeBench {
    /// Local peers.
    pub peers: usize,
    /// Buffer sizes, in f32 values.
    pub sizes: Vec<usize>,
    /// Timed repetitions (the median is reported).
    pub reps: usize,
    /// An exchange whose buffer on one peer passes this many bytes is skipped.
    pub max_buffer_bytes: usize,
    /// Also write the results as JSON here.
    pub json: Option<std::path::PathBuf>,
}

/// `rlany bench --exchange`: for each size, the median time of a plain all-reduce of that
/// many values and of the exact gather a spread run uses (each peer's values in its own slot),
/// between local peers of this process; printed as a table (and written as JSON).
pub fn bench_exchange(b: &ExchangeBench) -> Result<()> {
    if b.peers < 2 {
        return Err(UsageError("rlany bench --exchange: --peers must be at least 2".into()).into());
    }
    imp::bench_exchange(b)
}

#[cfg(not(feature = "distributed"))]
mod imp {
    use super::*;

    pub fn bench_exchange(_: &ExchangeBench) -> Result<()> {
        Err(UsageError(
            "rlany bench --exchange needs the distributed build: \
             cargo build --release --features distributed"
                .into(),
        )
        .into())
    }

    pub fn run_spread(
        _: &crate::Experiment,
        _: &[u64],
        _: &PlacementArgs,
        _: &[rlany_framework::BackendKind],
        _: &(dyn Fn(u64) -> TrainOptions + Sync),
    ) -> Result<()> {
        Err(UsageError(
            "--peers/--nodes/--coordinator need the distributed build: \
             cargo build --release --features distributed"
                .into(),
        )
        .into())
    }
}

#[cfg(feature = "distributed")]
mod imp {
    use super::*;
    use anyhow::Context;
    use burn::prelude::*;
    use burn::tensor::TensorPrimitive;
    use burn_collective::{CollectiveConfig, PeerId, ReduceOperation};
    use burn_communication::Address;
    use rlany_framework::{BackendKind, Collective, Placement, PlacementError, RunSummary};
    use std::path::Path;
    use std::str::FromStr;
    use std::sync::mpsc::{self, RecvTimeoutError};
    use std::sync::{Arc, Barrier, Mutex};
    use std::time::{Duration, Instant};

    /// The backend the exchanges run on: host memory, whatever the run's backend.
    type Wire = burn::backend::NdArray<f32>;

    /// What the local peers of this process know of each other's failures.
    #[derive(Default)]
    pub(super) struct Board(Mutex<Option<String>>);

    impl Board {
        pub(super) fn fail(&self, message: String) {
            if let Ok(mut b) = self.0.lock()
                && b.is_none()
            {
                *b = Some(message);
            }
        }
        fn failure(&self) -> Option<String> {
            self.0.lock().ok().and_then(|b| b.clone())
        }
    }

    /// One peer's burn-collective endpoint.
    pub(super) struct Peer {
        rank: usize,
        peers: usize,
        timeout: Duration,
        board: Arc<Board>,
        /// Who the others are, for errors ("node 1", "nodes 1–3 or another peer of this one").
        others: String,
        /// Over several nodes: one session per exchange (see the module's documentation).
        sessions: Option<Sessions>,
    }

    /// What a peer over several nodes needs to open a session per exchange.
    pub(super) struct Sessions {
        /// The registrations of even and of odd sessions (their coordinator and ports).
        configs: [CollectiveConfig; 2],
        /// This node's tensor-service ports in even and odd sessions.
        ports: [u16; 2],
        /// On the node's first local peer: the id of the node's herald (it opens sessions).
        herald: Option<PeerId>,
        /// Sessions opened so far (the meeting at the start is session 0).
        opened: Mutex<u64>,
        /// The local peers of this node and its herald, who leave a session together.
        left: Arc<Barrier>,
        /// Nodes in the run: burn-collective's ring all-reduce needs as many values.
        nodes: usize,
    }

    /// One exchange over several nodes, a burn-collective session of its own.
    ///
    /// burn-collective starts a node's tensor service when the node's first local peer
    /// registers, on a task of its own, and the other nodes download from it as soon as the
    /// coordinator has every registration: nothing makes them wait for it to listen (measured:
    /// one run in three, two nodes per core, failed to connect). So the node's first
    /// registration is its herald's, an extra local peer that adds zeros; the real peers
    /// register (and so the node's registration reaches the coordinator) only once the
    /// service answers on the loopback. Leaving, the first peer waits until the service has
    /// stopped listening, so that two sessions later the port is the new service's.
    struct Session {
        number: u64,
        config: CollectiveConfig,
        port: u16,
        herald: Option<PeerId>,
        left: Arc<Barrier>,
        deadline: Instant,
        nodes: usize,
    }

    impl Session {
        /// Registers `id`, all-reduces `values` with every peer of every node, and leaves.
        fn run(self, id: PeerId, mut values: Vec<f32>) -> Result<Vec<f32>, String> {
            let number = self.number;
            // The ring splits the values into one slice per node: pad with zeros (exact).
            let n = values.len();
            values.resize(n.max(self.nodes), 0.0);
            if let Some(herald) = self.herald {
                let (config, left, len) = (self.config.clone(), self.left.clone(), values.len());
                std::thread::spawn(move || -> Result<(), String> {
                    burn_collective::register::<Wire>(herald, Default::default(), config)
                        .map_err(|e| format!("{e:?}"))?;
                    reduce(herald, vec![0.0; len])?;
                    burn_collective::finish_collective::<Wire>(herald)
                        .map_err(|e| format!("{e:?}"))?;
                    left.wait();
                    Ok(())
                });
            }
            self.until(true)
                .map_err(|e| format!("opening session {number}: {e}"))?;
            burn_collective::register::<Wire>(id, Default::default(), self.config.clone())
                .map_err(|e| format!("registering session {number}: {e:?}"))?;
            let mut sum = reduce(id, values)?;
            sum.truncate(n);
            burn_collective::finish_collective::<Wire>(id)
                .map_err(|e| format!("leaving session {number}: {e:?}"))?;
            if self.herald.is_some() {
                self.until(false)
                    .map_err(|e| format!("leaving session {number}: {e}"))?;
            }
            self.left.wait();
            Ok(sum)
        }

        /// Waits until this node's tensor service answers on the loopback (`listening`) or
        /// has stopped answering (`!listening`), until the deadline. Probes back off from 1 to
        /// 16 ms and close with a reset, leaving nothing in TIME_WAIT.
        fn until(&self, listening: bool) -> Result<(), String> {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            let mut pause = Duration::from_millis(1);
            loop {
                if probe(addr) == listening {
                    return Ok(());
                }
                if Instant::now() >= self.deadline {
                    return Err(format!(
                        "this node's tensor service on port {} {}",
                        self.port,
                        if listening {
                            "never started listening"
                        } else {
                            "never stopped listening"
                        }
                    ));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(16));
            }
        }
    }

    /// Whether something listens at `addr`: a connection opened and reset at once.
    fn probe(addr: std::net::SocketAddr) -> bool {
        use socket2::{Domain, Socket, Type};
        let Ok(socket) = Socket::new(Domain::IPV4, Type::STREAM, None) else {
            return false;
        };
        // Linger 0: closing sends a reset instead of entering TIME_WAIT.
        let _ = socket.set_linger(Some(Duration::ZERO));
        socket
            .connect_timeout(&addr.into(), Duration::from_millis(200))
            .is_ok()
    }

    /// burn-collective's all-reduce (a sum) of `values` for the registered peer `id`.
    fn reduce(id: PeerId, values: Vec<f32>) -> Result<Vec<f32>, String> {
        let n = values.len();
        let t = Tensor::<Wire, 1>::from_data(TensorData::new(values, [n]), &Default::default());
        let sum = burn_collective::all_reduce::<Wire>(
            id,
            t.into_primitive().tensor(),
            ReduceOperation::Sum,
        )
        .map_err(|e| format!("{e:?}"))?;
        // The sum is shared with the other local peers: burn-ndarray would read a shared
        // array element by element (≈ 85 ns each, measured); `× 1` makes an owned copy at
        // memory speed, bit for bit.
        Tensor::<Wire, 1>::from_primitive(TensorPrimitive::Float(sum))
            .mul_scalar(1.0)
            .into_data()
            .to_vec::<f32>()
            .map_err(|e| format!("{e:?}"))
    }

    impl Peer {
        /// Waits for `rx` until the deadline, stopping early when another local peer failed.
        /// `during` says what was under way ("the exchange of gradients").
        fn wait<T>(
            &self,
            rx: mpsc::Receiver<Result<T, String>>,
            during: &str,
        ) -> Result<T, PlacementError> {
            let deadline = Instant::now() + self.timeout;
            loop {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(e)) => {
                        // Over several nodes burn-collective fails this way when a node went
                        // away (its tensor service refuses, its local server stops).
                        let cause = match self.sessions {
                            Some(_) => format!(": {} died or went away", self.others),
                            None => String::new(),
                        };
                        return Err(PlacementError::Collective(format!(
                            "peer {} of {}: {during} failed: {e}{cause}",
                            self.rank, self.peers
                        )));
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(PlacementError::Collective(format!(
                            "peer {} of {}: burn-collective stopped during {during} (see the \
                             message above)",
                            self.rank, self.peers
                        )));
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        if let Some(f) = self.board.failure() {
                            return Err(PlacementError::Collective(format!(
                                "peer {} of {}: stopped because {f}",
                                self.rank, self.peers
                            )));
                        }
                        if Instant::now() >= deadline {
                            return Err(PlacementError::Collective(format!(
                                "peer {} of {}: no answer within {} s during {during}: {} died, \
                                 stalled or never arrived (--peer-timeout)",
                                self.rank,
                                self.peers,
                                self.timeout.as_secs(),
                                self.others,
                            )));
                        }
                    }
                }
            }
        }
    }

    impl Collective for Peer {
        fn peers(&self) -> usize {
            self.peers
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn all_reduce_sum(&self, values: Vec<f32>, what: &str) -> Result<Vec<f32>, PlacementError> {
            self.exchange(values, &format!("the exchange of {what}"))
        }
    }

    impl Peer {
        /// The all-reduce (a sum) of `values` over every peer; `during` names it in errors.
        fn exchange(&self, values: Vec<f32>, during: &str) -> Result<Vec<f32>, PlacementError> {
            let (tx, rx) = mpsc::channel();
            let id = PeerId::from(self.rank);
            // Over several nodes: this exchange's session.
            let session = match &self.sessions {
                Some(s) => {
                    let mut opened = s
                        .opened
                        .lock()
                        .map_err(|_| PlacementError::Collective("a local peer panicked".into()))?;
                    let number = *opened;
                    *opened += 1;
                    let parity = (number % 2) as usize;
                    Some(Session {
                        number,
                        config: s.configs[parity].clone(),
                        port: s.ports[parity],
                        herald: s.herald,
                        left: s.left.clone(),
                        deadline: Instant::now() + self.timeout,
                        nodes: s.nodes,
                    })
                }
                None => None,
            };
            // On its own thread, so that a collective that never returns cannot hang us.
            std::thread::spawn(move || {
                let _ = tx.send(match session {
                    Some(session) => session.run(id, values),
                    None => reduce(id, values),
                });
            });
            self.wait(rx, during)
        }
    }

    /// `host:port` → the host and the port; a usage error naming the option otherwise.
    fn host_port(addr: &str, option: &str) -> Result<(String, u16), UsageError> {
        addr.rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
            .ok_or_else(|| UsageError(format!("{option} {addr}: expected HOST:PORT")))
    }

    fn ws(addr: &str) -> Result<Address, UsageError> {
        let url = if addr.starts_with("ws://") {
            addr.to_string()
        } else {
            format!("ws://{addr}")
        };
        Address::from_str(&url).map_err(|e| UsageError(format!("{addr}: {e}")))
    }

    /// The burn-collective registration of this node's local peers: one, or over several
    /// nodes those of even and of odd sessions (coordinator and tensor service one port up),
    /// each with its tensor-service port. Over several nodes, the herald is a local peer too.
    fn configs(args: &PlacementArgs) -> Result<Vec<(CollectiveConfig, u16)>, UsageError> {
        let local = args.peers as usize;
        let Some(coord) = &args.coordinator else {
            return Ok(vec![(
                CollectiveConfig::default().with_num_devices(local),
                0,
            )]);
        };
        let base = CollectiveConfig::default().with_num_devices(local + 1);
        let (coord_host, coord_port) = host_port(coord, "--coordinator")?;
        let (node_host, node_port) = match &args.node_address {
            Some(a) => host_port(a, "--node-address")?,
            None => {
                let p = u32::from(coord_port) + 2 + 2 * args.node_rank;
                let p = u16::try_from(p).map_err(|_| {
                    UsageError(format!("no default --node-address above port {coord_port}"))
                })?;
                ("127.0.0.1".to_string(), p)
            }
        };
        let next = |p: u16, option: &str| {
            p.checked_add(1)
                .ok_or_else(|| UsageError(format!("{option}: port {p} has no next port")))
        };
        let odd = (
            next(coord_port, "--coordinator")?,
            next(node_port, "--node-address")?,
        );
        [(coord_port, node_port), odd]
            .into_iter()
            .map(|(coord_port, data_port)| {
                let config = base
                    .clone()
                    .with_num_nodes(args.nodes)
                    .with_global_address(ws(&format!("{coord_host}:{coord_port}"))?)
                    .with_node_address(ws(&format!("{node_host}:{data_port}"))?)
                    .with_data_service_port(data_port);
                Ok((config, data_port))
            })
            .collect()
    }

    /// Keeps burn-collective's network stack from flooding the terminal: its log (INFO on
    /// stdout otherwise) shows errors only, on stderr; a panic of one of its network tasks (a
    /// peer that went away resets a connection) is one line, not a backtrace — the exchange
    /// waiting on it reports the failure with its deadline.
    fn quiet_network() {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing_subscriber::filter::LevelFilter::ERROR)
            .try_init();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let file = info.location().map(|l| l.file()).unwrap_or("");
            if file.contains("burn-collective") || file.contains("burn-communication") {
                let message = info
                    .payload()
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| info.payload().downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                eprintln!("note: a burn-collective network task stopped: {message}");
            } else {
                default(info);
            }
        }));
    }

    /// burn-collective's orchestrators for even and odd sessions on `port` and `port + 1`,
    /// on a thread of their own for the process's life.
    fn start_coordinator(port: u16) -> Result<()> {
        let odd = port
            .checked_add(1)
            .ok_or_else(|| UsageError(format!("--coordinator: port {port} has no next port")))?;
        for port in [port, odd] {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .context("starting the coordinator's runtime")?;
            std::thread::spawn(move || {
                rt.block_on(burn_collective::start_global_orchestrator(port))
            });
        }
        Ok(())
    }

    pub fn run_spread(
        exp: &crate::Experiment,
        seeds: &[u64],
        args: &PlacementArgs,
        devices: &[BackendKind],
        opts: &(dyn Fn(u64) -> TrainOptions + Sync),
    ) -> Result<()> {
        let local = args.peers as usize;
        let peers = local * args.nodes as usize;
        let configs = configs(args)?;
        if args.coordinator.is_some() {
            quiet_network();
        }
        if let (Some(coord), 0) = (&args.coordinator, args.node_rank) {
            start_coordinator(host_port(coord, "--coordinator")?.1)?;
        }
        // Over several nodes, the local peers and the herald leave each session together.
        let left = Arc::new(Barrier::new(local + 1));
        let board = Arc::new(Board::default());
        let timeout = Duration::from_secs(args.peer_timeout);
        let others = match args.nodes {
            1 => "another peer of this process".to_string(),
            2 => format!("node {} (or a peer of this node)", 1 - args.node_rank),
            n => format!("one of the other {} nodes (or a peer of this node)", n - 1),
        };
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..local)
                .map(|i| {
                    let rank = args.node_rank as usize * local + i;
                    let peer = Peer {
                        rank,
                        peers,
                        timeout,
                        board: board.clone(),
                        others: others.clone(),
                        sessions: match &configs[..] {
                            [(even, p), (odd, q)] => Some(Sessions {
                                configs: [even.clone(), odd.clone()],
                                ports: [*p, *q],
                                herald: (i == 0).then(|| PeerId::from(u32::MAX - args.node_rank)),
                                opened: Mutex::new(0),
                                left: left.clone(),
                                nodes: args.nodes as usize,
                            }),
                            _ => None,
                        },
                    };
                    let config = configs[0].0.clone();
                    let board = &board;
                    let backend = devices.get(i).copied().unwrap_or(match exp.backend {
                        BackendKind::Cuda(index) => BackendKind::Cuda(index + i),
                        other => other,
                    });
                    s.spawn(move || {
                        let r = peer_main(
                            exp,
                            seeds,
                            opts,
                            peer,
                            backend,
                            config,
                            args.coordinator.as_deref(),
                        );
                        if let Err(e) = &r {
                            board.fail(format!("peer {rank} failed: {e:#}"));
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a peer thread panicked")))
                })
                .collect()
        });
        // The first failure is the cause; the others' errors only report it.
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }

    /// Registers `peer` with burn-collective (with its deadline). Over several nodes, the
    /// meeting is session 0: every peer puts a one in its own slot, and every slot must sum
    /// to one.
    fn register(
        peer: &Peer,
        config: CollectiveConfig,
        meeting: &str,
    ) -> Result<(), PlacementError> {
        if peer.sessions.is_some() {
            let mut mine = vec![0.0; peer.peers];
            mine[peer.rank] = 1.0;
            let slots = peer.exchange(mine, meeting)?;
            if slots.iter().any(|&c| c != 1.0) {
                return Err(PlacementError::Collective(format!(
                    "peer {} of {}: {meeting} found the peers {slots:?}, not one of each: \
                     were all nodes started with the same --nodes and --peers, and distinct \
                     --node-rank?",
                    peer.rank, peer.peers
                )));
            }
            return Ok(());
        }
        let (tx, rx) = mpsc::channel();
        let id = PeerId::from(peer.rank);
        std::thread::spawn(move || {
            let r = burn_collective::register::<Wire>(id, Default::default(), config)
                .map_err(|e| format!("{e:?}"));
            let _ = tx.send(r);
        });
        peer.wait(rx, meeting)
    }

    /// One measured exchange: (label, values, buffer bytes per peer, median ms or why not).
    type ExchangeRow = (String, usize, usize, Result<f64, String>);

    pub fn bench_exchange(b: &ExchangeBench) -> Result<()> {
        let config = CollectiveConfig::default().with_num_devices(b.peers);
        let board = Arc::new(Board::default());
        let per_peer: Vec<Result<Vec<ExchangeRow>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..b.peers)
                .map(|rank| {
                    let peer = Arc::new(Peer {
                        rank,
                        peers: b.peers,
                        timeout: Duration::from_secs(600),
                        board: board.clone(),
                        others: "another peer of this process".into(),
                        sessions: None,
                    });
                    let config = config.clone();
                    s.spawn(move || -> Result<Vec<ExchangeRow>> {
                        register(&peer, config, "the registration of the bench's peers")?;
                        let placement = Placement::over(peer.clone());
                        let median = |mut ms: Vec<f64>| {
                            ms.sort_by(f64::total_cmp);
                            ms[ms.len() / 2]
                        };
                        let mut rows = Vec::new();
                        for &n in &b.sizes {
                            let gather_bytes = 4 * n * b.peers;
                            for (label, buffer) in
                                [("all-reduce", 4 * n), ("exact gather", gather_bytes)]
                            {
                                if buffer > b.max_buffer_bytes {
                                    let why = format!(
                                        "skipped: {:.2} GiB buffer per peer (--max-buffer-gib)",
                                        buffer as f64 / (1u64 << 30) as f64
                                    );
                                    rows.push((label.to_string(), n, buffer, Err(why)));
                                    continue;
                                }
                                let mut ms = Vec::with_capacity(b.reps);
                                for rep in 0..b.reps.max(1) + 1 {
                                    let values = vec![rank as f32 + 0.5; n];
                                    let t = Instant::now();
                                    if label == "all-reduce" {
                                        peer.all_reduce_sum(values, "bench")?;
                                    } else {
                                        placement.gather_rows(values, "bench")?;
                                    }
                                    // The first is a warm-up.
                                    if rep > 0 {
                                        ms.push(t.elapsed().as_secs_f64() * 1e3);
                                    }
                                }
                                rows.push((label.to_string(), n, buffer, Ok(median(ms))));
                            }
                        }
                        Ok(rows)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a bench peer panicked")))
                })
                .collect()
        });
        let mut all = per_peer.into_iter().collect::<Result<Vec<_>>>()?;
        let rows = all.swap_remove(0);
        println!(
            "| exchange ({} local peers, NdArray, host memory) | values | buffer per peer | median ms | GB/s of buffer |",
            b.peers
        );
        println!("|---|---:|---:|---:|---:|");
        let mut json = Vec::new();
        for (label, n, buffer, ms) in &rows {
            let (ms_s, gbs) = match ms {
                Ok(ms) => (
                    format!("{ms:.1}"),
                    format!("{:.2}", *buffer as f64 / ms / 1e6),
                ),
                Err(why) => (why.clone(), "-".into()),
            };
            println!(
                "| {label} | {:.3} M | {:.1} MB | {ms_s} | {gbs} |",
                *n as f64 / 1e6,
                *buffer as f64 / 1e6
            );
            json.push(serde_json::json!({
                "exchange": label, "values": n, "buffer_bytes": buffer, "peers": b.peers,
                "median_ms": ms.as_ref().ok(), "skipped": ms.as_ref().err(),
            }));
        }
        if let Some(path) = &b.json {
            let text = serde_json::to_string_pretty(&serde_json::json!({ "exchange": json }))?;
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// The line a peer that is not the first prints for a finished seed.
    fn follower_line(rank: usize, peers: usize, seed: u64, dir: &Path, s: &RunSummary) -> String {
        format!(
            "peer {rank} of {peers}: seed {seed} done at step {} (run directory {}, written by \
             peer 0)",
            s.last_step,
            dir.display()
        )
    }

    /// One peer: registers, then trains every seed on its replica.
    fn peer_main(
        exp: &crate::Experiment,
        seeds: &[u64],
        opts: &(dyn Fn(u64) -> TrainOptions + Sync),
        peer: Peer,
        backend: BackendKind,
        config: CollectiveConfig,
        coordinator: Option<&str>,
    ) -> Result<()> {
        let (rank, peers) = (peer.rank, peer.peers);
        let meeting = match coordinator {
            Some(c) => format!("the registration with the coordinator {c}"),
            None => "the registration of this process's peers".to_string(),
        };
        register(&peer, config, &meeting)?;
        let mut exp = exp.clone();
        exp.backend = backend;
        let placement = Placement::over(Arc::new(peer));
        for &seed in seeds {
            let mut o = opts(seed);
            o.placement = placement.clone();
            o.progress &= rank == 0;
            o.log_lines &= rank == 0;
            let started = Instant::now();
            let summary = crate::run(&exp, seed, &o)
                .with_context(|| format!("run {} (peer {rank} of {peers})", o.run_dir.display()))?;
            if rank == 0 {
                crate::print_summary(
                    &exp,
                    seed,
                    &o.run_dir,
                    &summary,
                    started.elapsed().as_secs_f64(),
                );
            } else {
                eprintln!("{}", follower_line(rank, peers, seed, &o.run_dir, &summary));
            }
        }
        Ok(())
    }

    #[cfg(test)]
    pub(super) mod tests_support {
        use super::*;

        /// Peer 0 of 2 in one process with deadline `timeout`, and its board.
        pub fn peer(timeout: Duration) -> (Peer, Arc<Board>) {
            let board = Arc::new(Board::default());
            let p = Peer {
                rank: 0,
                peers: 2,
                timeout,
                board: board.clone(),
                others: "another peer of this process".into(),
                sessions: None,
            };
            (p, board)
        }

        /// A channel nobody answers on (its sender kept alive).
        pub fn silent() -> mpsc::Receiver<Result<(), String>> {
            let (tx, rx) = mpsc::channel();
            std::mem::forget(tx);
            rx
        }

        impl Peer {
            pub fn wait_for_test(
                &self,
                rx: mpsc::Receiver<Result<(), String>>,
            ) -> Result<(), PlacementError> {
                self.wait(rx, "the exchange of test values")
            }
        }
    }
}

#[cfg(all(test, feature = "distributed"))]
mod tests {
    use super::imp::tests_support::{peer, silent};
    use std::time::{Duration, Instant};

    /// A local peer that failed stops its siblings at their next wait, at once and naming it;
    /// a silent exchange ends at the deadline, naming who is missing.
    #[test]
    fn a_wait_ends_on_a_sibling_failure_or_at_the_deadline() {
        let (p, board) = peer(Duration::from_secs(30));
        board.fail("peer 1 failed: the environment crashed".into());
        let t = Instant::now();
        let err = p
            .wait_for_test(silent())
            .expect_err("a failure")
            .to_string();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(
            err.contains("peer 0 of 2: stopped because peer 1 failed"),
            "{err}"
        );

        let (p, _) = peer(Duration::from_millis(300));
        let t = Instant::now();
        let err = p
            .wait_for_test(silent())
            .expect_err("a timeout")
            .to_string();
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(
            err.contains("no answer within 0 s during the exchange of test values"),
            "{err}"
        );
        assert!(err.contains("another peer of this process"), "{err}");
    }
}
