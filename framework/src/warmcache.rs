//! A cache of warm-started models, shared by every run whose warm-start inputs are identical
//! (the rows of an ablation differ in what comes after the warm start, not in it).
//!
//! An entry is keyed by a content hash of every input the warm-start code reads — for the
//! policy: the environment's settings, the model source, `policy.warm_start`,
//! `algorithm.max_grad_norm`, `kernels`; for the judge also its model and warm start,
//! `policy.sampling` and `budget.max_env_steps` (it learns from the warm policy's rollouts,
//! so the policy's key is part of it) — plus the seed, the backend and [`VERSION`], bumped
//! whenever the warm-start code changes what it computes. An entry holds the model's weights
//! (full precision: a hit reloads them bit for bit) and the `warm/*` metrics, with checksums;
//! it is written to a temporary folder and renamed, so a kill never leaves half an entry.
//! A damaged or unreadable entry is a miss.
//!
//! Within one process a key is computed once: [`WarmCache::claim`] makes a second run that
//! needs the same warm start wait for the first to store it (the suite runs rows of one seed
//! on several threads), then load it.

use crate::digest::content_key;
use crate::rundir::{io, write_atomic};
use burn::module::Module;
use burn::prelude::Backend;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, PoisonError};

/// Entries being computed in this process (cache folder joined with key), and the signal
/// that one of them was released.
static BUSY: (Mutex<BTreeSet<PathBuf>>, Condvar) = (Mutex::new(BTreeSet::new()), Condvar::new());

/// A claim on one entry: while it lives, no other thread of this process holds a claim on
/// the same entry. Dropping it releases the entry and wakes the waiters.
#[derive(Debug)]
pub struct Claim {
    entry: PathBuf,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let (busy, released) = &BUSY;
        busy.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.entry);
        released.notify_all();
    }
}

/// Bump when the warm-start code changes what it computes: old entries then miss.
/// 2: the LM head at scored positions and the shared prefix (reports/perf/NOTES.md §9c),
/// and attention that recomputes its probabilities in the backward pass (§9d): both reorder
/// floating-point sums.
pub const VERSION: u32 = 2;

/// The cache folder.
#[derive(Debug, Clone)]
pub struct WarmCache {
    dir: PathBuf,
}

/// The content key of one warm start: the SHA-256 of the canonical JSON of its inputs (64 hex
/// digits).
pub fn key(inputs: &Value) -> String {
    content_key(format!("v{VERSION}:{inputs}").as_bytes())
}

impl WarmCache {
    /// A cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Claims the entry `key`, waiting while another thread holds it: hold the claim from
    /// looking the entry up until it is stored, so a warm start is computed once. `on_wait`
    /// runs once, before the wait, when there is one (to say why nothing moves).
    pub fn claim(&self, key: &str, on_wait: impl FnOnce()) -> Claim {
        let entry = self.dir.join(key);
        let (busy, released) = &BUSY;
        let mut held = busy.lock().unwrap_or_else(PoisonError::into_inner);
        let mut on_wait = Some(on_wait);
        while held.contains(&entry) {
            if let Some(say) = on_wait.take() {
                say();
            }
            held = released.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        held.insert(entry.clone());
        Claim { entry }
    }

    /// The weights and metrics stored under `key`, loaded into `module`; `None` on a miss
    /// (absent, incomplete or damaged entry).
    pub fn load<B: Backend, M: Module<B>>(
        &self,
        key: &str,
        module: M,
        device: &B::Device,
    ) -> Option<(M, BTreeMap<String, f64>)> {
        let entry = self.dir.join(key);
        let meta = self.intact(key)?;
        let record = NamedMpkFileRecorder::<FullPrecisionSettings>::new()
            .load(entry.join("model"), device)
            .ok()?;
        let metrics = meta
            .get("metrics")?
            .as_object()?
            .iter()
            .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
            .collect();
        Some((module.load_record(record), metrics))
    }

    /// Stores `module` and its `warm/*` metrics under `key` (atomically; an entry another run
    /// wrote first is kept). `inputs` is recorded beside them for people reading the cache.
    pub fn store<B: Backend, M: Module<B>>(
        &self,
        key: &str,
        inputs: &Value,
        module: &M,
        metrics: &BTreeMap<String, f64>,
    ) -> Result<(), crate::checkpoint::CheckpointError> {
        let entry = self.dir.join(key);
        if self.intact(key).is_some() {
            return Ok(());
        }
        let _ = fs::remove_dir_all(&entry);
        let tmp = self.dir.join(format!(".tmp-{key}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        NamedMpkFileRecorder::<FullPrecisionSettings>::new()
            .record(module.clone().into_record(), tmp.join("model"))
            .map_err(|e| crate::checkpoint::CheckpointError::Record {
                path: tmp.join("model.mpk"),
                message: e.to_string(),
            })?;
        let weights = fs::read(tmp.join("model.mpk")).map_err(io(&tmp.join("model.mpk")))?;
        let mut m = Map::new();
        for (k, v) in metrics {
            m.insert(k.clone(), Value::from(*v));
        }
        let meta = serde_json::json!({
            "version": VERSION,
            "inputs": inputs,
            "metrics": m,
            "model_checksum": content_key(&weights),
        });
        let bytes = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        write_atomic(&tmp.join("warm.json"), &bytes)?;
        if fs::rename(&tmp, &entry).is_err() {
            // Another run stored the same entry meanwhile: keep theirs.
            let _ = fs::remove_dir_all(&tmp);
        }
        Ok(())
    }

    /// The entry `key`'s `warm.json` when the entry is complete and its weights match their
    /// checksum.
    fn intact(&self, key: &str) -> Option<Value> {
        let entry = self.dir.join(key);
        let meta: Value = serde_json::from_slice(&fs::read(entry.join("warm.json")).ok()?).ok()?;
        let want = meta.get("model_checksum")?.as_str()?;
        let got = content_key(&fs::read(entry.join("model.mpk")).ok()?);
        (got == want).then_some(meta)
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// An environment's settings as written in an experiment file (`{"Name": {fields}}`) less
/// `fields`: what a warm start's key holds of settings that change only the oracle's labels
/// ([`crate::plugin::EnvironmentPlugin::label_only_fields`]).
pub fn without_fields(mut env: serde_json::Value, fields: &[&str]) -> serde_json::Value {
    if let Some(settings) = env
        .as_object_mut()
        .and_then(|o| o.values_mut().next())
        .and_then(serde_json::Value::as_object_mut)
    {
        for f in fields {
            settings.remove(*f);
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::nn::{Linear, LinearConfig};

    type B = NdArray<f32>;

    #[test]
    fn a_stored_entry_reloads_bit_for_bit_and_damage_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("rlany-warm-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let cache = WarmCache::new(&dir);
        let dev = Default::default();
        let lin: Linear<B> = LinearConfig::new(4, 3).init(&dev);
        // Burn initialises parameters lazily: read them once so the stored and the compared
        // values are the same draw.
        let stored = lin.weight.val().into_data().to_vec::<f32>().expect("f32");
        let inputs = serde_json::json!({ "lr": 0.003, "seed": 1 });
        let k = key(&inputs);
        assert_eq!(k.len(), 64);
        assert_ne!(k, key(&serde_json::json!({ "lr": 0.003, "seed": 2 })));
        let fresh: Linear<B> = LinearConfig::new(4, 3).init(&dev);
        assert!(cache.load(&k, fresh.clone(), &dev).is_none(), "empty cache");
        let metrics = BTreeMap::from([("warm/policy_loss".to_string(), 0.1 + 0.2)]);
        cache.store(&k, &inputs, &lin, &metrics).expect("store");
        let (got, m) = cache.load(&k, fresh.clone(), &dev).expect("hit");
        assert_eq!(m, metrics, "metrics round-trip exactly");
        let loaded = got.weight.val().into_data().to_vec::<f32>().expect("f32");
        assert_eq!(stored, loaded);
        // Damage → miss.
        let f = dir.join(&k).join("model.mpk");
        let mut bytes = fs::read(&f).expect("weights");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        fs::write(&f, bytes).expect("damage");
        assert!(cache.load(&k, fresh.clone(), &dev).is_none());
        // Storing again repairs the entry.
        cache
            .store(&k, &inputs, &lin, &metrics)
            .expect("store again");
        assert!(cache.load(&k, fresh, &dev).is_some());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_claimed_entry_waits_for_its_release_and_other_keys_do_not() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Duration;
        let cache = WarmCache::new(std::env::temp_dir().join("rlany-warm-claim"));
        let waited = AtomicBool::new(false);
        let first = cache.claim("k1", || waited.store(true, Ordering::SeqCst));
        // Another key is free at once.
        drop(cache.claim("k2", || waited.store(true, Ordering::SeqCst)));
        assert!(!waited.load(Ordering::SeqCst), "no wait, no message");
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let _second = cache.claim("k1", || waited.store(true, Ordering::SeqCst));
                // The claim is granted only after the first was dropped.
                released.load(Ordering::SeqCst)
            });
            // Release only once the waiter has said that it waits (no race on a slow start).
            let start = std::time::Instant::now();
            while !waited.load(Ordering::SeqCst) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the waiter never waited"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            released.store(true, Ordering::SeqCst);
            drop(first);
            assert!(
                waiter.join().expect("waiter"),
                "second claim granted too early"
            );
        });
    }

    #[test]
    fn label_only_fields_leave_the_key() {
        let a = serde_json::json!({"Household": {"difficulty": [0.6], "label": "Belief"}});
        let b = serde_json::json!({"Household": {"difficulty": [0.6]}});
        assert_eq!(without_fields(a.clone(), &["label"]), b);
        assert_eq!(without_fields(a.clone(), &[]), a);
        // A unit variant or a non-object is left as it is.
        let unit = serde_json::json!("Static");
        assert_eq!(without_fields(unit.clone(), &["label"]), unit);
    }
}
