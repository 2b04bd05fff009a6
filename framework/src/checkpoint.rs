//! Checkpoints: everything needed to continue a run exactly — weights, optimiser state, the
//! trainer's state (step, every RNG stream, task slots) — written atomically. A checkpoint is
//! assembled in `checkpoints/.tmp-step-N/` and renamed to `checkpoints/step-N/`; only then is
//! the `latest` pointer replaced (itself by an atomic rename). A kill at any moment leaves the
//! previous checkpoint usable.
//!
//! A trained model's frozen parameters (those without a gradient: the base under LoRA
//! adapters) are not written: [`Writer::trainable`] stores a one-element placeholder for each
//! (a tensor of no elements cannot be read back on CUDA), and
//! [`Reader::trainable`] takes them back from the freshly built model the run resumes with,
//! which loaded them from the same pretrained file.

use crate::rundir::{RunDirError, io, write_atomic};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::Optimizer;
use burn::prelude::Backend;
use burn::prelude::{Tensor, TensorData};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Serialize, de::DeserializeOwned};
use std::any::Any;
use std::collections::VecDeque;
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
        "{file}: damaged ({reason}); the checkpoint cannot be used. Name another with --checkpoint <name> (resume, eval, export and generate all take it; this run's other checkpoints: {available})"
    )]
    Damaged {
        /// The damaged (or missing) file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
        /// The run's other checkpoints (the damaged one left out), newest last.
        available: String,
    },
}

/// The file in every checkpoint that lists the checksum of each of its other files.
pub const CHECKSUMS: &str = "checksums.json";

/// The checksum of a file's bytes: its SHA-256 ([`crate::digest::content_key`]), detecting
/// flipped or truncated bytes.
pub fn checksum(bytes: &[u8]) -> String {
    crate::digest::content_key(bytes)
}

/// Whether `bytes` match the checksum `want`: a SHA-256, or the 16-hex-digit FNV-1a that
/// checkpoints written before SHA-256 carry (they still load).
fn matches(bytes: &[u8], want: &str) -> bool {
    if want.len() == 16 {
        format!("{:016x}", crate::digest::Fnv1a::of(bytes)) == want
    } else {
        checksum(bytes) == want
    }
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

    /// Saves a trained model's trainable parameters as `<name>.mpk`: each frozen parameter
    /// (no gradient) is written as a one-element placeholder (see the module docs). A model without
    /// frozen parameters is saved whole, exactly as [`Writer::module`] does.
    pub fn trainable<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        name: &str,
        module: &M,
    ) -> Result<(), CheckpointError> {
        self.module(name, &module.clone().map(&mut EmptyFrozen))
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
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let others = || {
            let all = list(checkpoints);
            let others: Vec<String> = all
                .into_iter()
                .filter(|c| Some(c) != name.as_ref())
                .collect();
            if others.is_empty() {
                "none".to_string()
            } else {
                others.join(", ")
            }
        };
        let damaged = |file: PathBuf, reason: String| CheckpointError::Damaged {
            file,
            reason,
            available: others(),
        };
        let sums_path = dir.join(CHECKSUMS);
        let sums: serde_json::Map<String, serde_json::Value> = fs::read(&sums_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| damaged(sums_path.clone(), "missing or unreadable checksums".into()))?;
        for (name, want) in &sums {
            let f = dir.join(name);
            let bytes = fs::read(&f).map_err(|e| damaged(f.clone(), e.to_string()))?;
            let want = want.as_str().unwrap_or("?");
            if !matches(&bytes, want) {
                let got = checksum(&bytes);
                return Err(damaged(f, format!("checksum {got}, expected {want}")));
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

    /// The checkpoint's name (its directory's, e.g. `step-000040`).
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
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

    /// Loads `<name>.mpk` written by [`Writer::trainable`] into `fresh`: the trainable
    /// parameters from the file, every frozen one kept from `fresh` (shared, not copied).
    pub fn trainable<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        name: &str,
        fresh: M,
        device: &B::Device,
    ) -> Result<M, CheckpointError> {
        let mut frozen = CollectFrozen(VecDeque::new());
        fresh.visit(&mut frozen);
        let loaded = self.module(name, fresh, device)?;
        let mut put = PutFrozen {
            frozen: frozen.0,
            missing: false,
        };
        let model = loaded.map(&mut put);
        if put.missing || !put.frozen.is_empty() {
            return Err(CheckpointError::Record {
                path: self.dir.join(format!("{name}.mpk")),
                message: "its frozen parameters do not match the model's".into(),
            });
        }
        Ok(model)
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

/// Replaces every frozen parameter (no gradient) by a one-element tensor of the same rank.
struct EmptyFrozen;

impl<B: AutodiffBackend> ModuleMapper<B> for EmptyFrozen {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if param.is_require_grad() {
            return param;
        }
        let device = param.device();
        // One element, uploaded: a tensor of no elements cannot be written on CUDA (filling
        // it launches a kernel of zero blocks, and reading it back a copy kernel of zero
        // blocks; the driver refuses both with CUDA_ERROR_INVALID_VALUE, seen on an H200).
        let placeholder = TensorData::new(vec![0.0f32], [1; D]);
        Param::initialized(param.id, Tensor::from_data(placeholder, &device))
    }
}

/// The frozen parameters of a model, in visiting order.
struct CollectFrozen(VecDeque<Box<dyn Any>>);

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectFrozen {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !param.is_require_grad() {
            self.0.push_back(Box::new(param.clone()));
        }
    }
}

/// Puts collected frozen parameters back, in visiting order. `missing` when the file does
/// not fit the model: a trainable parameter was written frozen (a placeholder), a frozen one was
/// written whole, or the counts differ.
struct PutFrozen {
    frozen: VecDeque<Box<dyn Any>>,
    missing: bool,
}

impl<B: AutodiffBackend> ModuleMapper<B> for PutFrozen {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        // A frozen parameter is written as one element (no elements in checkpoints written
        // before 2026-12-04); no parameter of our models is that small.
        let written_frozen = param.shape().num_elements() <= 1;
        if param.is_require_grad() {
            self.missing |= written_frozen;
            return param;
        }
        self.missing |= !written_frozen;
        match self
            .frozen
            .pop_front()
            .and_then(|p| p.downcast::<Param<Tensor<B, D>>>().ok())
        {
            Some(p) => *p,
            None => {
                self.missing = true;
                param
            }
        }
    }
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
                // The damaged checkpoint is not offered as a choice.
                assert!(!available.contains("step-000002"), "{available}");
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
    fn frozen_parameters_are_not_written_and_come_back_from_the_fresh_model() {
        type A = burn::backend::Autodiff<B>;
        let dev = Default::default();
        let make = |w: f32| {
            let mut lin: Linear<A> = LinearConfig::new(64, 64).init(&dev);
            lin.weight =
                Param::from_tensor(Tensor::full([64, 64], w, &dev)).set_require_grad(false);
            lin.bias = Some(Param::from_tensor(Tensor::full([64], w, &dev)));
            lin
        };
        let trained = make(2.0);
        let dir = scratch("frozen");
        let w = Writer::begin(&dir, 1).expect("begin");
        w.trainable("policy", &trained).expect("trainable");
        w.module("whole", &trained).expect("module");
        w.state(&serde_json::json!({ "step": 1 })).expect("state");
        w.commit(2).expect("commit");
        let size = |f: &str| {
            fs::metadata(dir.join("step-000001").join(f))
                .expect("file")
                .len()
        };
        // The 64×64 frozen weight (16 KiB) is not in the file; the 64-value bias is.
        assert!(size("policy.mpk") < 2048, "{}", size("policy.mpk"));
        assert!(size("whole.mpk") > 16384, "{}", size("whole.mpk"));
        // Resumed into a fresh model whose frozen weight is 1 and bias 1: the bias comes from
        // the file (2), the frozen weight from the fresh model (1), still frozen.
        let r = Reader::latest(&dir).expect("reader");
        let back = r.trainable("policy", make(1.0), &dev).expect("load");
        let sum = |t: Tensor<A, 1>| t.sum().into_scalar();
        assert_eq!(sum(back.weight.val().flatten(0, 1)), 64.0 * 64.0);
        assert!(!back.weight.is_require_grad());
        assert_eq!(sum(back.bias.as_ref().expect("bias").val()), 128.0);
        // A model whose frozen parameters differ from those written is refused.
        let mut thawed = make(1.0);
        thawed.weight = thawed.weight.set_require_grad(true);
        thawed.bias = thawed.bias.map(|b| b.set_require_grad(false));
        assert!(matches!(
            r.trainable("policy", thawed, &dev),
            Err(CheckpointError::Record { .. })
        ));
        // Checkpoints written before the one-element placeholder stored no elements at all;
        // they still resume.
        struct NoElements;
        impl ModuleMapper<A> for NoElements {
            fn map_float<const D: usize>(
                &mut self,
                param: Param<Tensor<A, D>>,
            ) -> Param<Tensor<A, D>> {
                if param.is_require_grad() {
                    return param;
                }
                let device = param.device();
                Param::initialized(param.id, Tensor::zeros([0; D], &device))
            }
        }
        let w = Writer::begin(&dir, 2).expect("begin");
        w.module("policy", &trained.clone().map(&mut NoElements))
            .expect("module");
        w.state(&serde_json::json!({ "step": 2 })).expect("state");
        w.commit(2).expect("commit");
        let old = Reader::latest(&dir).expect("reader");
        let back = old.trainable("policy", make(1.0), &dev).expect("load");
        assert_eq!(sum(back.weight.val().flatten(0, 1)), 64.0 * 64.0);
        assert_eq!(sum(back.bias.as_ref().expect("bias").val()), 128.0);
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn checksum_hand_computed() {
        // SHA-256 of the empty input; an older checkpoint's FNV-1a of "a" still matches.
        assert_eq!(
            checksum(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(matches(b"a", "af63dc4c8601ec8c"));
        assert!(!matches(b"b", "af63dc4c8601ec8c"));
        assert!(matches(b"", &checksum(b"")));
    }
}
