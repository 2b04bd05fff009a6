//! `rlany generate`: what a pretrained model says to one user message, before any training
//! — or, with `--run RUN_DIR`, what a run's trained policy says (its checkpoint's weights,
//! adapters applied).
//!
//! The message is wrapped in the model's own chat template with its default system prompt
//! (or `--system`), the reply is decoded greedily unless `--temperature` says otherwise, and
//! it ends at the template's end-of-message token or `--max-tokens`. Load time, speed and
//! peak memory go to stderr; the reply alone to stdout.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use rlany_framework::{CausalLm, Rng, SampleParams, Tokenizer, shard};
use rlany_kernels::AttentionOps;
use rlany_models::{ChatTemplate, Role, Transformer, load_pretrained, packed_weights};

use crate::UsageError;
use crate::pretrained::missing_model_hint;

/// The options of `rlany generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A GGUF file or a Hugging Face directory (config.json, *.safetensors, tokenizer.json).
    #[arg(required_unless_present = "run", conflicts_with = "run")]
    pub model: Option<PathBuf>,
    /// A run directory (runs/<name>/seed-<n>): its trained policy at the latest checkpoint
    /// (or --checkpoint) answers — a pretrained one in its chat template, a from-scratch one
    /// continuing the prompt as the environment's text, up to the end of the line (one
    /// action).
    #[arg(long, value_name = "RUN_DIR")]
    pub run: Option<PathBuf>,
    /// With --run: this checkpoint (e.g. step-000010) instead of the latest.
    #[arg(long, requires = "run")]
    pub checkpoint: Option<String>,
    /// The user message.
    #[arg(long)]
    pub prompt: String,
    /// The system prompt (default: the chat template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens in the reply.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 disables it.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Seed of the sampler (with --temperature > 0).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Context to allocate (capped by the model's own).
    #[arg(long, default_value_t = 2048)]
    pub max_seq_len: usize,
    /// Also print the prompt exactly as the model reads it.
    #[arg(long)]
    pub show_prompt: bool,
    /// Decode this many copies of the prompt in one batch (a throughput measurement, as in a
    /// rollout; the first row's reply is printed).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// The backend: ndarray (default), flex, wgpu, cuda or cuda:N (the last three as
    /// compiled in).
    #[arg(long, default_value = "ndarray")]
    pub backend: String,
    /// Do not stop at the end-of-message token: every row decodes exactly --max-tokens
    /// tokens (for timing against another engine on equal work).
    #[arg(long)]
    pub ignore_eos: bool,
    /// With --batch: decode the rows in this many groups at once, as a run's
    /// rollout does with `shards: n` (each group from its own sampling stream, drawn from
    /// --seed; greedy replies do not depend on it).
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Decode with the dense f32 weights only. By default a GGUF file's quantized
    /// projections (`Q4_1`, `Q8_0`) are also kept as its blocks on a CPU backend, and steps of
    /// at most four rows multiply by them (rlany_models::packed: ≈ 1/5 of the memory
    /// traffic per token; the same weights, summed in another order).
    #[arg(long)]
    pub dense: bool,
}

/// Peak resident memory of this process so far, in MiB (Linux; `None` elsewhere).
pub(crate) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// `rlany generate`.
pub fn run(args: &GenerateArgs) -> Result<()> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        return Err(UsageError(format!("--temperature {} must be ≥ 0", args.temperature)).into());
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(UsageError(format!("--top-p {} must be in (0, 1]", args.top_p)).into());
    }
    if args.batch == 0 {
        return Err(UsageError("--batch must be at least 1".to_string()).into());
    }
    if args.shards == 0 {
        return Err(UsageError("--shards must be at least 1".to_string()).into());
    }
    if let Some(model) = &args.model
        && !model.exists()
    {
        return Err(UsageError(missing_model_hint(model)).into());
    }
    struct Generate<'a>(&'a GenerateArgs);
    impl crate::OnBackend for Generate<'_> {
        type Output = ();
        fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<()> {
            generate_on::<B>(self.0, device)
        }
    }
    crate::on_backend(crate::parse_backend(&args.backend)?, Generate(args))
}

/// The model that answers, with what reads and writes its text.
struct Speaker<B: burn::prelude::Backend> {
    model: Transformer<B>,
    tokenizer: Box<dyn Tokenizer>,
    chat: Option<ChatTemplate>,
    /// The ids a reply ends at (unless --ignore-eos).
    stop: Vec<u32>,
    /// What is named in the timing line.
    name: String,
}

/// A pretrained file, with its quantized blocks where this backend reads them.
fn pretrained<B: AttentionOps>(
    path: &Path,
    args: &GenerateArgs,
    device: &B::Device,
) -> Result<Speaker<B>> {
    let mut p = load_pretrained::<B>(path, Some(args.max_seq_len), device)
        .with_context(|| format!("loading {}", path.display()))?;
    // Blocks only where this backend reads them (the CPU backends).
    if !args.dense
        && rlany_kernels::packed_matmul_supported::<B>(device)
        && let Some(packed) = packed_weights(path, p.model.config())
            .with_context(|| format!("reading the blocks of {}", path.display()))?
    {
        p.model = p.model.with_packed(packed)?;
    }
    let stop = vec![p.tokenizer.eos()];
    Ok(Speaker {
        model: p.model,
        tokenizer: Box::new(p.tokenizer),
        chat: p.chat,
        stop,
        name: path.display().to_string(),
    })
}

/// A run's trained policy: the model its experiment names (adapters included) with its
/// checkpoint's weights.
fn trained<B: rlany_kernels::LogProbOps>(
    run: &Path,
    args: &GenerateArgs,
    device: &B::Device,
) -> Result<Speaker<B>> {
    let p = crate::run_policy::<B>(run, args.checkpoint.as_deref(), device)?;
    let model = p
        .model
        .clone()
        .with_max_seq_len(args.max_seq_len.min(p.model.config().max_seq_len));
    // A chat model replies until its end of message; a from-scratch policy writes one
    // action, a line, as in its episodes.
    let stop = match p.chat {
        Some(_) => vec![p.tokenizer.eos()],
        None => p
            .tokenizer
            .prompt_format()
            .stop_tokens(p.tokenizer.as_ref()),
    };
    Ok(Speaker {
        model,
        name: format!("{} at {}", run.display(), p.checkpoint),
        tokenizer: p.tokenizer,
        chat: p.chat,
        stop,
    })
}

/// `rlany generate` on backend `B`.
fn generate_on<B: rlany_kernels::LogProbOps>(
    args: &GenerateArgs,
    device: &B::Device,
) -> Result<()> {
    let started = Instant::now();
    let p = match (&args.run, &args.model) {
        (Some(run), _) => trained::<B>(run, args, device)?,
        (None, Some(path)) => pretrained::<B>(path, args, device)?,
        (None, None) => {
            return Err(UsageError("give a model file or --run RUN_DIR".into()).into());
        }
    };
    let load_s = started.elapsed().as_secs_f64();
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push((Role::System, system.as_str()));
    }
    messages.push((Role::User, args.prompt.as_str()));
    let prompt = match &p.chat {
        Some(chat) => chat.render(&messages, true),
        // As the run's episodes are laid out: BOS, then the text, each line a line.
        None if args.run.is_some() => {
            eprintln!(
                "note: {} is a from-scratch policy: the prompt is read as an episode's text \
                 (`rlany env FILE` shows one; a final newline is added where missing), and \
                 the reply is its next action",
                p.name
            );
            let mut text = args.prompt.clone();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text
        }
        None => {
            eprintln!(
                "note: {} has no chat template this build renders; the message is given as \
                 plain text",
                p.name
            );
            args.prompt.clone()
        }
    };
    if args.show_prompt {
        eprintln!("--- prompt ---\n{prompt}--- end of prompt ---");
    }
    let ids = match (&args.run, &p.chat) {
        (Some(_), None) => p
            .tokenizer
            .prompt_format()
            .start(p.tokenizer.as_ref(), &prompt, None),
        _ => p.tokenizer.encode(&prompt),
    };
    let params = SampleParams {
        temperature: args.temperature,
        top_p: args.top_p,
        max_new_tokens: args.max_tokens,
        stop_tokens: if args.ignore_eos {
            Vec::new()
        } else {
            p.stop.clone()
        },
        on_device: false,
    };
    let started = Instant::now();
    // The rows in groups as a sharded rollout splits its episodes (`shard::ranges`), each
    // group's stream seeded from the run's; one group is the whole batch on the run's stream.
    let mut rng = Rng::new(args.seed);
    let ranges = shard::ranges(args.batch, args.shards);
    let one = ranges.len() == 1;
    let groups: Vec<_> = ranges
        .into_iter()
        .map(|r| {
            let seed = if one { args.seed } else { rng.next_u64() };
            (p.model.clone(), r.len(), seed)
        })
        .collect();
    // On a thread of rayon's pool, so that a product split over the pool's threads runs on
    // this one too rather than waking two others and waiting (a single stream at two
    // threads: 75–80 → 96–107 tokens/s with packed weights, Zen 4).
    let rows: Vec<_> = rayon::scope(|_| {
        shard::map(groups, |(model, rows, seed)| {
            model.generate(&vec![ids.clone(); rows], &params, &mut Rng::new(seed))
        })
    })
    .into_iter()
    .flatten()
    .collect();
    let gen_s = started.elapsed().as_secs_f64();
    let generated: usize = rows.iter().map(|g| g.tokens.len()).sum();
    let generation = rows
        .into_iter()
        .next()
        .context("the model generated no row")?;
    let reply = p.tokenizer.decode(&generation.tokens);
    println!("{}", reply.trim_end());
    let config = p.model.config();
    eprintln!(
        "[{}: {} layers, d_model {}, vocab {}] loaded in {load_s:.1} s; prompt {} tokens, \
         {}reply {} tokens in {gen_s:.1} s ({:.1} tokens/s){}; {} weights; peak memory {}",
        p.name,
        config.n_layers,
        config.d_model,
        config.vocab_size,
        ids.len(),
        if args.batch > 1 {
            format!("{} rows, ", args.batch)
        } else {
            String::new()
        },
        generated,
        generated as f64 / gen_s.max(1e-9),
        if generation.stopped {
            ""
        } else {
            ", stopped at --max-tokens"
        },
        if p.model.has_packed() {
            "packed"
        } else {
            "dense"
        },
        peak_rss_mib().map_or_else(|| "unknown".to_string(), |m| format!("{m:.0} MiB")),
    );
    Ok(())
}
