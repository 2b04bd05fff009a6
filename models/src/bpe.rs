//! A GPT-2-style byte-level BPE tokenizer for pretrained models (SmolLM2, Qwen2, GPT-2).
//!
//! Text is cut in three stages, as llama.cpp's `llama-vocab.cpp` does it:
//!
//! 1. **Special tokens.** Every literal occurrence of a special token's text (control,
//!    unknown and user-defined tokens, e.g. `<|im_start|>`) becomes that token's id. The
//!    special tokens are tried longest first: each one splits what the longer ones left as
//!    plain text.
//! 2. **Pre-tokenization.** Each stretch of plain text is split into pieces by the model's
//!    [`PreTokenizer`] (a regex, with GPT-2's `\s+(?!\S)` look-ahead emulated by hand).
//! 3. **BPE.** Each piece becomes its UTF-8 bytes, one symbol per byte (written in GPT-2's
//!    printable-unicode form of bytes); the adjacent pair with the lowest merge rank (the
//!    leftmost among equals) is merged until no pair has a rank.
//!
//! Paper: Sennrich et al., *Neural Machine Translation of Rare Words with Subword Units*
//! (arXiv 1508.07909); byte-level BPE as in GPT-2 (Radford et al., 2019).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::path::Path;

use regex::Regex;
use rlany_framework::{PromptFormat, Tokenizer};
use serde_json::Value;

use crate::ModelError;

/// llama.cpp token type of an ordinary vocabulary entry.
const TYPE_NORMAL: i32 = 1;
/// llama.cpp token type of the unknown token.
const TYPE_UNKNOWN: i32 = 2;
/// llama.cpp token type of a control token (`<|im_start|>`, `<|endoftext|>`, ...).
const TYPE_CONTROL: i32 = 3;
/// llama.cpp token type of a user-defined (added, non-special) token.
const TYPE_USER_DEFINED: i32 = 4;
/// llama.cpp token type of an unused (padding) vocabulary slot.
const TYPE_UNUSED: i32 = 5;
/// llama.cpp token type of a byte token.
const TYPE_BYTE: i32 = 6;

/// Symbol of a byte that has no token: never merged, dropped from the output.
const MISSING: u32 = u32::MAX;
/// Symbol merged into its left neighbour.
const DEAD: u32 = u32::MAX - 1;
/// No neighbour (in the merge loop's linked list).
const NONE: usize = usize::MAX;

/// GPT-2's regex: contractions, letters, digits, other symbols, each with an optional
/// leading space, then whitespace (`\s+(?!\S)|\s+`; the look-ahead is emulated).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";
/// Qwen2's regex with llama.cpp's spelling of the case-insensitive contractions
/// (`(?i:'s|...)` becomes `'[sS]|...`) and the `\s+(?!\S)` look-ahead emulated.
const QWEN2_PATTERN: &str = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";
/// The Split regex of Qwen2's `tokenizer.json`, exactly.
const QWEN2_HF_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How plain text is split into pieces before BPE (llama.cpp's `tokenizer.ggml.pre`).
///
/// Each variant is the list of regexes llama.cpp applies for that name, each one splitting
/// the pieces of the previous one (text between matches is kept as pieces too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// SmolLM: first `\p{N}` (every digit its own piece), then [`PreTokenizer::Gpt2`].
    SmolLm,
    /// Qwen2: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` (the contractions matched with
    /// ASCII case folding only, as llama.cpp does).
    Qwen2,
}

impl PreTokenizer {
    /// Every accepted name with its pre-tokenizer (llama.cpp itself writes GPT-2's as
    /// `"gpt-2"`).
    const NAMES: [(&'static str, PreTokenizer); 4] = [
        ("gpt2", PreTokenizer::Gpt2),
        ("gpt-2", PreTokenizer::Gpt2),
        ("smollm", PreTokenizer::SmolLm),
        ("qwen2", PreTokenizer::Qwen2),
    ];

    /// The pre-tokenizer of a GGUF file's `tokenizer.ggml.pre` value: `"gpt2"` or `"gpt-2"`
    /// (the name llama.cpp uses), `"smollm"` or `"qwen2"`.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] naming the value and the supported ones.
    pub fn from_gguf_name(name: &str) -> Result<Self, ModelError> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, pre)| pre)
            .ok_or_else(|| {
                let supported: Vec<&str> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                ModelError::Tokenizer(format!(
                    "unsupported pre-tokenizer {name:?} (supported: {})",
                    supported.join(", ")
                ))
            })
    }

    /// The llama.cpp name of the pre-tokenizer (the inverse of
    /// [`PreTokenizer::from_gguf_name`]).
    pub fn gguf_name(self) -> &'static str {
        match self {
            PreTokenizer::Gpt2 => "gpt-2",
            PreTokenizer::SmolLm => "smollm",
            PreTokenizer::Qwen2 => "qwen2",
        }
    }
}

/// Everything that defines a [`BpeTokenizer`], as a GGUF file stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpeSpec {
    /// Token strings by id, bytes written in GPT-2's printable-unicode form (`"Ġthe"`);
    /// special tokens as their literal text (`"<|im_end|>"`). If a string occurs twice, the
    /// larger id is the one that encoding produces (as in llama.cpp).
    pub tokens: Vec<String>,
    /// llama.cpp token type of each token (`tokenizer.ggml.token_type`): 1 normal,
    /// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; empty means all normal.
    pub token_types: Vec<i32>,
    /// Merges `"left right"` in rank order (the first merges first).
    pub merges: Vec<String>,
    /// Beginning-of-sequence id.
    pub bos: u32,
    /// End-of-sequence id.
    pub eos: u32,
    /// Padding id.
    pub pad: u32,
    /// How plain text is split before BPE.
    pub pre: PreTokenizer,
}

impl BpeSpec {
    /// This tokenizer as a Hugging Face `tokenizer.json`, what
    /// [`BpeTokenizer::from_tokenizer_json`] and `transformers` read: a byte-level `"BPE"`
    /// model with every token in its vocabulary and the merges in rank order, the
    /// pre-tokenizer of [`BpeSpec::pre`] in the form `tokenizers` writes it, a byte-level
    /// decoder, and every control, unknown, user-defined or unused token also listed as an
    /// added token (`special` for all but user-defined ones). Read back it gives the same
    /// tokens, merges and pre-tokenizer; token types narrow to what the format holds (byte
    /// tokens read as normal, unknown and unused ones as control).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] if a token's text occurs at two ids, which the format's
    /// vocabulary (an object keyed by text) cannot hold.
    pub fn to_tokenizer_json(&self) -> Result<Value, ModelError> {
        let mut vocab = serde_json::Map::with_capacity(self.tokens.len());
        let mut added = Vec::new();
        for (id, text) in self.tokens.iter().enumerate() {
            if let Some(first) = vocab.insert(text.clone(), Value::from(id)) {
                return Err(ModelError::Tokenizer(format!(
                    "token {text:?} is at ids {first} and {id}: tokenizer.json cannot hold both"
                )));
            }
            let token_type = self.token_types.get(id).copied().unwrap_or(TYPE_NORMAL);
            if !matches!(token_type, TYPE_NORMAL | TYPE_BYTE) {
                added.push(serde_json::json!({
                    "id": id,
                    "content": text,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": false,
                    "special": token_type != TYPE_USER_DEFINED,
                }));
            }
        }
        let byte_level = |use_regex: bool| {
            serde_json::json!({
                "type": "ByteLevel",
                "add_prefix_space": false,
                "trim_offsets": true,
                "use_regex": use_regex,
            })
        };
        let pre_tokenizer = match self.pre {
            PreTokenizer::Gpt2 => byte_level(true),
            PreTokenizer::SmolLm => serde_json::json!({
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Digits", "individual_digits": true},
                    byte_level(true),
                ],
            }),
            PreTokenizer::Qwen2 => serde_json::json!({
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": QWEN2_HF_PATTERN},
                        "behavior": "Isolated",
                        "invert": false,
                    },
                    byte_level(false),
                ],
            }),
        };
        Ok(serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": byte_level(true),
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": false,
                "vocab": vocab,
                "merges": self.merges,
            },
        }))
    }
}

/// Optional bos/eos/pad ids for [`BpeTokenizer::from_tokenizer_json_with`]; `None` takes the
/// default described there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Padding id.
    pub pad: Option<u32>,
}

/// What a token is, from its llama.cpp type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Byte-level text (types 1 normal and 6 byte).
    Normal,
    /// Matched literally, decodes to nothing (types 2 unknown and 3 control).
    Control,
    /// Matched literally, decodes to its own text (type 4).
    UserDefined,
    /// Never produced by encoding, decodes to nothing (type 5).
    Unused,
}

impl Kind {
    fn from_type(token_type: i32) -> Option<Self> {
        match token_type {
            TYPE_NORMAL | TYPE_BYTE => Some(Kind::Normal),
            TYPE_UNKNOWN | TYPE_CONTROL => Some(Kind::Control),
            TYPE_USER_DEFINED => Some(Kind::UserDefined),
            TYPE_UNUSED => Some(Kind::Unused),
            _ => None,
        }
    }
}

/// Whether GPT-2's byte-to-unicode map keeps byte `b` as the character of the same code.
fn keeps_byte(b: u8) -> bool {
    matches!(b, 33..=126 | 161..=172 | 174..=255)
}

/// GPT-2's byte-to-unicode map: the printable bytes `33..=126`, `161..=172`, `174..=255`
/// map to themselves, the other 68 bytes to `U+0100..` in byte order.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0x100;
    for b in 0..=255u8 {
        table[usize::from(b)] = if keeps_byte(b) {
            char::from(b)
        } else {
            let c = char::from_u32(shifted).unwrap_or(char::REPLACEMENT_CHARACTER);
            shifted += 1;
            c
        };
    }
    table
}

/// A pair's merge: its rank (lower merges first) and the id of the merged token.
#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    merged: u32,
}

/// Splits plain text into pre-token pieces.
#[derive(Debug, Clone)]
struct Splitter {
    pre: PreTokenizer,
    /// `\p{N}`, applied first (SmolLM only).
    digit: Option<Regex>,
    /// The main pattern, with `\s+(?!\S)` left to [`Splitter::split_main`].
    main: Regex,
}

impl Splitter {
    fn new(pre: PreTokenizer) -> Result<Self, ModelError> {
        let compile = |pattern: &str| {
            Regex::new(pattern).map_err(|e| {
                ModelError::Tokenizer(format!("cannot compile the pre-tokenizer regex: {e}"))
            })
        };
        let (digit, main) = match pre {
            PreTokenizer::Gpt2 => (None, compile(GPT2_PATTERN)?),
            PreTokenizer::SmolLm => (Some(compile(r"\p{N}")?), compile(GPT2_PATTERN)?),
            PreTokenizer::Qwen2 => (None, compile(QWEN2_PATTERN)?),
        };
        Ok(Self { pre, digit, main })
    }

    /// Appends the pieces of `text` to `out`.
    fn split<'t>(&self, text: &'t str, out: &mut Vec<&'t str>) {
        let Some(digit) = &self.digit else {
            self.split_main(text, out);
            return;
        };
        let mut last = 0;
        for m in digit.find_iter(text) {
            if m.start() > last {
                self.split_main(&text[last..m.start()], out);
            }
            out.push(m.as_str());
            last = m.end();
        }
        if last < text.len() {
            self.split_main(&text[last..], out);
        }
    }

    /// The main pattern's pieces of `text`. The patterns match every character, so the
    /// pieces cover `text`; text no match covers would be kept as a piece all the same.
    fn split_main<'t>(&self, text: &'t str, out: &mut Vec<&'t str>) {
        let mut pos = 0;
        while pos < text.len() {
            let Some(m) = self.main.find_at(text, pos) else {
                out.push(&text[pos..]);
                return;
            };
            if m.start() > pos {
                out.push(&text[pos..m.start()]);
            }
            let mut end = m.end();
            // `\s+(?!\S)` before `\s+`: a whitespace run followed by a non-space character
            // gives its last character back (which then starts the next piece), unless the
            // run is a single character (then `\s+` takes it whole).
            if end < text.len()
                && self.is_plain_whitespace_run(m.as_str())
                && let Some(last) = m.as_str().chars().next_back()
                && m.as_str().len() > last.len_utf8()
            {
                end -= last.len_utf8();
            }
            out.push(&text[m.start()..end]);
            pos = end;
        }
    }

    /// Whether a match came from the pattern's final `\s+` (all whitespace; for Qwen2 also
    /// without `\r`/`\n`, since `\s*[\r\n]+` comes first and takes any run with a newline).
    fn is_plain_whitespace_run(&self, matched: &str) -> bool {
        matched.chars().all(char::is_whitespace)
            && (self.pre != PreTokenizer::Qwen2 || !matched.contains(['\r', '\n']))
    }
}

/// A candidate merge `(rank, left position, left id, right id, merged id)`; the heap pops
/// the lowest rank first, then the leftmost.
type Candidate = Reverse<(u32, usize, u32, u32, u32)>;

/// Reusable buffers of the merge loop.
#[derive(Debug, Default)]
struct Scratch {
    /// Symbol ids (`DEAD` once merged into the left neighbour, `MISSING` for a byte
    /// without a token).
    ids: Vec<u32>,
    prev: Vec<usize>,
    next: Vec<usize>,
    /// Candidate merges.
    heap: BinaryHeap<Candidate>,
}

/// A stretch of input: plain text, or a special token matched literally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'t> {
    Text(&'t str),
    Special(u32),
}

/// GPT-2-style byte-level BPE tokenizer (see the module documentation for the algorithm).
///
/// - Encoding never fails: a byte whose single-byte token is missing from the vocabulary
///   (SmolLM2 lacks 21 of them, e.g. `0x04`) is dropped, as llama.cpp and Hugging Face
///   tokenizers (without an unknown token) do; no `unk` id is produced.
/// - Decoding concatenates the tokens' bytes ([`BpeTokenizer::token_bytes`]) and reads them
///   as UTF-8, replacing invalid sequences with `U+FFFD`; an id outside the vocabulary
///   decodes to `U+FFFD`.
#[derive(Clone)]
pub struct BpeTokenizer {
    tokens: Vec<String>,
    kinds: Vec<Kind>,
    /// Raw bytes of each token (empty for control and unused tokens).
    bytes: Vec<Vec<u8>>,
    text_to_id: HashMap<String, u32>,
    /// Token id of each byte's single-character token, or `MISSING`.
    byte_ids: [u32; 256],
    merges: HashMap<(u32, u32), Merge>,
    /// Literally matched tokens, longest text first (ties by id).
    specials: Vec<(String, u32)>,
    splitter: Splitter,
    bos: u32,
    eos: u32,
    pad: u32,
    /// How episodes are laid out for the model this tokenizer belongs to.
    format: PromptFormat,
}

impl fmt::Debug for BpeTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BpeTokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("specials", &self.specials.len())
            .field("pre", &self.splitter.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .finish()
    }
}

impl BpeTokenizer {
    /// The tokenizer of `spec`.
    ///
    /// Merges are split at their first space; a merge whose two parts or whose
    /// concatenation is not a token is an error (as in Hugging Face tokenizers); a repeated
    /// merge keeps its first (lowest) rank. Bytes without a single-byte token are allowed
    /// (they are dropped when encoding), except `'\n'` (the step delimiter).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] if the vocabulary is empty or too large for `u32` ids,
    /// `token_types` has the wrong length or an unknown type, bos/eos/pad is out of range,
    /// a merge is malformed, or `'\n'` has no token.
    pub fn new(spec: BpeSpec) -> Result<Self, ModelError> {
        let BpeSpec {
            tokens,
            token_types,
            merges: merge_texts,
            bos,
            eos,
            pad,
            pre,
        } = spec;
        let err = |message: String| ModelError::Tokenizer(message);
        let n = tokens.len();
        if n == 0 {
            return Err(err("the vocabulary is empty".into()));
        }
        if !u32::try_from(n).is_ok_and(|n| n < DEAD) {
            return Err(err(format!("the vocabulary is too large ({n} tokens)")));
        }
        if !token_types.is_empty() && token_types.len() != n {
            return Err(err(format!(
                "{} token types for {n} tokens",
                token_types.len()
            )));
        }
        for (name, id) in [("bos", bos), ("eos", eos), ("pad", pad)] {
            if id as usize >= n {
                return Err(err(format!(
                    "{name} id {id} is out of range (vocabulary size {n})"
                )));
            }
        }

        let mut kinds = Vec::with_capacity(n);
        for (id, &token_type) in token_types.iter().enumerate() {
            let kind = Kind::from_type(token_type).ok_or_else(|| {
                err(format!(
                    "token {id} ({:?}) has unknown token type {token_type} (expected 1..=6)",
                    tokens[id]
                ))
            })?;
            kinds.push(kind);
        }
        kinds.resize(n, Kind::Normal);

        let byte_chars = byte_to_char_table();
        let char_to_byte: HashMap<char, u8> = (0..=255u8)
            .map(|b| (byte_chars[usize::from(b)], b))
            .collect();
        let bytes: Vec<Vec<u8>> = tokens
            .iter()
            .zip(&kinds)
            .map(|(text, kind)| match kind {
                Kind::Normal => {
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => out.push(b),
                            // Not a byte-level character: its own UTF-8 bytes.
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                }
                Kind::UserDefined => text.as_bytes().to_vec(),
                Kind::Control | Kind::Unused => Vec::new(),
            })
            .collect();

        let mut text_to_id = HashMap::with_capacity(n);
        for (id, text) in tokens.iter().enumerate() {
            // `n < u32::MAX`, checked above.
            text_to_id.insert(text.clone(), id as u32);
        }

        let mut byte_ids = [MISSING; 256];
        for b in 0..=255u8 {
            let mut buf = [0; 4];
            let text: &str = byte_chars[usize::from(b)].encode_utf8(&mut buf);
            if let Some(&id) = text_to_id.get(text) {
                byte_ids[usize::from(b)] = id;
            }
        }
        if byte_ids[usize::from(b'\n')] == MISSING {
            return Err(err(
                "no token for \"\\n\" (\"\u{010A}\"), the step delimiter".into(),
            ));
        }

        let mut merges = HashMap::with_capacity(merge_texts.len());
        for (rank, text) in merge_texts.iter().enumerate() {
            let bad = |why: String| err(format!("merge {rank} ({text:?}): {why}"));
            let Some((left, right)) = text.split_once(' ') else {
                return Err(bad("expected two tokens separated by a space".into()));
            };
            if left.is_empty() || right.is_empty() || right.contains(' ') {
                return Err(bad("expected two tokens separated by a space".into()));
            }
            let id = |part: &str| {
                text_to_id
                    .get(part)
                    .copied()
                    .ok_or_else(|| bad(format!("{part:?} is not in the vocabulary")))
            };
            let (left_id, right_id) = (id(left)?, id(right)?);
            let merged = id(&format!("{left}{right}"))?;
            let rank = u32::try_from(rank).map_err(|_| bad("too many merges".into()))?;
            merges
                .entry((left_id, right_id))
                .or_insert(Merge { rank, merged });
        }

        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(&kinds)
            .enumerate()
            .filter(|(_, (text, kind))| {
                !text.is_empty() && matches!(kind, Kind::Control | Kind::UserDefined)
            })
            .map(|(id, (text, _))| (text.clone(), id as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        Ok(Self {
            tokens,
            kinds,
            bytes,
            text_to_id,
            byte_ids,
            merges,
            specials,
            splitter: Splitter::new(pre)?,
            bos,
            eos,
            pad,
            format: PromptFormat::Lines,
        })
    }

    /// The tokenizer of a Hugging Face `tokenizer.json`, with the default bos/eos/pad of
    /// [`BpeTokenizer::from_tokenizer_json_with`].
    ///
    /// # Errors
    /// As [`BpeTokenizer::from_tokenizer_json_with`].
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, ModelError> {
        Self::from_tokenizer_json_with(path, SpecialIds::default())
    }

    /// The tokenizer of a Hugging Face `tokenizer.json`.
    ///
    /// - `model` must be a byte-level `"BPE"` model: `vocab` (token → id), `merges` (strings
    ///   `"a b"` or pairs `["a", "b"]`); no `byte_fallback`, `ignore_merges`, `dropout`,
    ///   `continuing_subword_prefix` or `end_of_word_suffix`.
    /// - `added_tokens` are matched literally in the input: those with `"special": true` as
    ///   control tokens (they decode to nothing), the others as user-defined tokens (they
    ///   decode to their text); `lstrip`, `rstrip` and `single_word` are not supported.
    /// - `pre_tokenizer` must be `ByteLevel` alone ([`PreTokenizer::Gpt2`]),
    ///   `Sequence[Digits{individual_digits: true}, ByteLevel]` ([`PreTokenizer::SmolLm`]) or
    ///   `Sequence[Split{Regex: <Qwen2's pattern>, Isolated}, ByteLevel{use_regex: false}]`
    ///   ([`PreTokenizer::Qwen2`]), with `add_prefix_space: false`.
    /// - `normalizer` must be absent/null or `NFC`; NFC is *not* applied (as in llama.cpp),
    ///   so non-NFC input may tokenize differently from Hugging Face.
    /// - The ids must be `0..n` with no gaps.
    ///
    /// Defaults for the ids `special` leaves `None`: `bos` is `<|im_start|>` if the
    /// vocabulary has it, else `<|endoftext|>`; `eos` is `<|im_end|>` if present, else
    /// `<|endoftext|>`; `pad` is `eos` (SmolLM2's GGUF uses bos 1, eos 2, pad 2, which these
    /// defaults reproduce).
    ///
    /// # Errors
    /// [`ModelError::TokenizerFile`] naming `path` if the file cannot be read or parsed, is
    /// not a supported tokenizer, or describes an invalid one.
    pub fn from_tokenizer_json_with(path: &Path, special: SpecialIds) -> Result<Self, ModelError> {
        let file_err = |message: String| ModelError::TokenizerFile {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        let json: Value =
            serde_json::from_str(&text).map_err(|e| file_err(format!("invalid JSON: {e}")))?;
        let spec = spec_from_tokenizer_json(&json, special).map_err(file_err)?;
        Self::new(spec).map_err(|e| match e {
            ModelError::Tokenizer(message) => file_err(message),
            other => other,
        })
    }

    /// The tokenizer with episodes laid out by `format` (a chat template's markup for a
    /// pretrained chat model; [`PromptFormat::Lines`] by default).
    pub fn with_prompt_format(mut self, format: PromptFormat) -> Self {
        self.format = format;
        self
    }

    /// The raw bytes token `id` stands for: `None` outside the vocabulary, empty for control
    /// and unused tokens, the literal text of a user-defined token.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.bytes.get(id as usize).cloned()
    }

    /// The vocabulary string of token `id` (byte-level form, e.g. `"Ġthe"`), if in range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary string is `token_text` (byte-level form, e.g.
    /// `"Ġthe"`, or a special token's text, e.g. `"<|im_end|>"`).
    pub fn id_of(&self, token_text: &str) -> Option<u32> {
        self.text_to_id.get(token_text).copied()
    }

    /// Whether `id` is a special token: control, unknown or user-defined (those matched
    /// literally when encoding).
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.kinds.get(id as usize),
            Some(Kind::Control | Kind::UserDefined)
        )
    }

    /// The pre-tokenizer.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.splitter.pre
    }

    /// Splits `text` at the literal occurrences of special tokens, longest token first.
    fn partition<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        let mut fragments = vec![Fragment::Text(text)];
        for (special, id) in &self.specials {
            if !text.contains(special.as_str()) {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Special(*id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }

    /// Appends the BPE ids of plain `text` (no special tokens) to `out`.
    fn encode_text(&self, text: &str, out: &mut Vec<u32>, scratch: &mut Scratch) {
        let mut pieces = Vec::new();
        self.splitter.split(text, &mut pieces);
        for piece in pieces {
            scratch.ids.clear();
            scratch
                .ids
                .extend(piece.bytes().map(|b| self.byte_ids[usize::from(b)]));
            self.merge(scratch);
            out.extend(
                scratch
                    .ids
                    .iter()
                    .copied()
                    .filter(|&id| id != MISSING && id != DEAD),
            );
        }
    }

    /// Merges `scratch.ids` in place: repeatedly the adjacent pair of lowest rank (leftmost
    /// among equals); merged-away symbols become `DEAD`.
    fn merge(&self, s: &mut Scratch) {
        let n = s.ids.len();
        if n < 2 {
            return;
        }
        s.prev.clear();
        s.prev
            .extend((0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)));
        s.next.clear();
        s.next.extend((1..=n).map(|i| if i < n { i } else { NONE }));
        s.heap.clear();
        for left in 0..n - 1 {
            self.push_pair(s, left, left + 1);
        }
        while let Some(Reverse((_, left, left_id, right_id, merged))) = s.heap.pop() {
            let right = s.next[left];
            if right == NONE || s.ids[left] != left_id || s.ids[right] != right_id {
                continue; // stale: one of the two symbols has changed since
            }
            s.ids[left] = merged;
            s.ids[right] = DEAD;
            let after = s.next[right];
            s.next[left] = after;
            if after != NONE {
                s.prev[after] = left;
                self.push_pair(s, left, after);
            }
            let before = s.prev[left];
            if before != NONE {
                self.push_pair(s, before, left);
            }
        }
    }

    /// Queues the merge of the symbols at `left` and `right` if the pair has a rank.
    fn push_pair(&self, s: &mut Scratch, left: usize, right: usize) {
        let (left_id, right_id) = (s.ids[left], s.ids[right]);
        if let Some(m) = self.merges.get(&(left_id, right_id)) {
            s.heap
                .push(Reverse((m.rank, left, left_id, right_id, m.merged)));
        }
    }
}

impl Tokenizer for BpeTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = Scratch::default();
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Text(t) => self.encode_text(t, &mut out, &mut scratch),
                Fragment::Special(id) => out.push(id),
            }
        }
        out
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            match self.bytes.get(id as usize) {
                Some(b) => bytes.extend_from_slice(b),
                None => bytes.extend_from_slice("\u{FFFD}".as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    fn bos(&self) -> u32 {
        self.bos
    }

    fn eos(&self) -> u32 {
        self.eos
    }

    fn pad(&self) -> u32 {
        self.pad
    }

    fn prompt_format(&self) -> PromptFormat {
        self.format.clone()
    }
}

/// `json[key]` as a string, if it is one.
fn str_field<'v>(json: &'v Value, key: &str) -> Option<&'v str> {
    json.get(key).and_then(Value::as_str)
}

/// Whether `json[key]` is `true` (`default` when absent or null).
fn bool_field(json: &Value, key: &str, default: bool) -> Result<bool, String> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{key:?} is not a boolean: {other}")),
    }
}

/// Checks a `ByteLevel` pre-tokenizer: no prefix space, and `use_regex` as the caller needs.
fn check_byte_level(json: &Value, use_regex: bool) -> Result<(), String> {
    if str_field(json, "type") != Some("ByteLevel") {
        return Err(format!("expected a ByteLevel pre-tokenizer, found {json}"));
    }
    if bool_field(json, "add_prefix_space", true)? {
        return Err("ByteLevel with add_prefix_space is not supported".into());
    }
    if bool_field(json, "use_regex", true)? != use_regex {
        return Err(format!(
            "ByteLevel with use_regex {} is not supported here (expected {use_regex})",
            !use_regex
        ));
    }
    Ok(())
}

/// The [`PreTokenizer`] of a `tokenizer.json` `pre_tokenizer` value.
fn pre_tokenizer_from_json(json: &Value) -> Result<PreTokenizer, String> {
    let unsupported = || {
        format!(
            "unsupported pre_tokenizer {json} (supported: ByteLevel, \
             Sequence[Digits{{individual_digits: true}}, ByteLevel], \
             Sequence[Split{{Qwen2 regex}}, ByteLevel])"
        )
    };
    match str_field(json, "type") {
        Some("ByteLevel") => {
            check_byte_level(json, true)?;
            Ok(PreTokenizer::Gpt2)
        }
        Some("Sequence") => {
            let Some([first, second]) = json
                .get("pretokenizers")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
            else {
                return Err(unsupported());
            };
            match str_field(first, "type") {
                Some("Digits") if bool_field(first, "individual_digits", false)? => {
                    check_byte_level(second, true)?;
                    Ok(PreTokenizer::SmolLm)
                }
                Some("Split") => {
                    let pattern = first
                        .get("pattern")
                        .and_then(|p| p.get("Regex"))
                        .and_then(Value::as_str);
                    let isolated = str_field(first, "behavior") == Some("Isolated");
                    let inverted = bool_field(first, "invert", false)?;
                    if pattern != Some(QWEN2_HF_PATTERN) || !isolated || inverted {
                        return Err(unsupported());
                    }
                    check_byte_level(second, false)?;
                    Ok(PreTokenizer::Qwen2)
                }
                _ => Err(unsupported()),
            }
        }
        _ => Err(unsupported()),
    }
}

/// The [`BpeSpec`] of a parsed `tokenizer.json`.
fn spec_from_tokenizer_json(json: &Value, special: SpecialIds) -> Result<BpeSpec, String> {
    let model = json.get("model").ok_or("no \"model\"")?;
    if str_field(model, "type") != Some("BPE") {
        return Err(format!(
            "model type {} is not supported (expected \"BPE\")",
            model.get("type").unwrap_or(&Value::Null)
        ));
    }
    for key in ["byte_fallback", "ignore_merges"] {
        if bool_field(model, key, false)? {
            return Err(format!("model.{key} is not supported"));
        }
    }
    if model.get("dropout").is_some_and(|d| !d.is_null()) {
        return Err("model.dropout is not supported".into());
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if str_field(model, key).is_some_and(|s| !s.is_empty()) {
            return Err(format!("model.{key} is not supported"));
        }
    }
    match json.get("normalizer") {
        None | Some(Value::Null) => {}
        Some(n) if str_field(n, "type") == Some("NFC") => {}
        Some(n) => return Err(format!("unsupported normalizer {n}")),
    }
    let pre = pre_tokenizer_from_json(json.get("pre_tokenizer").unwrap_or(&Value::Null))?;

    // Token strings and types by id.
    let mut by_id: Vec<Option<(String, i32)>> = Vec::new();
    let mut place = |id: u64, text: &str, token_type: i32| -> Result<(), String> {
        let index = usize::try_from(id)
            .ok()
            .filter(|&i| i < u32::MAX as usize)
            .ok_or_else(|| format!("token id {id} is too large"))?;
        if index >= by_id.len() {
            by_id.resize(index + 1, None);
        }
        match &mut by_id[index] {
            Some((existing, _)) if existing != text => {
                Err(format!("id {id} is both {existing:?} and {text:?}"))
            }
            slot => {
                *slot = Some((text.to_owned(), token_type));
                Ok(())
            }
        }
    };
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or("model.vocab is not an object")?;
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| format!("vocab entry {text:?} has id {id}, not an integer"))?;
        place(id, text, TYPE_NORMAL)?;
    }
    if let Some(added) = json.get("added_tokens") {
        let added = added.as_array().ok_or("added_tokens is not an array")?;
        for token in added {
            let id = token
                .get("id")
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("added token without an integer id: {token}"))?;
            let text = str_field(token, "content")
                .ok_or_else(|| format!("added token without content: {token}"))?;
            for key in ["lstrip", "rstrip", "single_word"] {
                if bool_field(token, key, false)? {
                    return Err(format!("added token {text:?}: {key} is not supported"));
                }
            }
            let token_type = if bool_field(token, "special", false)? {
                TYPE_CONTROL
            } else {
                TYPE_USER_DEFINED
            };
            place(id, text, token_type)?;
        }
    }
    let mut tokens = Vec::with_capacity(by_id.len());
    let mut token_types = Vec::with_capacity(by_id.len());
    for (id, slot) in by_id.into_iter().enumerate() {
        let (text, token_type) = slot.ok_or_else(|| format!("no token has id {id}"))?;
        tokens.push(text);
        token_types.push(token_type);
    }

    let merges_json = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or("model.merges is not an array")?;
    let mut merges = Vec::with_capacity(merges_json.len());
    for (rank, merge) in merges_json.iter().enumerate() {
        let text = match merge {
            Value::String(s) => s.clone(),
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(a), Value::String(b)] if !a.contains(' ') && !b.contains(' ') => {
                    format!("{a} {b}")
                }
                _ => {
                    return Err(format!(
                        "merge {rank} is not a pair of tokens without spaces: {merge}"
                    ));
                }
            },
            _ => {
                return Err(format!(
                    "merge {rank} is neither a string nor a pair: {merge}"
                ));
            }
        };
        merges.push(text);
    }

    let find = |text: &str| tokens.iter().rposition(|t| t == text).map(|i| i as u32);
    let default_of = |name: &str, choices: &[&str]| {
        choices.iter().find_map(|c| find(c)).ok_or_else(|| {
            format!(
                "no {name} id given and none of {} is in the vocabulary",
                choices.join(", ")
            )
        })
    };
    let bos = match special.bos {
        Some(id) => id,
        None => default_of("bos", &["<|im_start|>", "<|endoftext|>"])?,
    };
    let eos = match special.eos {
        Some(id) => id,
        None => default_of("eos", &["<|im_end|>", "<|endoftext|>"])?,
    };
    let pad = special.pad.unwrap_or(eos);
    Ok(BpeSpec {
        tokens,
        token_types,
        merges,
        bos,
        eos,
        pad,
        pre,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The character GPT-2 writes byte `b` as.
    fn ch(b: u8) -> char {
        byte_to_char_table()[usize::from(b)]
    }

    /// Pieces of `text` under `pre`.
    fn split(pre: PreTokenizer, text: &str) -> Vec<String> {
        let splitter = Splitter::new(pre).expect("splitter");
        let mut out = Vec::new();
        splitter.split(text, &mut out);
        assert_eq!(out.concat(), text, "the pieces must cover the text");
        out.into_iter().map(str::to_owned).collect()
    }

    /// Ids 0..=255: the byte tokens (id = byte); 256..: `extra` tokens.
    fn tiny_spec(extra: &[(&str, i32)], merges: &[&str]) -> BpeSpec {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| ch(b).to_string()).collect();
        let mut token_types = vec![TYPE_NORMAL; 256];
        for &(text, token_type) in extra {
            tokens.push(text.to_owned());
            token_types.push(token_type);
        }
        BpeSpec {
            tokens,
            token_types,
            merges: merges.iter().map(|m| (*m).to_owned()).collect(),
            bos: 260,
            eos: 261,
            pad: 262,
            pre: PreTokenizer::Gpt2,
        }
    }

    /// 256 Ġt, 257 he, 258 Ġthe, 259 Ġth, 260 <|im_start|>, 261 <|im_end|>,
    /// 262 <|endoftext|>, 263 <tool> (user-defined), 264 <tool>x (control), 265 ĠĠ.
    const EXTRA: [(&str, i32); 10] = [
        ("Ġt", TYPE_NORMAL),
        ("he", TYPE_NORMAL),
        ("Ġthe", TYPE_NORMAL),
        ("Ġth", TYPE_NORMAL),
        ("<|im_start|>", TYPE_CONTROL),
        ("<|im_end|>", TYPE_CONTROL),
        ("<|endoftext|>", TYPE_CONTROL),
        ("<tool>", TYPE_USER_DEFINED),
        ("<tool>x", TYPE_CONTROL),
        ("ĠĠ", TYPE_NORMAL),
    ];

    /// Merge order A: `Ġ t`, `h e`, `Ġt he`, `Ġt h`, `Ġ Ġ`.
    fn tiny() -> BpeTokenizer {
        BpeTokenizer::new(tiny_spec(&EXTRA, &["Ġ t", "h e", "Ġt he", "Ġt h", "Ġ Ġ"]))
            .expect("tiny tokenizer")
    }

    #[test]
    fn bpe_byte_map_entries_and_bijection() {
        assert_eq!(ch(b' '), 'Ġ');
        assert_eq!(ch(b' '), '\u{0120}');
        assert_eq!(ch(b'\n'), '\u{010A}');
        assert_eq!(ch(b'!'), '!');
        assert_eq!(ch(b'~'), '~');
        assert_eq!(ch(0), '\u{0100}');
        assert_eq!(ch(b'\t'), '\u{0109}');
        assert_eq!(ch(0x7f), '\u{0121}');
        assert_eq!(ch(0xad), '\u{0143}');
        assert_eq!(ch(0xff), 'ÿ');
        let table = byte_to_char_table();
        let distinct: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        let shifted = table.iter().filter(|&&c| u32::from(c) >= 0x100).count();
        assert_eq!(shifted, 68);
        assert!(
            table
                .iter()
                .all(|&c| u32::from(c) < 0x144 && !c.is_whitespace())
        );
    }

    #[test]
    fn bpe_pre_tokenizer_names() {
        assert_eq!(
            PreTokenizer::from_gguf_name("smollm").expect("smollm"),
            PreTokenizer::SmolLm
        );
        for pre in [
            PreTokenizer::Gpt2,
            PreTokenizer::SmolLm,
            PreTokenizer::Qwen2,
        ] {
            assert_eq!(
                PreTokenizer::from_gguf_name(pre.gguf_name()).expect("name"),
                pre
            );
        }
        let message = PreTokenizer::from_gguf_name("llama-bpe")
            .expect_err("unsupported")
            .to_string();
        assert!(message.contains("\"llama-bpe\""), "{message}");
        assert!(message.contains("gpt2, gpt-2, smollm, qwen2"), "{message}");
        assert_eq!(
            PreTokenizer::from_gguf_name("gpt2").expect("gpt2"),
            PreTokenizer::Gpt2
        );
    }

    #[test]
    fn bpe_split_gpt2() {
        let s = |t| split(PreTokenizer::Gpt2, t);
        assert_eq!(s("a   b"), ["a", "  ", " b"]);
        assert_eq!(s("x\n\ny"), ["x", "\n", "\n", "y"]);
        assert_eq!(s("12345"), ["12345"]);
        assert_eq!(s("don't"), ["don", "'t"]);
        assert_eq!(s("I'M"), ["I", "'", "M"]);
        assert_eq!(s("we'll've"), ["we", "'ll", "'ve"]);
        assert_eq!(s("  leading"), [" ", " leading"]);
        assert_eq!(s("tail  "), ["tail", "  "]);
        assert_eq!(s("a\t\tb"), ["a", "\t", "\t", "b"]);
        assert_eq!(s("x \ny"), ["x", " ", "\n", "y"]);
        assert_eq!(
            s("Hello, world! 42x"),
            ["Hello", ",", " world", "!", " 42", "x"]
        );
        assert_eq!(s("$var = 1;"), ["$", "var", " =", " 1", ";"]);
        assert_eq!(s("café 日本 🦀!"), ["café", " 日本", " 🦀!"]);
        assert_eq!(s(" "), [" "]);
        assert!(s("").is_empty());
    }

    #[test]
    fn bpe_split_smollm() {
        let s = |t| split(PreTokenizer::SmolLm, t);
        assert_eq!(s("12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(s("a 12"), ["a", " ", "1", "2"]);
        assert_eq!(s("x1y"), ["x", "1", "y"]);
        assert_eq!(
            s("17+25=42\n"),
            ["1", "7", "+", "2", "5", "=", "4", "2", "\n"]
        );
        assert_eq!(s("a   b"), ["a", "  ", " b"]);
        assert_eq!(s("x\n\ny"), ["x", "\n", "\n", "y"]);
        assert_eq!(s("don't"), ["don", "'t"]);
        assert_eq!(s("  leading"), [" ", " leading"]);
        assert_eq!(s("tail  "), ["tail", "  "]);
        assert_eq!(s("type(7, x)"), ["type", "(", "7", ",", " x", ")"]);
    }

    #[test]
    fn bpe_split_qwen2() {
        let s = |t| split(PreTokenizer::Qwen2, t);
        assert_eq!(s("a   b"), ["a", "  ", " b"]);
        assert_eq!(s("x\n\ny"), ["x", "\n\n", "y"]);
        assert_eq!(s("12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(s("don't"), ["don", "'t"]);
        assert_eq!(s("DON'T I'M"), ["DON", "'T", " I", "'M"]);
        assert_eq!(s("  leading"), [" ", " leading"]);
        assert_eq!(s("tail  "), ["tail", "  "]);
        assert_eq!(s("a\t\tb"), ["a", "\t", "\tb"]);
        assert_eq!(s("x \ny"), ["x", " \n", "y"]);
        assert_eq!(s("$var"), ["$var"]);
        assert_eq!(
            s("Hello, world!\n\n  x"),
            ["Hello", ",", " world", "!\n\n", " ", " x"]
        );
        assert_eq!(s("a 12"), ["a", " ", "1", "2"]);
    }

    #[test]
    fn bpe_tiny_encodings() {
        let tok = tiny();
        // "the": t h e → (h,e) → [t, he]; " the": Ġ t h e → Ġt, he, Ġthe.
        assert_eq!(tok.encode("the the"), [116, 257, 258]);
        assert_eq!(tok.encode(" th"), [259]);
        assert_eq!(tok.encode("a b"), [97, 32, 98]);
        // "   the": ["  ", " the"] → ĠĠ, Ġthe.
        assert_eq!(tok.encode("   the"), [265, 258]);
        // Three spaces at the end: one piece, Ġ Ġ merges leftmost first.
        assert_eq!(tok.encode("   "), [265, 32]);
        assert_eq!(tok.encode(""), Vec::<u32>::new());
        assert_eq!(tok.encode("\n"), [10]);
        assert_eq!(tok.prompt_format(), PromptFormat::Lines);
        assert_eq!((tok.bos(), tok.eos(), tok.pad()), (260, 261, 262));
        assert_eq!(tok.vocab_size(), 266);
    }

    #[test]
    fn bpe_merge_rank_order_matters() {
        // Order B ranks `Ġt h` before `h e`: " the" → Ġt, h, e → Ġth, e.
        let order_b = BpeTokenizer::new(tiny_spec(&EXTRA, &["Ġ t", "Ġt h", "h e", "Ġt he"]))
            .expect("tokenizer");
        assert_eq!(order_b.encode(" the"), [259, 101]);
        assert_eq!(tiny().encode(" the"), [258]);
    }

    #[test]
    fn bpe_special_tokens_in_text() {
        let tok = tiny();
        assert_eq!(
            tok.encode("<|im_start|>user\nthe<|im_end|>"),
            [260, 117, 115, 101, 114, 10, 116, 257, 261]
        );
        assert_eq!(tok.encode("<|im_end|><|im_end|>"), [261, 261]);
        // The longer special token wins where both match.
        assert_eq!(tok.encode("<tool>x"), [264]);
        assert_eq!(tok.encode("<tool>y"), [263, 121]);
        // Text around a special token is pre-tokenized on its own: no " the" across it.
        assert_eq!(tok.encode(" <|im_end|>the"), [32, 261, 116, 257]);
        // A partial special token is plain text.
        assert_eq!(tok.encode("<|im").len(), 4);
        assert!(tok.is_special(260) && tok.is_special(263) && tok.is_special(264));
        assert!(!tok.is_special(258) && !tok.is_special(9999));
        // Control tokens decode to nothing, user-defined ones to their text.
        assert_eq!(tok.decode(&[260, 116, 257, 261, 263]), "the<tool>");
        assert_eq!(tok.token_bytes(261), Some(Vec::new()));
        assert_eq!(tok.token_bytes(263), Some(b"<tool>".to_vec()));
        assert_eq!(tok.token_bytes(258), Some(b" the".to_vec()));
        assert_eq!(tok.token_bytes(266), None);
        assert_eq!(tok.id_of("<|im_end|>"), Some(261));
        assert_eq!(tok.id_of("Ġthe"), Some(258));
        assert_eq!(tok.id_of("nope"), None);
        assert_eq!(tok.token_text(258), Some("Ġthe"));
    }

    #[test]
    fn bpe_round_trips() {
        let tok = tiny();
        let all_latin1: String = (0..=255u8).map(char::from).collect();
        for text in [
            "the quick brown fox\n\njumps  over\tthe lazy dog. ",
            "  leading and trailing  ",
            "héllo wörld, café",
            "日本語のテキスト",
            "emoji 🦀🎉 and ZWJ 👩‍👩‍👧",
            "\u{0}\u{1}\u{7f} control",
            all_latin1.as_str(),
            "<|im_start|>",
            "",
        ] {
            let ids = tok.encode(text);
            let expected = text.replace("<|im_start|>", "");
            assert_eq!(tok.decode(&ids), expected, "{text:?} → {ids:?}");
        }
        // A multi-byte character's bytes are separate tokens here; half of one is lossy.
        let ids = tok.encode("é");
        assert_eq!(ids, [0xc3, 0xa9]);
        assert_eq!(tok.decode(&ids[..1]), "\u{FFFD}");
        assert_eq!(tok.decode(&[9999]), "\u{FFFD}");
    }

    #[test]
    fn bpe_missing_byte_tokens_are_dropped() {
        let mut spec = tiny_spec(&[], &[]);
        spec.tokens[4] = "unrelated".into();
        spec.bos = 0;
        spec.eos = 0;
        spec.pad = 0;
        let tok = BpeTokenizer::new(spec).expect("tokenizer");
        assert_eq!(tok.encode("a\u{4}b"), [97, 98]);
    }

    #[test]
    fn bpe_invalid_specs() {
        let message = |spec: BpeSpec| {
            BpeTokenizer::new(spec)
                .expect_err("invalid spec")
                .to_string()
        };
        let mut spec = tiny_spec(&EXTRA, &[]);
        spec.eos = 266;
        assert!(message(spec).contains("eos id 266"));
        let spec = tiny_spec(&EXTRA, &["Ġ x y"]);
        assert!(message(spec).contains("merge 0"));
        let spec = tiny_spec(&EXTRA, &["Ġt Ġt"]);
        assert!(message(spec).contains("\"ĠtĠt\" is not in the vocabulary"));
        let spec = tiny_spec(&EXTRA, &["Ġ t", "nothing"]);
        assert!(message(spec).contains("merge 1"));
        let mut spec = tiny_spec(&EXTRA, &[]);
        spec.token_types[3] = 7;
        assert!(message(spec).contains("token type 7"));
        let mut spec = tiny_spec(&EXTRA, &[]);
        spec.token_types.pop();
        assert!(message(spec).contains("token types"));
        let mut spec = tiny_spec(&EXTRA, &[]);
        spec.tokens[10] = "no newline".into();
        assert!(message(spec).contains("step delimiter"));
        // Empty token types mean all normal.
        let mut spec = tiny_spec(&[], &[]);
        spec.token_types.clear();
        (spec.bos, spec.eos, spec.pad) = (0, 0, 0);
        assert!(BpeTokenizer::new(spec).is_ok());
    }

    /// A unique scratch directory for one test.
    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rlany-bpe-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// A tiny `tokenizer.json` with the given pre-tokenizer.
    fn tiny_json(pre_tokenizer: &str) -> String {
        let mut vocab = serde_json::Map::new();
        for b in 0..=255u8 {
            vocab.insert(ch(b).to_string(), Value::from(b));
        }
        vocab.insert("Ġt".into(), Value::from(256));
        vocab.insert("he".into(), Value::from(257));
        vocab.insert("Ġthe".into(), Value::from(258));
        vocab.insert("<|endoftext|>".into(), Value::from(259));
        let vocab = Value::Object(vocab);
        format!(
            r#"{{
  "version": "1.0",
  "added_tokens": [
    {{"id": 259, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
      "rstrip": false, "normalized": false, "special": true}},
    {{"id": 260, "content": "<|im_start|>", "special": true}},
    {{"id": 261, "content": "<|im_end|>", "special": true}},
    {{"id": 262, "content": "<tool>", "special": false}}
  ],
  "normalizer": null,
  "pre_tokenizer": {pre_tokenizer},
  "model": {{"type": "BPE", "dropout": null, "unk_token": null,
    "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
    "byte_fallback": false, "ignore_merges": false,
    "vocab": {vocab},
    "merges": ["Ġ t", ["h", "e"], "Ġt he"]}}
}}"#
        )
    }

    const SMOLLM_PRE: &str = r#"{"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]}"#;

    /// A spec written as `tokenizer.json` reads back as the same spec (types narrowed as the
    /// format holds them) and encodes as the original, for each pre-tokenizer.
    #[test]
    fn a_spec_round_trips_through_tokenizer_json() {
        let dir = temp_dir("json-out");
        let path = dir.join("tokenizer.json");
        for pre in [
            PreTokenizer::Gpt2,
            PreTokenizer::SmolLm,
            PreTokenizer::Qwen2,
        ] {
            std::fs::write(&path, tiny_json(SMOLLM_PRE)).expect("write");
            let json: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
            let mut spec = spec_from_tokenizer_json(&json, SpecialIds::default()).expect("spec");
            spec.pre = pre;
            // A byte-typed token narrows to a normal one.
            spec.token_types[65] = TYPE_BYTE;
            let written = spec.to_tokenizer_json().expect("writes");
            let back = spec_from_tokenizer_json(&written, SpecialIds::default()).expect("reads");
            let mut want = spec.clone();
            want.token_types[65] = TYPE_NORMAL;
            assert_eq!(back, want, "{pre:?}");
            std::fs::write(&path, written.to_string()).expect("write");
            let (a, b) = (
                BpeTokenizer::new(spec.clone()).expect("original"),
                BpeTokenizer::from_tokenizer_json(&path).expect("written"),
            );
            for text in [
                "the theme",
                "<|im_start|>user 12 the<|im_end|>",
                "a <tool> b\n",
            ] {
                assert_eq!(a.encode(text), b.encode(text), "{pre:?}: {text:?}");
            }
        }
        let mut twice = spec_from_tokenizer_json(
            &serde_json::from_str(&tiny_json(SMOLLM_PRE)).expect("json"),
            SpecialIds::default(),
        )
        .expect("spec");
        twice.tokens[100] = twice.tokens[101].clone();
        let e = twice.to_tokenizer_json().expect_err("a text at two ids");
        assert!(e.to_string().contains("ids 100 and 101"), "{e}");
    }

    #[test]
    fn bpe_from_tokenizer_json() {
        let dir = temp_dir("json");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, tiny_json(SMOLLM_PRE)).expect("write");
        let tok = BpeTokenizer::from_tokenizer_json(&path).expect("tokenizer");
        assert_eq!(tok.pre_tokenizer(), PreTokenizer::SmolLm);
        assert_eq!(tok.vocab_size(), 263);
        assert_eq!((tok.bos(), tok.eos(), tok.pad()), (260, 261, 261));
        assert_eq!(
            tok.encode("<|im_start|>the 12<tool>"),
            [260, 116, 257, 32, 49, 50, 262]
        );
        assert_eq!(tok.encode(" the"), [258]);
        assert!(tok.is_special(259) && tok.is_special(262) && !tok.is_special(258));
        assert_eq!(tok.decode(&[260, 258, 259, 262]), " the<tool>");

        let with = SpecialIds {
            bos: Some(259),
            eos: None,
            pad: Some(259),
        };
        let tok = BpeTokenizer::from_tokenizer_json_with(&path, with).expect("tokenizer");
        assert_eq!((tok.bos(), tok.eos(), tok.pad()), (259, 261, 259));

        for (pre, expected) in [
            (
                r#"{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}"#,
                PreTokenizer::Gpt2,
            ),
            (
                &format!(
                    r#"{{"type": "Sequence", "pretokenizers": [
                    {{"type": "Split", "pattern": {{"Regex": {}}}, "behavior": "Isolated",
                      "invert": false}},
                    {{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}]}}"#,
                    Value::from(QWEN2_HF_PATTERN)
                ),
                PreTokenizer::Qwen2,
            ),
        ] {
            std::fs::write(&path, tiny_json(pre)).expect("write");
            let tok = BpeTokenizer::from_tokenizer_json(&path).expect("tokenizer");
            assert_eq!(tok.pre_tokenizer(), expected);
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn bpe_from_tokenizer_json_errors() {
        let dir = temp_dir("json-errors");
        let path = dir.join("tokenizer.json");
        let shown = path.display().to_string();
        let message = |path: &Path| {
            BpeTokenizer::from_tokenizer_json(path)
                .expect_err("invalid tokenizer")
                .to_string()
        };

        let missing = dir.join("missing.json");
        let m = message(&missing);
        assert!(m.contains(&missing.display().to_string()), "{m}");

        for (pre, needle) in [
            (r#"{"type": "Metaspace"}"#, "unsupported pre_tokenizer"),
            (
                r#"{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}"#,
                "add_prefix_space",
            ),
            (
                r#"{"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": false},
                    {"type": "ByteLevel", "add_prefix_space": false}]}"#,
                "unsupported pre_tokenizer",
            ),
            ("null", "unsupported pre_tokenizer"),
        ] {
            std::fs::write(&path, tiny_json(pre)).expect("write");
            let m = message(&path);
            assert!(m.contains(&shown) && m.contains(needle), "{m}");
        }

        std::fs::write(&path, "{ not json").expect("write");
        let m = message(&path);
        assert!(m.contains(&shown) && m.contains("invalid JSON"), "{m}");

        let gap = tiny_json(SMOLLM_PRE).replace(r#""id": 261"#, r#""id": 265"#);
        std::fs::write(&path, gap).expect("write");
        let m = message(&path);
        assert!(
            m.contains(&shown) && m.contains("no token has id 261"),
            "{m}"
        );

        let bad_merge = tiny_json(SMOLLM_PRE).replace(r#""Ġt he""#, r#""Ġt hex""#);
        std::fs::write(&path, bad_merge).expect("write");
        let m = message(&path);
        assert!(m.contains(&shown) && m.contains("merge 2"), "{m}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn bpe_long_input_is_fast() {
        let tok = tiny();
        let text = "the theme of the thesis: 12 + 30 = 42\n".repeat(50)
            + &" ".repeat(2000)
            + &"=".repeat(2000);
        let start = std::time::Instant::now();
        let ids = tok.encode(&text);
        let elapsed = start.elapsed();
        assert_eq!(tok.decode(&ids), text);
        // Generous bound for an unoptimised test build on a shared machine.
        assert!(elapsed.as_millis() < 200, "{elapsed:?}");
    }
}
