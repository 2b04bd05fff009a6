//! Writing a trained model back into its source's GGUF format, for llama.cpp and the tools
//! built on it.
//!
//! The written file is the source GGUF with new weights: every metadata entry is copied
//! byte for byte (value types included: llama.cpp checks them; the tokenizer, the chat
//! template and the architecture's hyper-parameters come along), except `general.file_type`,
//! which names the new type; the tensors are the source's, in its order, with its names and
//! dimensions, holding the model's weights (LoRA adapters merged). Norm vectors (rank 1)
//! are written `F32`, matrices `F16` or `Q8_0` as asked (a matrix whose rows are not whole
//! 32-value blocks falls back to `F16`). A `llama` file's query and key rows are put back in
//! llama.cpp's interleaved rotary order ([`crate::gguf`] module docs), the inverse of what
//! the reader does.
//!
//! # Block encodings (ggml's reference quantizers)
//! - `F16`: each value rounded to the nearest half (ties to even).
//! - `Q8_0`: per block of 32, `d = max|x| / 127` stored as a half, `q = round(x / d)` (halves
//!   away from zero) as 32 signed bytes; a block of zeros has `d = 0`, `q = 0`.
//!
//! # Layout written (GGUF version 3)
//! `"GGUF"`, `u32` 3, `u64` tensor count, `u64` metadata count, the metadata entries, the
//! tensor infos (each offset relative to the data section, a multiple of the alignment),
//! zero padding to `general.alignment` (default 32), then each tensor's bytes padded to it.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::ModelError;
use crate::gguf::{GgmlType, GgufFile, GgufValue, hf_name, permute_rows, reordered_heads};
use crate::transformer::Transformer;
use crate::weights::transformer_to_hf;
use rlany_kernels::AttentionOps;

/// The type a GGUF export stores its matrices in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    /// Half precision (`general.file_type` 1, llama.cpp's `MOSTLY_F16`).
    F16,
    /// 8-bit blocks of 32 with a half scale (`general.file_type` 7, `MOSTLY_Q8_0`).
    Q8_0,
}

impl GgufType {
    /// The ggml type of a matrix whose rows hold `row_len` values.
    fn matrix_type(self, row_len: u64) -> GgmlType {
        match self {
            GgufType::Q8_0 if row_len.is_multiple_of(32) => GgmlType::Q8_0,
            _ => GgmlType::F16,
        }
    }

    /// llama.cpp's `general.file_type` for a file of this type.
    fn file_type(self) -> u32 {
        match self {
            GgufType::F16 => 1,
            GgufType::Q8_0 => 7,
        }
    }
}

/// ggml's id of a type this writer stores.
fn type_id(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        _ => 8,
    }
}

/// `values` encoded as `ty` (`F32`, `F16` or `Q8_0`; for `Q8_0` a whole number of blocks).
pub fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::Q8_0 => values
            .chunks(32)
            .flat_map(|block| {
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
                let mut out = half::f16::from_f32(d).to_le_bytes().to_vec();
                out.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
                out
            })
            .collect(),
        _ => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

/// Writes `model` (the model `source` was loaded into, then trained) to `out` as a GGUF file
/// of matrices in `ty`; see the module docs. Returns the bytes written.
///
/// A source tensor the model does not have (another architecture, a rotary-frequency
/// table) or of another shape is an error naming it; nothing is written then.
pub fn save_gguf<B: AttentionOps>(
    model: &Transformer<B>,
    source: &GgufFile,
    out: &Path,
    ty: GgufType,
) -> Result<u64, ModelError> {
    let save_err = |message: String| ModelError::Save {
        path: out.to_path_buf(),
        message,
    };
    let config = model.config().clone();
    let weights = if model.has_lora() {
        transformer_to_hf(&model.clone().merge_lora())
    } else {
        transformer_to_hf(model)
    };
    let permuted = source.architecture()? == "llama";
    // Every tensor's bytes first, so that a missing or misshapen one writes nothing.
    let mut tensors = Vec::with_capacity(source.tensors.len());
    for t in &source.tensors {
        let host = hf_name(&t.name)
            .and_then(|hf| weights.get(&hf))
            .ok_or_else(|| save_err(format!("the model has no tensor for {}", t.name)))?;
        if host.shape != t.shape() {
            return Err(save_err(format!(
                "{}: the model's tensor is {:?}, the source's {:?}",
                t.name,
                host.shape,
                t.shape()
            )));
        }
        let values = match reordered_heads(permuted, &t.name, &config) {
            Some(heads) => permute_rows(host.clone(), heads, config.head_dim()).data,
            None => host.data.clone(),
        };
        let stored = match t.dims.len() {
            1 => GgmlType::F32,
            _ => ty.matrix_type(t.dims[0]),
        };
        tensors.push((t, stored, encode(stored, &values)));
    }
    let alignment = source
        .get("general.alignment")
        .and_then(GgufValue::as_u64)
        .unwrap_or(32)
        .max(1);
    let file = File::create(out).map_err(|e| save_err(e.to_string()))?;
    let mut w = BufWriter::new(file);
    let mut src = File::open(source.path()).map_err(|e| save_err(e.to_string()))?;
    let io = |e: std::io::Error| save_err(e.to_string());
    let string = |w: &mut BufWriter<File>, s: &str| -> std::io::Result<()> {
        w.write_all(&(s.len() as u64).to_le_bytes())?;
        w.write_all(s.as_bytes())
    };
    const FILE_TYPE: &str = "general.file_type";
    let has_file_type = source.metadata_spans.iter().any(|(k, _)| k == FILE_TYPE);
    let n_kv = source.metadata_spans.len() + usize::from(!has_file_type);
    w.write_all(b"GGUF").map_err(io)?;
    w.write_all(&3u32.to_le_bytes()).map_err(io)?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&(n_kv as u64).to_le_bytes()).map_err(io)?;
    let mut written = 24u64;
    let file_type = |w: &mut BufWriter<File>| -> std::io::Result<u64> {
        string(w, FILE_TYPE)?;
        w.write_all(&4u32.to_le_bytes())?; // u32
        w.write_all(&ty.file_type().to_le_bytes())?;
        Ok(8 + FILE_TYPE.len() as u64 + 8)
    };
    for (key, span) in &source.metadata_spans {
        if key == FILE_TYPE {
            written += file_type(&mut w).map_err(io)?;
            continue;
        }
        let mut bytes = vec![0u8; (span.end - span.start) as usize];
        src.seek(SeekFrom::Start(span.start)).map_err(io)?;
        src.read_exact(&mut bytes).map_err(io)?;
        w.write_all(&bytes).map_err(io)?;
        written += bytes.len() as u64;
    }
    if !has_file_type {
        written += file_type(&mut w).map_err(io)?;
    }
    let mut offset = 0u64;
    for (t, stored, bytes) in &tensors {
        string(&mut w, &t.name).map_err(io)?;
        w.write_all(&(t.dims.len() as u32).to_le_bytes())
            .map_err(io)?;
        for d in &t.dims {
            w.write_all(&d.to_le_bytes()).map_err(io)?;
        }
        w.write_all(&type_id(*stored).to_le_bytes()).map_err(io)?;
        w.write_all(&offset.to_le_bytes()).map_err(io)?;
        written += 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8;
        offset += (bytes.len() as u64).div_ceil(alignment) * alignment;
    }
    let pad = |w: &mut BufWriter<File>, at: u64| -> std::io::Result<u64> {
        let n = at.div_ceil(alignment) * alignment - at;
        w.write_all(&vec![0u8; n as usize])?;
        Ok(n)
    };
    written += pad(&mut w, written).map_err(io)?;
    for (_, _, bytes) in &tensors {
        w.write_all(bytes).map_err(io)?;
        written += bytes.len() as u64;
        written += pad(&mut w, written).map_err(io)?;
    }
    w.flush().map_err(io)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::unpermute_rows;
    use crate::weights::HostTensor;
    use burn::backend::NdArray;
    use burn::prelude::*;
    use rlany_framework::CausalLm;

    type B = NdArray<f32>;

    #[test]
    fn q8_0_and_f16_blocks_are_ggmls() {
        // A block whose largest magnitude is 2.54: d = 0.02, q = round(x / 0.02).
        let mut block = vec![0.0f32; 32];
        block[0] = 2.54;
        block[1] = -1.0;
        block[2] = 0.011; // 0.55 → 1
        block[3] = -0.031; // -1.55 → -2
        let bytes = encode(GgmlType::Q8_0, &block);
        assert_eq!(bytes.len(), 34);
        let d = half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
        assert!((d - 0.02).abs() < 1e-5, "{d}");
        assert_eq!(&bytes[2..6], &[127u8, (-50i8) as u8, 1, (-2i8) as u8]);
        assert!(bytes[6..].iter().all(|&b| b == 0));
        // Zeros: d = 0, every q = 0.
        assert!(encode(GgmlType::Q8_0, &[0.0; 32]).iter().all(|&b| b == 0));
        // 1.0 and -2.0 in half: 0x3c00, 0xc000.
        assert_eq!(
            encode(GgmlType::F16, &[1.0, -2.0]),
            vec![0x00, 0x3c, 0x00, 0xc0]
        );
    }

    #[test]
    fn permute_is_the_inverse_of_the_readers_unpermute() {
        let t = HostTensor {
            shape: vec![8, 3],
            data: (0..24).map(|v| v as f32).collect(),
        };
        let back = unpermute_rows(permute_rows(t.clone(), 2, 4), 2, 4);
        assert_eq!(back, t);
        // One head of 4 rows: HF rows [a0 a1 b0 b1] are stored [a0 b0 a1 b1].
        let hf = HostTensor {
            shape: vec![4, 1],
            data: vec![10.0, 11.0, 20.0, 21.0],
        };
        assert_eq!(permute_rows(hf, 1, 4).data, vec![10.0, 20.0, 11.0, 21.0]);
    }

    /// The committed tiny llama GGUF (six tensor types), its model exported as F16 and as
    /// Q8_0 and read back by the reader: the metadata is the source's (file type aside), the
    /// tensors have the source's names, dimensions and order, and the logits stay within the
    /// rounding of the type (measured: F16 0.003, Q8_0 0.035 of logits up to 2.6).
    #[test]
    fn a_tiny_model_round_trips_through_f16_and_q8_0() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let source = GgufFile::open(&fixtures.join("tiny.gguf")).expect("open");
        let device = Default::default();
        let model: Transformer<B> = source.transformer(None, &device).expect("model");
        let dir = std::env::temp_dir().join(format!("rlany-gguf-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ids: Vec<i64> = vec![1, 17, 250, 3, 99, 42, 7];
        let logits = |m: &Transformer<B>| -> Vec<f32> {
            let tokens =
                Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [1, 7]), &device);
            m.forward(tokens)
                .into_data()
                .into_vec::<f32>()
                .expect("f32")
        };
        let want = logits(&model);
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (ty, tol, name) in [
            (GgufType::F16, 0.003, "F16"),
            (GgufType::Q8_0, 0.03, "Q8_0"),
        ] {
            let path = dir.join(format!("tiny-{name}.gguf"));
            let n = save_gguf(&model, &source, &path, ty).expect("save");
            assert_eq!(n, std::fs::metadata(&path).expect("written").len());
            let back = GgufFile::open(&path).expect("reopen");
            for (k, v) in &source.metadata {
                if k != "general.file_type" {
                    assert_eq!(back.get(k), Some(v), "{k}");
                }
            }
            assert_eq!(
                back.get("general.file_type").and_then(GgufValue::as_u64),
                Some(u64::from(ty.file_type()))
            );
            let layout = |g: &GgufFile| -> Vec<(String, Vec<u64>)> {
                g.tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.dims.clone()))
                    .collect()
            };
            assert_eq!(layout(&back), layout(&source));
            assert!(back.tensors.iter().any(|t| t.ty.name() == name));
            let reread: Transformer<B> = back.transformer(None, &device).expect("model");
            let got = logits(&reread);
            let worst = got
                .iter()
                .zip(&want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst < tol * scale.max(1.0),
                "{name}: max |diff| {worst} (scale {scale})"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
