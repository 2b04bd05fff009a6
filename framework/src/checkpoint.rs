//! Checkpoints: everything needed to continue a run exactly — weights, optimiser state, the
//! trainer's state (step, every RNG stream, task slots) — written atomically. A checkpoint is
//! assembled in `checkpoints/.tmp-step-N/` and renamed to `checkpoints/step-N/`; only then is
//! the `latest` pointer replaced (itself by an atomic rename). A kill at any moment leaves the
//! previous checkpoint usable.

use crate::rundir::{RunDirError, io, write_atomic};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Serialize, de::DeserializeOwned};
use std::fs;
use std::path::{Path, PathBuf};

/// Errors while writing or reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File-level failure.
    #[error(transparent)]
    Io(#[from] RunDirError),
    /// Burn could not write or read a record.
    #[error("{path}: {message}")]
    Record {
        /// The record file.
        path: PathBuf,
        /// Burn's message.
        message: String,
    },
    /// The trainer state did not (de)serialise.
    #[error("{path}: {message}")]
    State {
        /// state.json.
        path: PathBuf,
        /// serde's message.
        message: String,
    },
    /// There is no checkpoint to resume from.
    #[error(
        "{0}: no checkpoint to resume from (the run stopped before its first checkpoint; start it again)"
    )]
    Missing(PathBuf),
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// Name of the checkpoint directory of `step`.
pub fn step_dir_name(step: usize) -> String {
    format!("step-{step:06}")
}

/// Writes checkpoint `step` into `dir` (the run's `checkpoints/`) and keeps the newest `keep`.
pub fn save<B, M, O, S>(
    dir: &Path,
    step: usize,
    model: &M,
    optim: &O,
    state: &S,
    keep: usize,
) -> Result<(), CheckpointError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    S: Serialize,
{
    let name = step_dir_name(step);
    let tmp = dir.join(format!(".tmp-{name}"));
    let fin = dir.join(&name);
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let rec_err = |path: PathBuf| {
        move |e: burn::record::RecorderError| CheckpointError::Record {
            path,
            message: e.to_string(),
        }
    };
    recorder()
        .record(model.clone().into_record(), tmp.join("policy"))
        .map_err(rec_err(tmp.join("policy.mpk")))?;
    recorder()
        .record(optim.to_record(), tmp.join("optim"))
        .map_err(rec_err(tmp.join("optim.mpk")))?;
    let json = serde_json::to_vec_pretty(state).map_err(|e| CheckpointError::State {
        path: tmp.join("state.json"),
        message: e.to_string(),
    })?;
    write_atomic(&tmp.join("state.json"), &json)?;
    if fin.exists() {
        fs::remove_dir_all(&fin).map_err(io(&fin))?;
    }
    fs::rename(&tmp, &fin).map_err(io(&fin))?;
    write_atomic(&dir.join("latest"), name.as_bytes())?;
    prune(dir, keep);
    Ok(())
}

/// Removes all but the newest `keep` complete checkpoints (best effort).
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut steps: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
        })
        .collect();
    steps.sort();
    let n = steps.len();
    for p in steps.into_iter().take(n.saturating_sub(keep)) {
        let _ = fs::remove_dir_all(p);
    }
}

/// The newest complete checkpoint directory, if any.
pub fn latest(dir: &Path) -> Option<PathBuf> {
    let name = fs::read_to_string(dir.join("latest")).ok()?;
    let p = dir.join(name.trim());
    p.join("state.json").exists().then_some(p)
}

/// Loads a checkpoint into `model` and `optim` (whose structure must match) and returns the
/// trainer state.
pub fn load<B, M, O, S>(
    ckpt: &Path,
    model: M,
    optim: O,
    device: &B::Device,
) -> Result<(M, O, S), CheckpointError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
    S: DeserializeOwned,
{
    let rec_err = |path: PathBuf| {
        move |e: burn::record::RecorderError| CheckpointError::Record {
            path,
            message: e.to_string(),
        }
    };
    let model_rec = recorder()
        .load(ckpt.join("policy"), device)
        .map_err(rec_err(ckpt.join("policy.mpk")))?;
    let optim_rec = recorder()
        .load(ckpt.join("optim"), device)
        .map_err(rec_err(ckpt.join("optim.mpk")))?;
    let state_path = ckpt.join("state.json");
    let bytes = fs::read(&state_path).map_err(io(&state_path))?;
    let state = serde_json::from_slice(&bytes).map_err(|e| CheckpointError::State {
        path: state_path.clone(),
        message: e.to_string(),
    })?;
    Ok((
        model.load_record(model_rec),
        optim.load_record(optim_rec),
        state,
    ))
}
