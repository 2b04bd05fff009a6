//! `rlany export RUN_DIR OUT --format hf|peft|gguf`: a run's trained policy in a format other
//! tools load — a Hugging Face directory (`config.json`, `model.safetensors` with the LoRA
//! adapters merged, `generation_config.json`, and the tokenizer: the source's own files when
//! it came from a Hugging Face directory, written from the metadata when from a GGUF file),
//! PEFT's adapter directory over the base model (`--base-model`, which a GGUF source needs:
//! PEFT cannot load one), or (for a policy loaded from a GGUF file) a GGUF file for llama.cpp,
//! `--quant f16|q8_0`, with the source's metadata and tokenizer. A from-scratch policy reads
//! the character tokenizer, which none of the formats holds: refused.

use crate::{OnBackend, Role, UsageError, on_backend, run_model};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use rlany_framework::BackendKind;
use rlany_framework::experiment::ModelSource;
use rlany_models::gguf::GgufFile;
use rlany_models::gguf_export::{GgufType, save_gguf};
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
    /// One GGUF file for llama.cpp (adapters merged), from a policy loaded from a GGUF file.
    Gguf,
}

impl Format {
    /// The name `--format` takes.
    fn name(self) -> &'static str {
        match self {
            Format::Hf => "hf",
            Format::Peft => "peft",
            Format::Gguf => "gguf",
        }
    }
}

/// The type of a GGUF export's matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Quant {
    /// Half precision.
    F16,
    /// 8-bit blocks of 32 (llama.cpp's Q8_0).
    #[value(name = "q8_0")]
    Q8_0,
}

/// `rlany export`'s arguments.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The run directory (runs/<name>/seed-<n>).
    run_dir: PathBuf,
    /// The directory to write (created if missing; files of the same names are replaced);
    /// for gguf, the file to write.
    out: PathBuf,
    /// hf: a Hugging Face directory, adapters merged; peft: the adapters alone; gguf: one
    /// GGUF file, adapters merged.
    #[arg(long, value_enum)]
    format: Format,
    /// The GGUF export's matrix type (norms are always F32); f16 when not given. Only for
    /// --format gguf (hf and peft write the weights as the run holds them).
    #[arg(long, value_enum)]
    quant: Option<Quant>,
    /// For --format peft: the base model as `adapter_config.json` names it
    /// (`base_model_name_or_path`), a Hugging Face repository or directory — e.g.
    /// HuggingFaceTB/SmolLM2-135M-Instruct. Required when the run's model is a GGUF file
    /// (which PEFT cannot load); a Hugging Face directory's own absolute path otherwise.
    #[arg(long, value_name = "NAME")]
    base_model: Option<String>,
    /// Export this checkpoint (e.g. step-000010) instead of the latest.
    #[arg(long)]
    checkpoint: Option<String>,
    /// Export the run's judge (a learned or frozen one with a pretrained model) instead of
    /// its policy.
    #[arg(long)]
    judge: bool,
}

/// The source files of a Hugging Face directory that go with its weights.
const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Writes the export and says what was written.
pub fn run(args: &ExportArgs) -> Result<()> {
    if args.quant.is_some() && args.format != Format::Gguf {
        return Err(UsageError(format!(
            "--quant is for --format gguf; --format {} writes the weights as the run holds them \
             (drop --quant)",
            args.format.name()
        ))
        .into());
    }
    if args.base_model.is_some() && args.format != Format::Peft {
        return Err(UsageError(format!(
            "--base-model is for --format peft (it names the base the adapters go over); \
             --format {} merges the adapters into the weights (drop --base-model)",
            args.format.name()
        ))
        .into());
    }
    struct Job<'a>(&'a ExportArgs);
    impl OnBackend for Job<'_> {
        type Output = ();
        fn on<B: rlany_kernels::LogProbOps>(self, device: &B::Device) -> Result<()> {
            export::<B>(self.0, device)
        }
    }
    on_backend(BackendKind::NdArray, Job(args))?;
    if args.format == Format::Gguf {
        let bytes = std::fs::metadata(&args.out)
            .with_context(|| format!("reading {}", args.out.display()))?
            .len();
        println!(
            "wrote {} ({:.1} MB)",
            args.out.display(),
            bytes as f64 / 1e6
        );
        return Ok(());
    }
    let mut written: Vec<String> = std::fs::read_dir(&args.out)
        .with_context(|| format!("reading {}", args.out.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    written.sort();
    println!("wrote {}: {}", args.out.display(), written.join(", "));
    Ok(())
}

fn export<B: rlany_kernels::LogProbOps>(args: &ExportArgs, device: &B::Device) -> Result<()> {
    let role = if args.judge {
        Role::Judge
    } else {
        Role::Policy
    };
    let p = run_model::<B>(&args.run_dir, args.checkpoint.as_deref(), role, device)?;
    let who = if args.judge { "judge" } else { "policy" };
    let ModelSource::Pretrained(source) = &p.source else {
        return Err(UsageError(format!(
            "{}: a from-scratch {who} reads the character tokenizer, which none of the hf, \
             peft and gguf formats holds; export needs a {who} that starts from a pretrained model",
            args.run_dir.display()
        ))
        .into());
    };
    match args.format {
        Format::Gguf => {
            let src = Path::new(&source.path);
            if src.is_dir() {
                return Err(UsageError(format!(
                    "{}: the {who} was loaded from a Hugging Face directory ({}); a GGUF export \
                     copies its source's GGUF metadata and tokenizer, so it needs a GGUF source. \
                     Export --format hf and convert that directory with llama.cpp's \
                     convert_hf_to_gguf.py",
                    args.run_dir.display(),
                    source.path
                ))
                .into());
            }
            let gguf = GgufFile::open(src)?;
            if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            let quant = match args.quant.unwrap_or(Quant::F16) {
                Quant::F16 => GgufType::F16,
                Quant::Q8_0 => GgufType::Q8_0,
            };
            save_gguf(&p.model, &gguf, &args.out, quant)?;
        }
        Format::Peft => {
            let Some(spec) = &source.lora else {
                return Err(UsageError(format!(
                    "{}: the {who} has no LoRA adapters (its `lora` is None): export it with \
                     --format hf",
                    args.run_dir.display()
                ))
                .into());
            };
            let src = Path::new(&source.path);
            let base = match (&args.base_model, src.is_dir()) {
                (Some(name), _) => name.clone(),
                (None, true) => std::fs::canonicalize(src)
                    .with_context(|| format!("reading {}", src.display()))?
                    .to_string_lossy()
                    .into_owned(),
                (None, false) => {
                    let gguf = GgufFile::open(src)?;
                    let says = ["general.organization", "general.name"]
                        .iter()
                        .filter_map(|k| gguf.get(k).and_then(|v| v.as_str()))
                        .collect::<Vec<_>>()
                        .join(" / ");
                    return Err(UsageError(format!(
                        "{}: the {who} was loaded from a GGUF file ({}{}), which transformers \
                         + PEFT cannot load as the adapters' base; name its Hugging Face \
                         repository or directory with --base-model (for the SmolLM2 of \
                         models/fetch-smollm2.sh: --base-model \
                         HuggingFaceTB/SmolLM2-135M-Instruct)",
                        args.run_dir.display(),
                        source.path,
                        if says.is_empty() {
                            String::new()
                        } else {
                            format!(": {says}")
                        }
                    ))
                    .into());
                }
            };
            save_peft_dir(&p.model, spec, &base, &args.out)?;
        }
        Format::Hf => {
            // config.json says the source model's own context (SmolLM2's 8192), not the
            // run's allocation (`max_seq_len`, e.g. 384): the weights are the same, and a
            // GGUF converted from the export inherits it.
            let src = Path::new(&source.path);
            let own = if src.is_dir() {
                rlany_models::read_hf_config(src, None)?.0.max_seq_len
            } else {
                GgufFile::open(src)?.config(None)?.max_seq_len
            };
            save_hf_dir(&p.model.clone().with_max_seq_len(own), &args.out)?;
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
                write_gguf_tokenizer(&GgufFile::open(src)?, &args.out)?;
            }
        }
    }
    Ok(())
}

/// The tokenizer of a GGUF source as a Hugging Face directory holds it: `tokenizer.json` (the
/// file's vocabulary, merges and pre-tokenizer), `tokenizer_config.json` (the fast tokenizer
/// class, the bos/eos/pad tokens and the chat template) and `special_tokens_map.json`.
fn write_gguf_tokenizer(gguf: &GgufFile, out: &Path) -> Result<()> {
    let spec = gguf.tokenizer_spec()?;
    let text = |id: u32| spec.tokens.get(id as usize).cloned();
    let (bos, eos, pad) = (text(spec.bos), text(spec.eos), text(spec.pad));
    let mut config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": false,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
    });
    if let Some(template) = gguf.chat_template() {
        config["chat_template"] = serde_json::Value::from(template);
    }
    let map = serde_json::json!({ "bos_token": bos, "eos_token": eos, "pad_token": pad });
    for (name, value) in [
        ("tokenizer.json", spec.to_tokenizer_json()?),
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", map),
    ] {
        let path = out.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(&value)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
