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
    /// A file of the checkpoint does not match the checksum written with it.
    #[error(
        "{file}: damaged ({reason}); the checkpoint cannot be used. Resume from an older one by naming it: --checkpoint <name> (this run has: {available})"
    )]
    Damaged {
        /// The damaged (or missing) file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
        /// The checkpoints of the run, newest last.
        available: String,
    },
}

/// The file in every checkpoint that lists the checksum of each of its other files.
pub const CHECKSUMS: &str = "checksums.json";

/// FNV-1a (64-bit) of a file's bytes, as 16 hex digits: detects flipped or truncated bytes.
pub fn checksum(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{h:016x}")
}

/// Every checkpoint under `dir` (the run's `checkpoints/`), oldest first.
pub fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with("step-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
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

    /// Publishes the checkpoint (checksums of every file, rename, then the `latest` pointer)
    /// and keeps the newest `keep`.
    pub fn commit(self, keep: usize) -> Result<(), CheckpointError> {
        let mut sums = serde_json::Map::new();
        let mut files: Vec<PathBuf> = fs::read_dir(&self.tmp)
            .map_err(io(&self.tmp))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for f in files {
            let bytes = fs::read(&f).map_err(io(&f))?;
            if let Some(name) = f.file_name().and_then(|n| n.to_str()) {
                sums.insert(name.to_string(), checksum(&bytes).into());
            }
        }
        let json = serde_json::to_vec_pretty(&sums).map_err(|e| CheckpointError::State {
            path: self.tmp.join(CHECKSUMS),
            message: e.to_string(),
        })?;
        write_atomic(&self.tmp.join(CHECKSUMS), &json)?;
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
    /// The newest complete checkpoint under `dir` (the run's `checkpoints/`), its files
    /// verified against their checksums.
    pub fn latest(dir: &Path) -> Result<Self, CheckpointError> {
        let found = latest(dir).ok_or_else(|| CheckpointError::Missing(dir.to_path_buf()))?;
        Self::verified(dir, found)
    }

    /// The checkpoint `name` (e.g. `step-000010`) under `dir`, verified.
    pub fn named(dir: &Path, name: &str) -> Result<Self, CheckpointError> {
        let p = dir.join(name);
        if name.contains('/') || !p.join("state.json").exists() {
            return Err(CheckpointError::Damaged {
                file: p,
                reason: "no such complete checkpoint".into(),
                available: list(dir).join(", "),
            });
        }
        Self::verified(dir, p)
    }

    fn verified(checkpoints: &Path, dir: PathBuf) -> Result<Self, CheckpointError> {
        let damaged = |file: PathBuf, reason: String| CheckpointError::Damaged {
            file,
            reason,
            available: list(checkpoints).join(", "),
        };
        let sums_path = dir.join(CHECKSUMS);
        let sums: serde_json::Map<String, serde_json::Value> = fs::read(&sums_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| damaged(sums_path.clone(), "missing or unreadable checksums".into()))?;
        for (name, want) in &sums {
            let f = dir.join(name);
            let bytes = fs::read(&f).map_err(|e| damaged(f.clone(), e.to_string()))?;
            let got = checksum(&bytes);
            if want.as_str() != Some(got.as_str()) {
                return Err(damaged(
                    f,
                    format!("checksum {got}, expected {}", want.as_str().unwrap_or("?")),
                ));
            }
        }
        for required in ["state.json"] {
            if !sums.contains_key(required) {
                return Err(damaged(
                    dir.join(required),
                    "not covered by the checksums".into(),
                ));
            }
        }
        Ok(Self { dir })
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::nn::{Linear, LinearConfig};

    type B = NdArray<f32>;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rlany-ckpt-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("scratch");
        d
    }

    fn write(dir: &Path, step: usize, lin: &Linear<B>) {
        let w = Writer::begin(dir, step).expect("begin");
        w.module("policy", lin).expect("module");
        w.state(&serde_json::json!({ "step": step }))
            .expect("state");
        w.commit(2).expect("commit");
    }

    #[test]
    fn flipped_bytes_are_detected_and_an_older_checkpoint_can_be_named() {
        let dir = scratch("flip");
        let lin: Linear<B> = LinearConfig::new(8, 8).init(&Default::default());
        write(&dir, 1, &lin);
        write(&dir, 2, &lin);
        assert!(Reader::latest(&dir).is_ok());
        // Flip 64 bytes in the middle of the newest weights file.
        let f = dir.join("step-000002").join("policy.mpk");
        let mut bytes = fs::read(&f).expect("weights");
        let (mid, len) = (bytes.len() / 2, bytes.len());
        for b in &mut bytes[mid.saturating_sub(32)..(mid + 32).min(len)] {
            *b ^= 0xA5;
        }
        fs::write(&f, bytes).expect("flip");
        match Reader::latest(&dir) {
            Err(CheckpointError::Damaged {
                file, available, ..
            }) => {
                assert_eq!(file, f);
                assert!(available.contains("step-000001"), "{available}");
            }
            other => panic!("expected Damaged, got {other:?}"),
        }
        let older = Reader::named(&dir, "step-000001").expect("older checkpoint");
        let state: serde_json::Value = older.state().expect("state");
        assert_eq!(state["step"], 1);
        assert!(Reader::named(&dir, "step-000009").is_err());
        // A missing checksum file is damage too.
        fs::remove_file(dir.join("step-000001").join(CHECKSUMS)).expect("rm");
        assert!(matches!(
            Reader::named(&dir, "step-000001"),
            Err(CheckpointError::Damaged { .. })
        ));
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn checksum_hand_computed() {
        // FNV-1a 64 of the empty input is the offset basis; of "a" a known value.
        assert_eq!(checksum(b""), "cbf29ce484222325");
        assert_eq!(checksum(b"a"), "af63dc4c8601ec8c");
    }
}
