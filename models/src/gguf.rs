//! GGUF files (llama.cpp's format): header, metadata, tensors, dequantization, and a
//! [`Transformer`] built from them.
//!
//! # The format (version 2 and 3, little-endian)
//! `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata count; then each metadata
//! entry (a string key, a `u32` value type, the value: integers, floats, bool, strings as
//! `u64` length + UTF-8 bytes, or an array of one type); then each tensor's info (name,
//! `u32` rank, `u64` dims with the fastest-varying first, `u32` ggml type, `u64` offset into
//! the data section); then padding to `general.alignment` (default 32) and the data.
//!
//! # Block types dequantized here (ggml's definitions; 32 values per block)
//! - `Q4_0`: f16 scale `d`, 16 bytes of nibbles; value `j` is the low nibble of byte `j`
//!   and value `j + 16` its high nibble; `x = (q − 8)·d`.
//! - `Q4_1`: f16 `d`, f16 minimum `m`, 16 bytes of nibbles as Q4_0; `x = q·d + m`.
//! - `Q8_0`: f16 `d`, 32 signed bytes; `x = q·d`.
//! - `F32`, `F16`, `BF16` element-wise. Any other type is an error naming it.
//!
//! # Reading without holding the file
//! [`GgufFile::open`] reads only the header, metadata and tensor infos; [`GgufFile::weights`]
//! then reads one tensor at a time (seek + read of its bytes) and dequantizes it to f32, so
//! the peak is the f32 weights plus one tensor's raw bytes — never the file.
//!
//! # Llama's Q/K row order
//! llama.cpp's converter reorders the rows of the query and key projections of `llama`
//! models so that each head's rotary pairs are adjacent (`(x[2i], x[2i+1])`, its kernel's
//! layout). Our [`Transformer`] rotates `(x[i], x[i + head_dim/2])` (Hugging Face's "rotate
//! half"), so [`GgufFile::weights`] puts the rows back: Hugging Face row `j·head_dim/2 + i`
//! of a head is GGUF row `2i + j`. `qwen2` files are not reordered by the converter.

use rlany_kernels::{AttentionOps, BlockFormat, PackedMatrix};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::bpe::{BpeSpec, BpeTokenizer, PreTokenizer};
use crate::error::ModelError;
use crate::packed::PackedWeights;
use crate::transformer::{Transformer, TransformerConfig};
use crate::weights::{HfWeights, HostTensor, transformer_from_hf};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// `f32` or `f64`.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array (of one element type).
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// ggml's tensor types (the ones this reader dequantizes, and the rest by number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit floats.
    F32,
    /// IEEE half floats.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit blocks with a scale.
    Q4_0,
    /// 4-bit blocks with a scale and a minimum.
    Q4_1,
    /// 8-bit blocks with a scale.
    Q8_0,
    /// A type this reader does not dequantize (its ggml number).
    Other(u32),
}

impl GgmlType {
    fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::Bf16,
            other => GgmlType::Other(other),
        }
    }

    /// ggml's name of the type.
    pub fn name(self) -> String {
        let known = [
            (0, "F32"),
            (1, "F16"),
            (2, "Q4_0"),
            (3, "Q4_1"),
            (6, "Q5_0"),
            (7, "Q5_1"),
            (8, "Q8_0"),
            (9, "Q8_1"),
            (10, "Q2_K"),
            (11, "Q3_K"),
            (12, "Q4_K"),
            (13, "Q5_K"),
            (14, "Q6_K"),
            (15, "Q8_K"),
            (24, "I8"),
            (25, "I16"),
            (26, "I32"),
            (27, "I64"),
            (28, "F64"),
            (30, "BF16"),
        ];
        let id = match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Bf16 => 30,
            GgmlType::Other(id) => id,
        };
        known
            .iter()
            .find(|(k, _)| *k == id)
            .map_or_else(|| format!("type {id}"), |(_, n)| (*n).to_string())
    }

    /// `(values per block, bytes per block)`, or `None` for a type not dequantized here.
    fn block(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::Bf16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Other(_) => None,
        }
    }
}

/// One tensor's entry in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// Its name (`blk.3.attn_q.weight`).
    pub name: String,
    /// Dimensions as stored, fastest-varying first (`ne[0]` is a row's length).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The row-major shape, outermost first (the reverse of [`GgufTensorInfo::dims`]).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file: its metadata and tensor infos (tensor data is read on demand).
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    /// Format version.
    pub version: u32,
    /// Metadata by key, in file order.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor infos in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Each metadata entry's key and its bytes' range in the file (key, type and value), in
    /// file order: a writer copies entries verbatim, value types included.
    pub(crate) metadata_spans: Vec<(String, std::ops::Range<u64>)>,
    /// Absolute file offset of the data section.
    data_start: u64,
}

/// Limits that keep a corrupt or hostile header from allocating without bound.
const MAX_STRING: u64 = 64 << 20;
const MAX_ARRAY: u64 = 1 << 26;
const MAX_COUNT: u64 = 1 << 20;
const MAX_RANK: u32 = 8;

/// Little-endian primitive reads with the file named in errors.
struct Reader<R> {
    inner: R,
    path: PathBuf,
}

impl<R: Read> Reader<R> {
    fn err(&self, message: impl Into<String>) -> ModelError {
        ModelError::Load {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], ModelError> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| self.err(format!("truncated GGUF header ({e})")))?;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn string(&mut self) -> Result<String, ModelError> {
        let len = self.u64()?;
        if len > MAX_STRING {
            return Err(self.err(format!("a string of {len} bytes in the header")));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| self.err(format!("truncated GGUF header ({e})")))?;
        String::from_utf8(buf).map_err(|_| self.err("a header string is not UTF-8"))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue, ModelError> {
        Ok(match ty {
            0 => GgufValue::U64(u64::from(self.bytes::<1>()?[0])),
            1 => GgufValue::I64(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => GgufValue::U64(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => GgufValue::I64(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => GgufValue::U64(u64::from(self.u32()?)),
            5 => GgufValue::I64(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => GgufValue::F64(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => GgufValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth > 2 {
                    return Err(self.err("metadata arrays nested too deep"));
                }
                let elem = self.u32()?;
                let n = self.u64()?;
                if n > MAX_ARRAY {
                    return Err(self.err(format!("a metadata array of {n} elements")));
                }
                let mut items = Vec::with_capacity((n as usize).min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.bytes()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.bytes()?)),
            other => return Err(self.err(format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Reads the header, metadata and tensor infos of `path`.
    ///
    /// Not a GGUF file, an unsupported version, a truncated or inconsistent header, or a
    /// tensor that would end past the end of the file is an error naming the file.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let load_err = |message: String| ModelError::Load {
            path: path.to_path_buf(),
            message,
        };
        let file = File::open(path).map_err(|e| load_err(e.to_string()))?;
        let file_len = file.metadata().map_err(|e| load_err(e.to_string()))?.len();
        let mut r = Reader {
            inner: BufReader::new(file),
            path: path.to_path_buf(),
        };
        let magic: [u8; 4] = r.bytes()?;
        if &magic != b"GGUF" {
            return Err(load_err(format!(
                "not a GGUF file (it starts with {magic:?}, not \"GGUF\")"
            )));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(load_err(format!(
                "GGUF version {version} (this reader knows 2 and 3)"
            )));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        if n_tensors > MAX_COUNT || n_kv > MAX_COUNT {
            return Err(load_err(format!(
                "{n_tensors} tensors and {n_kv} metadata entries: a corrupt header"
            )));
        }
        let mut metadata = BTreeMap::new();
        let mut metadata_spans = Vec::with_capacity(n_kv as usize);
        let position = |r: &mut Reader<BufReader<File>>| {
            r.inner
                .stream_position()
                .map_err(|e| load_err(e.to_string()))
        };
        for _ in 0..n_kv {
            let start = position(&mut r)?;
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata_spans.push((key.clone(), start..position(&mut r)?));
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let rank = r.u32()?;
            if rank == 0 || rank > MAX_RANK {
                return Err(load_err(format!("tensor {name} has rank {rank}")));
            }
            let dims = (0..rank).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
            let ty = GgmlType::from_id(r.u32()?);
            let offset = r.u64()?;
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        let header_end = r
            .inner
            .stream_position()
            .map_err(|e| load_err(e.to_string()))?;
        let alignment = metadata
            .get("general.alignment")
            .and_then(GgufValue::as_u64)
            .unwrap_or(32)
            .max(1);
        let data_start = header_end.div_ceil(alignment) * alignment;
        let gguf = GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            metadata_spans,
            data_start,
        };
        for t in &gguf.tensors {
            if let Some(len) = gguf.byte_len(t)? {
                let end = gguf.data_start.saturating_add(t.offset).saturating_add(len);
                if end > file_len {
                    return Err(load_err(format!(
                        "tensor {} ends at byte {end}, past the end of the file ({file_len})",
                        t.name
                    )));
                }
            }
        }
        Ok(gguf)
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, message: impl Into<String>) -> ModelError {
        ModelError::Load {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    /// Bytes of a tensor's data; `None` for a type not dequantized here.
    fn byte_len(&self, t: &GgufTensorInfo) -> Result<Option<u64>, ModelError> {
        let Some((per_block, bytes)) = t.ty.block() else {
            return Ok(None);
        };
        let n = t
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| self.err(format!("tensor {} has an impossible size", t.name)))?;
        if !t.dims[0].is_multiple_of(per_block as u64) {
            return Err(self.err(format!(
                "tensor {}: rows of {} values are not whole {}-value blocks of {}",
                t.name,
                t.dims[0],
                per_block,
                t.ty.name()
            )));
        }
        Ok(Some(n / per_block as u64 * bytes as u64))
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn required_u64(&self, key: &str) -> Result<u64, ModelError> {
        self.get(key)
            .and_then(GgufValue::as_u64)
            .ok_or_else(|| self.err(format!("metadata {key} (an integer) is missing")))
    }

    /// The tensor's values, dequantized to f32, row-major in [`GgufTensorInfo::shape`].
    pub fn read_tensor(&self, t: &GgufTensorInfo) -> Result<HostTensor, ModelError> {
        Ok(HostTensor {
            shape: t.shape(),
            data: dequantize(t.ty, &self.read_raw(t)?),
        })
    }

    /// The tensor's bytes as stored (whole blocks of its type).
    fn read_raw(&self, t: &GgufTensorInfo) -> Result<Vec<u8>, ModelError> {
        let len = self.byte_len(t)?.ok_or_else(|| {
            self.err(format!(
                "tensor {} is {}, which this reader cannot dequantize (it reads F32, F16, \
                 BF16, Q4_0, Q4_1 and Q8_0)",
                t.name,
                t.ty.name()
            ))
        })?;
        let mut file = File::open(&self.path).map_err(|e| self.err(e.to_string()))?;
        file.seek(SeekFrom::Start(self.data_start + t.offset))
            .map_err(|e| self.err(e.to_string()))?;
        let mut raw = vec![0u8; len as usize];
        file.read_exact(&mut raw)
            .map_err(|e| self.err(format!("tensor {}: {e}", t.name)))?;
        Ok(raw)
    }

    /// The architecture in `general.architecture` (`llama` or `qwen2` are read).
    pub fn architecture(&self) -> Result<&str, ModelError> {
        self.get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| self.err("metadata general.architecture is missing"))
    }

    /// The model's configuration from the metadata; `max_seq_len` caps the context length
    /// the file declares (the rotary tables and KV cache are sized by it).
    pub fn config(&self, max_seq_len: Option<usize>) -> Result<TransformerConfig, ModelError> {
        let arch = self.architecture()?.to_string();
        if arch != "llama" && arch != "qwen2" {
            return Err(self.err(format!(
                "architecture {arch:?} (this reader builds llama and qwen2)"
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let d_model = self.required_u64(&key("embedding_length"))? as usize;
        let n_heads = self.required_u64(&key("attention.head_count"))? as usize;
        let n_kv_heads = self
            .get(&key("attention.head_count_kv"))
            .and_then(GgufValue::as_u64)
            .map_or(n_heads, |v| v as usize);
        let embd = self
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .ok_or_else(|| self.err("tensor token_embd.weight is missing"))?;
        let vocab = embd.shape()[0];
        if let Some(v) = self.get(&key("vocab_size")).and_then(GgufValue::as_u64)
            && v as usize != vocab
        {
            return Err(self.err(format!(
                "{} says {v} tokens, token_embd.weight has {vocab} rows",
                key("vocab_size")
            )));
        }
        let context = self.required_u64(&key("context_length"))? as usize;
        if let Some(kind) = self
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
            && kind != "none"
        {
            return Err(self.err(format!(
                "rope scaling {kind:?} is not supported (plain RoPE only)"
            )));
        }
        let config = TransformerConfig::new(
            vocab,
            d_model,
            self.required_u64(&key("block_count"))? as usize,
            n_heads,
            n_kv_heads,
            self.required_u64(&key("feed_forward_length"))? as usize,
            max_seq_len.map_or(context, |m| m.min(context)),
        )
        .with_rope_theta(
            self.get(&key("rope.freq_base"))
                .and_then(GgufValue::as_f64)
                .unwrap_or(10000.0) as f32,
        )
        .with_norm_eps(
            self.get(&key("attention.layer_norm_rms_epsilon"))
                .and_then(GgufValue::as_f64)
                .unwrap_or(1e-5),
        )
        .with_qkv_bias(self.tensors.iter().any(|t| t.name == "blk.0.attn_q.bias"))
        .with_tie_embeddings(!self.tensors.iter().any(|t| t.name == "output.weight"));
        config.validate()?;
        if let Some(rot) = self
            .get(&key("rope.dimension_count"))
            .and_then(GgufValue::as_u64)
            && rot as usize != config.head_dim()
        {
            return Err(self.err(format!(
                "rotary dimension {rot} is not the head dimension {} (partial RoPE is not \
                 supported)",
                config.head_dim()
            )));
        }
        Ok(config)
    }

    /// Every tensor, dequantized and renamed to its Hugging Face name and layout (with
    /// llama's Q/K rows put back in "rotate half" order, see the module docs).
    pub fn weights(&self, config: &TransformerConfig) -> Result<HfWeights, ModelError> {
        let permuted = self.architecture()? == "llama";
        let mut out = HfWeights::new();
        for t in &self.tensors {
            let Some(name) = hf_name(&t.name) else {
                return Err(self.err(format!("tensor {} has no place in the model", t.name)));
            };
            let mut host = self.read_tensor(t)?;
            if let Some(heads) = reordered_heads(permuted, &t.name, config) {
                host = unpermute_rows(host, heads, config.head_dim());
            } else if permuted
                && (t.name.ends_with("attn_q.bias") || t.name.ends_with("attn_k.bias"))
            {
                return Err(self.err(format!(
                    "tensor {}: a llama file with q/k biases is not supported",
                    t.name
                )));
            }
            out.insert(name, host);
        }
        Ok(out)
    }

    /// The file's `Q4_1` and `Q8_0` projections and LM head (or tied embedding) as stored,
    /// for [`Transformer::with_packed`] on the model [`GgufFile::transformer`] builds: the
    /// same rows in the same order (llama's Q/K rows put back as in
    /// [`GgufFile::weights`]), so the blocks hold exactly that model's weights. Tensors of
    /// other types are left out (their products stay dense).
    pub fn packed(&self, config: &TransformerConfig) -> Result<PackedWeights, ModelError> {
        let permuted = self.architecture()? == "llama";
        let mut out = PackedWeights::new(config.n_layers);
        for t in &self.tensors {
            let format = match t.ty {
                GgmlType::Q4_1 => BlockFormat::Q4_1,
                GgmlType::Q8_0 => BlockFormat::Q8_0,
                _ => continue,
            };
            let shape = t.shape();
            let (Some(name), &[rows, cols]) = (hf_name(&t.name), &shape[..]) else {
                continue;
            };
            let mut raw = self.read_raw(t)?;
            if let Some(heads) = reordered_heads(permuted, &t.name, config) {
                let row_bytes = cols / 32 * format.ggml_bytes();
                raw = unpermute(&raw, row_bytes, heads, config.head_dim());
            }
            let matrix = PackedMatrix::from_ggml(format, rows, cols, &raw)
                .map_err(|e| self.err(format!("tensor {}: {e}", t.name)))?;
            out.place(&name, matrix, config.tie_embeddings);
        }
        Ok(out)
    }

    /// The byte-level BPE tokenizer in the metadata (`tokenizer.ggml.*`: model `gpt2`, the
    /// pre-tokenizer named by `pre`, tokens, token types, merges, bos/eos/padding ids; padding
    /// defaults to eos).
    pub fn tokenizer(&self) -> Result<BpeTokenizer, ModelError> {
        BpeTokenizer::new(self.tokenizer_spec()?).map_err(|e| self.err(e.to_string()))
    }

    /// What defines [`GgufFile::tokenizer`], as the metadata holds it.
    pub fn tokenizer_spec(&self) -> Result<BpeSpec, ModelError> {
        let model = self
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| self.err("metadata tokenizer.ggml.model is missing"))?;
        if model != "gpt2" {
            return Err(self.err(format!(
                "tokenizer {model:?} (only byte-level BPE, \"gpt2\", is read)"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            match self.get(key) {
                Some(GgufValue::Array(items)) => items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| self.err(format!("{key} holds a non-string")))
                    })
                    .collect(),
                _ => Err(self.err(format!("metadata {key} (an array of strings) is missing"))),
            }
        };
        let token_types = match self.get("tokenizer.ggml.token_type") {
            Some(GgufValue::Array(items)) => items
                .iter()
                .map(|v| match v {
                    GgufValue::I64(t) => i32::try_from(*t).ok(),
                    GgufValue::U64(t) => i32::try_from(*t).ok(),
                    _ => None,
                })
                .collect::<Option<Vec<i32>>>()
                .ok_or_else(|| self.err("tokenizer.ggml.token_type holds a non-integer"))?,
            _ => Vec::new(),
        };
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            self.get(key)
                .map(|v| {
                    v.as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| self.err(format!("{key} is not a token id")))
                })
                .transpose()
        };
        let bos = id("tokenizer.ggml.bos_token_id")?
            .ok_or_else(|| self.err("metadata tokenizer.ggml.bos_token_id is missing"))?;
        let eos = id("tokenizer.ggml.eos_token_id")?
            .ok_or_else(|| self.err("metadata tokenizer.ggml.eos_token_id is missing"))?;
        let pad = id("tokenizer.ggml.padding_token_id")?.unwrap_or(eos);
        let pre = PreTokenizer::from_gguf_name(
            self.get("tokenizer.ggml.pre")
                .and_then(GgufValue::as_str)
                .unwrap_or("gpt2"),
        )
        .map_err(|e| self.err(e.to_string()))?;
        Ok(BpeSpec {
            tokens: strings("tokenizer.ggml.tokens")?,
            token_types,
            merges: strings("tokenizer.ggml.merges")?,
            bos,
            eos,
            pad,
            pre,
        })
    }

    /// The Jinja chat template in the metadata, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
    }

    /// The model of this file on `device` (see [`GgufFile::config`] for `max_seq_len`).
    pub fn transformer<B: AttentionOps>(
        &self,
        max_seq_len: Option<usize>,
        device: &B::Device,
    ) -> Result<Transformer<B>, ModelError> {
        let config = self.config(max_seq_len)?;
        let weights = self.weights(&config)?;
        transformer_from_hf(&config, weights, device, &self.path)
    }
}

/// The Hugging Face name of a llama.cpp tensor name.
pub(crate) fn hf_name(gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (part, leaf) = rest.rsplit_once('.')?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{leaf}"))
}

/// The heads of tensor `name` when its rows need [`unpermute_rows`]: the query and key
/// weights of a `permuted` (llama) file.
pub(crate) fn reordered_heads(
    permuted: bool,
    name: &str,
    config: &TransformerConfig,
) -> Option<usize> {
    if !permuted {
        None
    } else if name.ends_with("attn_q.weight") {
        Some(config.n_heads)
    } else if name.ends_with("attn_k.weight") {
        Some(config.n_kv_heads)
    } else {
        None
    }
}

/// Puts llama.cpp's interleaved rotary rows back in "rotate half" order: within each head,
/// Hugging Face row `j·half + i` is GGUF row `2i + j` (`i < half = head_dim/2`, `j < 2`).
///
/// # Shapes
/// - `t`: `[heads · head_dim, d_in]`; output: the same
pub(crate) fn unpermute_rows(t: HostTensor, heads: usize, head_dim: usize) -> HostTensor {
    let cols: usize = t.shape.iter().skip(1).product();
    HostTensor {
        data: unpermute(&t.data, cols, heads, head_dim),
        shape: t.shape,
    }
}

/// The inverse of [`unpermute_rows`]: "rotate half" rows in llama.cpp's interleaved order,
/// GGUF row `2i + j` from Hugging Face row `j·half + i` (what its converter writes).
///
/// # Shapes
/// - `t`: `[heads · head_dim, d_in]`; output: the same
pub(crate) fn permute_rows(t: HostTensor, heads: usize, head_dim: usize) -> HostTensor {
    let row_len: usize = t.shape.iter().skip(1).product();
    let half = head_dim / 2;
    let mut data = vec![0.0f32; t.data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let dst = (h * head_dim + 2 * i + j) * row_len;
                let src = (h * head_dim + j * half + i) * row_len;
                data[dst..dst + row_len].copy_from_slice(&t.data[src..src + row_len]);
            }
        }
    }
    HostTensor {
        data,
        shape: t.shape,
    }
}

/// [`unpermute_rows`] on rows of `row_len` elements of any kind (f32 values, or a row's
/// quantized blocks as bytes).
fn unpermute<T: Copy + Default>(
    data: &[T],
    row_len: usize,
    heads: usize,
    head_dim: usize,
) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = (h * head_dim + 2 * i + j) * row_len;
                let dst = (h * head_dim + j * half + i) * row_len;
                out[dst..dst + row_len].copy_from_slice(&data[src..src + row_len]);
            }
        }
    }
    out
}

/// IEEE half to f32 (exact: every half is an f32), by the `half` crate.
fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// bfloat16 to f32 (exact), by the `half` crate.
fn bf16_to_f32(bits: u16) -> f32 {
    half::bf16::from_bits(bits).to_f32()
}

fn half_at(raw: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([raw[at], raw[at + 1]]))
}

/// Values of `raw` (whole blocks of `ty`, see the module docs) as f32.
fn dequantize(ty: GgmlType, raw: &[u8]) -> Vec<f32> {
    match ty {
        GgmlType::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => raw
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        GgmlType::Bf16 => raw
            .chunks_exact(2)
            .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (stride, qs_at) = if ty == GgmlType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            let mut out = Vec::with_capacity(raw.len() / stride * 32);
            for block in raw.chunks_exact(stride) {
                let d = half_at(block, 0);
                let (min, offset) = if ty == GgmlType::Q4_0 {
                    (0.0, 8.0)
                } else {
                    (half_at(block, 2), 0.0)
                };
                let qs = &block[qs_at..qs_at + 16];
                let mut vals = [0.0f32; 32];
                for (j, &q) in qs.iter().enumerate() {
                    vals[j] = (f32::from(q & 0x0f) - offset) * d + min;
                    vals[j + 16] = (f32::from(q >> 4) - offset) * d + min;
                }
                out.extend_from_slice(&vals);
            }
            out
        }
        GgmlType::Q8_0 => {
            let mut out = Vec::with_capacity(raw.len() / 34 * 32);
            for block in raw.chunks_exact(34) {
                let d = half_at(block, 0);
                out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
            out
        }
        GgmlType::Other(_) => Vec::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use burn::prelude::*;

    #[test]
    fn half_floats_hand_checked() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x0000), 0.0);
        assert!(f16_to_f32(0x8000).is_sign_negative());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        // bfloat16 is the top half of an f32: 0x3f80 is 1.0, 0xc040 is -3.0.
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    #[test]
    fn q4_0_q4_1_q8_0_blocks_hand_checked() {
        // Q4_0: d = 0.5 (0x3800); byte j = low nibble j, high nibble j + 16.
        let mut b = vec![0x00, 0x38];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = dequantize(GgmlType::Q4_0, &b);
        assert_eq!(v.len(), 32);
        assert_eq!(v[0], (0.0 - 8.0) * 0.5);
        assert_eq!(v[3], (3.0 - 8.0) * 0.5);
        assert_eq!(v[16], (15.0 - 8.0) * 0.5);
        assert_eq!(v[31], (0.0 - 8.0) * 0.5);

        // Q4_1: d = 2 (0x4000), m = -1 (0xbc00).
        let mut b = vec![0x00, 0x40, 0x00, 0xbc];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = dequantize(GgmlType::Q4_1, &b);
        assert_eq!(v[1], 1.0 * 2.0 - 1.0);
        assert_eq!(v[17], 14.0 * 2.0 - 1.0);

        // Q8_0: d = 0.25 (0x3400), signed bytes.
        let mut b = vec![0x00, 0x34];
        b.extend((0..32i8).map(|j| (j - 16) as u8));
        let v = dequantize(GgmlType::Q8_0, &b);
        assert_eq!(v[0], -4.0);
        assert_eq!(v[31], 15.0 * 0.25);

        // BF16 1.5 = 0x3fc0; F32 and F16 little-endian.
        assert_eq!(dequantize(GgmlType::Bf16, &[0xc0, 0x3f]), vec![1.5]);
        assert_eq!(dequantize(GgmlType::F16, &[0x00, 0x3c]), vec![1.0]);
        assert_eq!(
            dequantize(GgmlType::F32, &2.5f32.to_le_bytes()),
            vec![2.5f32]
        );
    }

    #[test]
    fn unpermute_inverts_llama_cpp_row_order() {
        // One head, head_dim 4, one column: HF rows [a0 a1 b0 b1] (pairs (a_i, b_i)) are
        // stored by llama.cpp as [a0 b0 a1 b1].
        let stored = HostTensor {
            shape: vec![8, 1],
            data: vec![10.0, 20.0, 11.0, 21.0, 30.0, 40.0, 31.0, 41.0],
        };
        let hf = unpermute_rows(stored, 2, 4);
        assert_eq!(
            hf.data,
            vec![10.0, 11.0, 20.0, 21.0, 30.0, 31.0, 40.0, 41.0]
        );
    }

    #[test]
    fn names_map_to_hugging_face() {
        assert_eq!(
            hf_name("blk.12.attn_output.weight").as_deref(),
            Some("model.layers.12.self_attn.o_proj.weight")
        );
        assert_eq!(
            hf_name("blk.0.attn_q.bias").as_deref(),
            Some("model.layers.0.self_attn.q_proj.bias")
        );
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn not_gguf_truncated_and_missing_files_are_errors() {
        let dir = std::env::temp_dir().join(format!("rlany-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let bad = dir.join("bad.gguf");
        std::fs::write(&bad, b"GGML....").expect("write");
        let e = GgufFile::open(&bad).expect_err("bad magic");
        assert!(e.to_string().contains("not a GGUF file"), "{e}");
        let trunc = dir.join("trunc.gguf");
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        std::fs::write(&trunc, &bytes).expect("write");
        let e = GgufFile::open(&trunc).expect_err("truncated");
        assert!(e.to_string().contains("truncated"), "{e}");
        assert!(e.to_string().contains("trunc.gguf"), "{e}");
        let e = GgufFile::open(&dir.join("absent.gguf")).expect_err("absent");
        assert!(e.to_string().contains("absent.gguf"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The committed tiny GGUF (models/fixtures/make_tiny.py: a 2-block llama whose tensors
    /// are Q4_0, Q4_1, Q8_0, F16, BF16 and F32, with llama.cpp's Q/K row order) gives the
    /// logits of the script's numpy forward on the same dequantized weights in Hugging Face
    /// layout. Both sides compute in f32 on identical values: 1e-4 leaves room for summation
    /// order only, while a wrong block layout or row order moves logits by ~0.1 or more.
    #[test]
    fn tiny_gguf_matches_numpy_reference() {
        use burn::backend::NdArray;
        use rlany_framework::CausalLm;
        type B = NdArray<f32>;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let gguf = GgufFile::open(&dir.join("tiny.gguf")).expect("open");
        let types: std::collections::BTreeSet<String> =
            gguf.tensors.iter().map(|t| t.ty.name()).collect();
        for ty in ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "F32"] {
            assert!(types.contains(ty), "{ty} missing from {types:?}");
        }
        let config = gguf.config(None).expect("config");
        assert_eq!(
            (
                config.vocab_size,
                config.d_model,
                config.n_layers,
                config.n_heads
            ),
            (300, 64, 2, 4)
        );
        assert!(!config.tie_embeddings && config.n_kv_heads == 2);
        let device = Default::default();
        let model: Transformer<B> = gguf.transformer(None, &device).expect("model");
        let fixture: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("tiny_logits.json")).expect("fixture"),
        )
        .expect("json");
        let mut worst = 0.0f64;
        for case in fixture["tiny.gguf"]["cases"].as_array().expect("cases") {
            let ids: Vec<i64> = ids(&case["tokens"]).into_iter().map(i64::from).collect();
            let seq = ids.len();
            let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, seq]), &device);
            let ours = model
                .forward(tokens)
                .into_data()
                .into_vec::<f32>()
                .expect("f32");
            let want: Vec<f64> = case["logits"]
                .as_array()
                .expect("logits")
                .iter()
                .flat_map(|row| row.as_array().expect("row").clone())
                .map(|v| v.as_f64().expect("v"))
                .collect();
            assert_eq!(ours.len(), want.len());
            for (a, b) in ours.iter().zip(&want) {
                worst = worst.max((f64::from(*a) - b).abs());
            }
        }
        assert!(worst < 1e-4, "max |diff| {worst}");
    }

    /// A tensor of a type the reader does not dequantize is an error naming it and the
    /// types it reads.
    #[test]
    fn unsupported_tensor_type_is_named() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let mut gguf = GgufFile::open(&dir.join("tiny.gguf")).expect("open");
        gguf.tensors[0].ty = GgmlType::Other(12);
        let info = gguf.tensors[0].clone();
        let e = gguf.read_tensor(&info).expect_err("Q4_K");
        assert!(e.to_string().contains("Q4_K"), "{e}");
        assert!(e.to_string().contains("Q4_1 and Q8_0"), "{e}");
    }

    /// Token ids of a fixture's JSON array.
    pub(crate) fn ids(v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .expect("an array of ids")
            .iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()).expect("id"))
            .collect()
    }

    /// The pretrained model fetched by `models/fetch-smollm2.sh` (absent on a fresh clone),
    /// or `None` with a skip message.
    pub(crate) fn smollm2() -> Option<PathBuf> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("pretrained/SmolLM2-135M-Instruct.Q4_1.gguf");
        if path.exists() {
            Some(path)
        } else if std::env::var_os("RLANY_REQUIRE_MODELS").is_some() {
            // CI (`.ci/run`) sets it: a real-model test that cannot run is a failure there.
            panic!(
                "{} is absent and RLANY_REQUIRE_MODELS is set: `bash models/fetch-smollm2.sh` fetches it",
                path.display()
            );
        } else {
            eprintln!(
                "skipped: {} is absent; `bash models/fetch-smollm2.sh` fetches it",
                path.display()
            );
            None
        }
    }

    /// Our logits on the real model against llama.cpp's (models/fixtures/smollm2_reference.json,
    /// made by make_smollm2_reference.py from the same file): 100 positions of 4 prompts, at
    /// each the 5 largest logits and 16 probe ids, and the row mean.
    ///
    /// The reference is llama.cpp run on its own all-F32 dequantization of the file, so both
    /// sides compute in f32 on the same weight values; what is left is summation order and
    /// `exp`/`sqrt` rounding through 30 blocks on logits of magnitude ~30. Measured
    /// (2026-12-01): max |diff| 0.029, mean 0.0038. Bounds: 0.1 and 0.01. A layout error (Q/K
    /// rows, RoPE pairs, a transposed weight) moves logits by whole units; llama.cpp's own
    /// Q4_1 run, which rounds activations to 8 bits, is off by up to 2.6 (mean 0.21).
    #[test]
    fn gguf_smollm2_logits_match_llama_cpp() {
        use burn::backend::NdArray;
        use rlany_framework::CausalLm;
        type B = NdArray<f32>;
        let Some(path) = smollm2() else { return };
        let fixture: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/smollm2_reference.json"),
            )
            .expect("fixture"),
        )
        .expect("fixture json");
        let gguf = GgufFile::open(&path).expect("open");
        let config = gguf.config(Some(128)).expect("config");
        assert_eq!(
            (
                config.vocab_size,
                config.d_model,
                config.n_layers,
                config.n_heads
            ),
            (49152, 576, 30, 9)
        );
        assert_eq!((config.n_kv_heads, config.ffn_hidden), (3, 1536));
        assert!(config.tie_embeddings && !config.qkv_bias);
        let device = Default::default();
        let model: Transformer<B> = gguf.transformer(Some(128), &device).expect("model");
        let probes: Vec<usize> = ids(&fixture["probes"])
            .into_iter()
            .map(|id| id as usize)
            .collect();
        let (mut worst, mut sum, mut n) = (0.0f64, 0.0f64, 0usize);
        for prompt in fixture["prompts"].as_array().expect("prompts") {
            let prompt_ids = ids(&prompt["ids"]);
            let seq = prompt_ids.len();
            let wide: Vec<i64> = prompt_ids.iter().map(|&t| i64::from(t)).collect();
            let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(wide, [1, seq]), &device);
            let logits = model
                .forward(tokens)
                .into_data()
                .into_vec::<f32>()
                .expect("f32");
            let vocab = config.vocab_size;
            for (pos, reference) in prompt["positions"]
                .as_array()
                .expect("positions")
                .iter()
                .enumerate()
            {
                let row = &logits[pos * vocab..(pos + 1) * vocab];
                let mut pairs: Vec<(usize, f64)> = reference["top"]
                    .as_array()
                    .expect("top")
                    .iter()
                    .map(|p| {
                        (
                            p[0].as_u64().expect("id") as usize,
                            p[1].as_f64().expect("v"),
                        )
                    })
                    .collect();
                pairs.extend(
                    probes.iter().copied().zip(
                        reference["probe"]
                            .as_array()
                            .expect("probe")
                            .iter()
                            .map(|v| v.as_f64().expect("v")),
                    ),
                );
                for (id, want) in pairs {
                    let d = (f64::from(row[id]) - want).abs();
                    worst = worst.max(d);
                    sum += d;
                    n += 1;
                }
                let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / vocab as f64;
                let want_mean = reference["mean"].as_f64().expect("mean");
                assert!(
                    (mean - want_mean).abs() < 0.05,
                    "row mean {mean} vs {want_mean}"
                );
            }
            // The KV-cache path: the greedy continuation equals llama.cpp's (12 tokens or up
            // to its end of message).
            let want = ids(&prompt["greedy"]);
            let params = rlany_framework::SampleParams {
                temperature: 0.0,
                top_p: 1.0,
                max_new_tokens: want.len(),
                stop_tokens: vec![2],
                on_device: false,
            };
            let got = model.generate(&[prompt_ids], &params, &mut rlany_framework::Rng::new(1));
            assert_eq!(
                got[0].tokens, want,
                "greedy continuation of {:?}",
                prompt["text"]
            );
        }
        let mean_diff = sum / n as f64;
        eprintln!("{n} logits compared: max |diff| {worst:.4}, mean |diff| {mean_diff:.5}");
        assert!(worst < 0.1, "max |diff| {worst}");
        assert!(mean_diff < 0.01, "mean |diff| {mean_diff}");
    }
}
