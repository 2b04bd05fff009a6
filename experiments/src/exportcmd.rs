//! `rlany export RUN_DIR OUT --format hf|peft`: a run's trained policy in a format other
//! tools load — a Hugging Face directory (`config.json`, `model.safetensors` with the LoRA
//! adapters merged, `generation_config.json`, and the source's tokenizer files when it came
//! from a Hugging Face directory) or PEFT's adapter directory over the base model. A
//! from-scratch policy reads the character tokenizer, which neither format holds: refused.

use crate::{OnBackend, UsageError, on_backend, run_policy};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use rlany_framework::BackendKind;
use rlany_framework::experiment::ModelSource;
use rlany_models::peft::save_peft_dir;
use rlany_models::save_hf_dir;
use std::path::{Path, PathBuf};

/// What `rlany export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A Hugging Face directory that `transformers` loads, adapters merged.
    Hf,
    /// The LoRA adapters alone, as PEFT saves them, over the base model the run started from.
    Peft,
}

/// `rlany export`'s arguments.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The run directory (runs/<name>/seed-<n>).
    run_dir: PathBuf,
    /// The directory to write (created if missing; files of the same names are replaced).
    out: PathBuf,
    /// hf: a Hugging Face directory, adapters merged; peft: the adapters alone.
    #[arg(long, value_enum)]
    format: Format,
    /// Export this checkpoint (e.g. step-000010) instead of the latest.
    #[arg(long)]
    checkpoint: Option<String>,
}

/// The source files of a Hugging Face directory that go with its weights.
const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Writes the export and says what was written.
pub fn run(args: &ExportArgs) -> Result<()> {
    struct Job<'a>(&'a ExportArgs);
    impl OnBackend for Job<'_> {
        type Output = Vec<String>;
        fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<Vec<String>> {
            export::<B>(self.0, device)
        }
    }
    let notes = on_backend(BackendKind::NdArray, Job(args))?;
    for n in notes {
        eprintln!("note: {n}");
    }
    let mut written: Vec<String> = std::fs::read_dir(&args.out)
        .with_context(|| format!("reading {}", args.out.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    written.sort();
    println!("wrote {}: {}", args.out.display(), written.join(", "));
    Ok(())
}

fn export<B: rlany_kernels::LogProbOps>(
    args: &ExportArgs,
    device: &B::Device,
) -> Result<Vec<String>> {
    let p = run_policy::<B>(&args.run_dir, args.checkpoint.as_deref(), device)?;
    let ModelSource::Pretrained(source) = &p.exp.policy.model else {
        return Err(UsageError(format!(
            "{}: a from-scratch policy reads the character tokenizer, which neither the hf nor \
             the peft format holds; export needs a policy that starts from a pretrained model",
            args.run_dir.display()
        ))
        .into());
    };
    let mut notes = Vec::new();
    match args.format {
        Format::Peft => {
            let Some(spec) = &source.lora else {
                return Err(UsageError(format!(
                    "{}: the policy has no LoRA adapters (its `lora` is None): export it with \
                     --format hf",
                    args.run_dir.display()
                ))
                .into());
            };
            save_peft_dir(&p.model, spec, &source.path, &args.out)?;
            notes.push(format!(
                "adapter_config.json names the base model as {:?} (the run's file); for \
                 transformers + peft, point `base_model_name_or_path` at its Hugging Face \
                 directory or repository",
                source.path
            ));
        }
        Format::Hf => {
            save_hf_dir(&p.model, &args.out)?;
            let tok = &p.tokenizer;
            let generation = serde_json::json!({
                "bos_token_id": tok.bos(),
                "eos_token_id": tok.eos(),
                "pad_token_id": tok.pad(),
                "do_sample": false,
            });
            let path = args.out.join("generation_config.json");
            std::fs::write(&path, serde_json::to_string_pretty(&generation)? + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
            let src = Path::new(&source.path);
            if src.is_dir() {
                for name in TOKENIZER_FILES {
                    if src.join(name).is_file() {
                        std::fs::copy(src.join(name), args.out.join(name))
                            .with_context(|| format!("copying {name}"))?;
                    }
                }
            } else {
                notes.push(format!(
                    "{} is a GGUF file: its tokenizer is not written as tokenizer.json by this \
                     version; load the tokenizer of the model's Hugging Face repository beside \
                     these weights (the ids are the same)",
                    source.path
                ));
            }
        }
    }
    Ok(notes)
}
