//! Checkpoints: everything needed to continue a run exactly — weights, optimiser state, the
//! trainer's state (step, every RNG stream, task slots) — written atomically. A checkpoint is
//! assembled in `checkpoints/.tmp-step-N/` and renamed to `checkpoints/step-N/`; only then is
//! the `latest` pointer replaced (itself by an atomic rename). A kill at any moment leaves the
//! previous checkpoint usable.

use crate::rundir::{RunDirError, io, write_atomic};
use burn::module::{AutodiffModule, Module};
use burn::optim::Optimizer;
use burn::prelude::Backend;
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

fn rec_err(path: PathBuf) -> impl FnOnce(burn::record::RecorderError) -> CheckpointError {
    move |e| CheckpointError::Record {
        path,
        message: e.to_string(),
    }
}

/// A checkpoint being written into `checkpoints/.tmp-step-N/`; nothing is visible to a
/// reader until [`Writer::commit`].
#[derive(Debug)]
pub struct Writer {
    dir: PathBuf,
    tmp: PathBuf,
    name: String,
}

impl Writer {
    /// Starts checkpoint `step` in `dir` (the run's `checkpoints/`).
    pub fn begin(dir: &Path, step: usize) -> Result<Self, CheckpointError> {
        let name = step_dir_name(step);
        let tmp = dir.join(format!(".tmp-{name}"));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tmp,
            name,
        })
    }

    /// Saves a module's weights as `<name>.mpk` (full precision: bit-exact on reload).
    pub fn module<B: Backend, M: Module<B>>(
        &self,
        name: &str,
        module: &M,
    ) -> Result<(), CheckpointError> {
        recorder()
            .record(module.clone().into_record(), self.tmp.join(name))
            .map_err(rec_err(self.tmp.join(format!("{name}.mpk"))))
    }

    /// Saves an optimiser's state as `<name>.mpk`.
    pub fn optim<B: AutodiffBackend, M: AutodiffModule<B>, O: Optimizer<M, B>>(
        &self,
        name: &str,
        optim: &O,
    ) -> Result<(), CheckpointError> {
        recorder()
            .record(optim.to_record(), self.tmp.join(name))
            .map_err(rec_err(self.tmp.join(format!("{name}.mpk"))))
    }

    /// Saves the trainer's own state as `state.json`.
    pub fn state<S: Serialize>(&self, state: &S) -> Result<(), CheckpointError> {
        let path = self.tmp.join("state.json");
        let json = serde_json::to_vec_pretty(state).map_err(|e| CheckpointError::State {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_atomic(&path, &json)?;
        Ok(())
    }

    /// Publishes the checkpoint (rename, then the `latest` pointer) and keeps the newest `keep`.
    pub fn commit(self, keep: usize) -> Result<(), CheckpointError> {
        let fin = self.dir.join(&self.name);
        if fin.exists() {
            fs::remove_dir_all(&fin).map_err(io(&fin))?;
        }
        fs::rename(&self.tmp, &fin).map_err(io(&fin))?;
        write_atomic(&self.dir.join("latest"), self.name.as_bytes())?;
        prune(&self.dir, keep);
        Ok(())
    }
}

/// Reads the parts of one complete checkpoint.
#[derive(Debug, Clone)]
pub struct Reader {
    dir: PathBuf,
}

impl Reader {
    /// The newest complete checkpoint under `dir` (the run's `checkpoints/`).
    pub fn latest(dir: &Path) -> Result<Self, CheckpointError> {
        latest(dir)
            .map(|dir| Self { dir })
            .ok_or_else(|| CheckpointError::Missing(dir.to_path_buf()))
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads `<name>.mpk` into `module` (whose structure must match).
    pub fn module<B: Backend, M: Module<B>>(
        &self,
        name: &str,
        module: M,
        device: &B::Device,
    ) -> Result<M, CheckpointError> {
        let rec = recorder()
            .load(self.dir.join(name), device)
            .map_err(rec_err(self.dir.join(format!("{name}.mpk"))))?;
        Ok(module.load_record(rec))
    }

    /// Loads `<name>.mpk` into `optim`.
    pub fn optim<B: AutodiffBackend, M: AutodiffModule<B>, O: Optimizer<M, B>>(
        &self,
        name: &str,
        optim: O,
        device: &B::Device,
    ) -> Result<O, CheckpointError> {
        let rec = recorder()
            .load(self.dir.join(name), device)
            .map_err(rec_err(self.dir.join(format!("{name}.mpk"))))?;
        Ok(optim.load_record(rec))
    }

    /// Reads `state.json`.
    pub fn state<S: DeserializeOwned>(&self) -> Result<S, CheckpointError> {
        let path = self.dir.join("state.json");
        let bytes = fs::read(&path).map_err(io(&path))?;
        serde_json::from_slice(&bytes).map_err(|e| CheckpointError::State {
            path,
            message: e.to_string(),
        })
    }
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
