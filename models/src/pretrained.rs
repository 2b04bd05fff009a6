//! A pretrained model with what it brings: its tokenizer and its chat template.
//!
//! A source is a GGUF file (llama.cpp's format: weights, tokenizer and chat template in one
//! file) or a Hugging Face directory (`config.json`, `*.safetensors`, `tokenizer.json` and,
//! for a chat model, `tokenizer_config.json` with its `chat_template`).
//!
//! Chat templates are Jinja programs; this crate does not run Jinja. It recognises the
//! ChatML family (`<|im_start|>role\n…<|im_end|>\n`, used by SmolLM2 and Qwen2) and reads
//! the default system prompt out of the template's text, which is all that family's
//! templates vary in. Any other template is reported, and the model is used without one.

use burn::prelude::*;
use rlany_kernels::AttentionOps;
use std::path::{Path, PathBuf};

use rlany_framework::{ChatMarkup, PromptFormat};

use crate::bpe::BpeTokenizer;
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::hf::load_hf_dir;
use crate::transformer::Transformer;

/// Who says a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The system prompt.
    System,
    /// The user (for an agent: the task and the environment's observations).
    User,
    /// The model (for an agent: its actions).
    Assistant,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// A chat template this crate can render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplate {
    /// ChatML: every message is `<|im_start|>{role}\n{content}<|im_end|>\n`; a conversation
    /// that does not start with a system message gets `default_system` first (when the
    /// template has one); the reply is prompted by `<|im_start|>assistant\n`.
    ChatMl {
        /// The system prompt the template inserts when the messages bring none.
        default_system: Option<String>,
    },
}

impl ChatTemplate {
    /// The template a Jinja chat template stands for, if it is one this crate renders.
    pub fn recognise(jinja: &str) -> Option<Self> {
        if !(jinja.contains("<|im_start|>") && jinja.contains("<|im_end|>")) {
            return None;
        }
        let marker = "<|im_start|>system\n";
        let default_system = jinja.find(marker).and_then(|at| {
            let rest = &jinja[at + marker.len()..];
            rest.find("<|im_end|>").map(|end| rest[..end].to_string())
        });
        Some(ChatTemplate::ChatMl { default_system })
    }

    /// The text of `messages`, ending with the prompt for the assistant's reply when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[(Role, &str)], add_generation_prompt: bool) -> String {
        let ChatTemplate::ChatMl { default_system } = self;
        let mut out = String::new();
        let starts_with_system = matches!(messages.first(), Some((Role::System, _)));
        if let (false, Some(system)) = (starts_with_system, default_system) {
            out.push_str(&self.message(Role::System, system));
        }
        for (role, content) in messages {
            out.push_str(&self.message(*role, content));
        }
        if add_generation_prompt {
            out.push_str(&self.open(Role::Assistant));
        }
        out
    }

    /// The text that opens a message of `role` (`<|im_start|>user\n`).
    pub fn open(&self, role: Role) -> String {
        format!("<|im_start|>{}\n", role.name())
    }

    /// The text that closes a message (`<|im_end|>\n`).
    pub fn close(&self) -> &'static str {
        "<|im_end|>\n"
    }

    /// The markup the framework lays episodes out with (the default system prompt, the
    /// openings of user and assistant messages, the end of a message).
    pub fn markup(&self) -> ChatMarkup {
        let ChatTemplate::ChatMl { default_system } = self;
        ChatMarkup {
            system: default_system
                .as_deref()
                .map(|s| self.message(Role::System, s))
                .unwrap_or_default(),
            user: self.open(Role::User),
            assistant: self.open(Role::Assistant),
            end: "<|im_end|>".to_string(),
        }
    }

    /// One whole message.
    pub fn message(&self, role: Role, content: &str) -> String {
        format!("{}{content}{}", self.open(role), self.close())
    }
}

/// A pretrained model, its tokenizer and (for a chat model) its chat template.
#[derive(Debug)]
pub struct Pretrained<B: Backend> {
    /// The decoder with the file's weights.
    pub model: Transformer<B>,
    /// The tokenizer the model was trained with.
    pub tokenizer: BpeTokenizer,
    /// The chat template, when the source has one this crate renders.
    pub chat: Option<ChatTemplate>,
    /// The source's chat template when it has one this crate does not render.
    pub unrecognised_template: Option<String>,
    /// The file or directory it came from.
    pub source: PathBuf,
}

/// Whether `path` names a source [`load_pretrained`] reads: a `.gguf` file, or a directory
/// with a `config.json`.
pub fn is_pretrained_source(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gguf") || path.join("config.json").is_file()
}

/// The quantized blocks of a GGUF source's projections for [`Transformer::with_packed`] on
/// the model [`load_pretrained`] built from it with `config` ([`crate::packed`]); `None` for
/// a Hugging Face directory (dense weights) or a file with no `Q4_1`/`Q8_0` projection.
pub fn packed_weights(
    path: &Path,
    config: &crate::TransformerConfig,
) -> Result<Option<crate::PackedWeights>, ModelError> {
    if path.is_dir() {
        return Ok(None);
    }
    let packed = GgufFile::open(path)?.packed(config)?;
    Ok((!packed.is_empty()).then_some(packed))
}

/// Loads a GGUF file or a Hugging Face directory (see the module docs). `max_seq_len` caps
/// the context the source declares (the rotary tables and KV caches are sized by it).
pub fn load_pretrained<B: AttentionOps>(
    path: &Path,
    max_seq_len: Option<usize>,
    device: &B::Device,
) -> Result<Pretrained<B>, ModelError> {
    let (model, tokenizer, template) = if path.is_dir() {
        let model = load_hf_dir::<B>(path, max_seq_len, device)?;
        let tokenizer = BpeTokenizer::from_tokenizer_json(&path.join("tokenizer.json"))?;
        let template = hf_chat_template(path)?;
        (model, tokenizer, template)
    } else {
        let gguf = GgufFile::open(path)?;
        let tokenizer = gguf.tokenizer()?;
        let model = gguf.transformer::<B>(max_seq_len, device)?;
        (model, tokenizer, gguf.chat_template().map(str::to_string))
    };
    let vocab = model.config().vocab_size;
    if rlany_framework::Tokenizer::vocab_size(&tokenizer) > vocab {
        return Err(ModelError::Mismatch {
            path: path.to_path_buf(),
            message: format!(
                "the tokenizer has {} tokens, the model's embedding {vocab} rows",
                rlany_framework::Tokenizer::vocab_size(&tokenizer)
            ),
        });
    }
    let chat = template.as_deref().and_then(ChatTemplate::recognise);
    let tokenizer = match &chat {
        Some(c) => {
            let markup = c.markup();
            let end = rlany_framework::Tokenizer::encode(&tokenizer, &markup.end);
            if end.first() != Some(&rlany_framework::Tokenizer::eos(&tokenizer)) {
                return Err(ModelError::Mismatch {
                    path: path.to_path_buf(),
                    message: format!(
                        "the chat template ends a message with {:?}, which is not the EOS token",
                        markup.end
                    ),
                });
            }
            tokenizer.with_prompt_format(PromptFormat::Chat(markup))
        }
        None => tokenizer,
    };
    let unrecognised_template = if chat.is_none() { template } else { None };
    Ok(Pretrained {
        model,
        tokenizer,
        chat,
        unrecognised_template,
        source: path.to_path_buf(),
    })
}

/// `chat_template` of a Hugging Face directory's `tokenizer_config.json`, if any.
fn hf_chat_template(dir: &Path) -> Result<Option<String>, ModelError> {
    let path = dir.join("tokenizer_config.json");
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Load {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Load {
        path: path.clone(),
        message: format!("invalid JSON: {e}"),
    })?;
    Ok(json
        .get("chat_template")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and \
        messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI \
        assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' \
        + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if \
        add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_like_the_smollm2_template() {
        let t = ChatTemplate::recognise(SMOLLM2_TEMPLATE).expect("ChatML");
        assert_eq!(
            t,
            ChatTemplate::ChatMl {
                default_system: Some(
                    "You are a helpful AI assistant named SmolLM, trained by Hugging Face".into()
                )
            }
        );
        assert_eq!(
            t.render(&[(Role::User, "Hi")], true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
             Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        // A system message of the caller's replaces the default.
        assert_eq!(
            t.render(
                &[
                    (Role::System, "S"),
                    (Role::User, "U"),
                    (Role::Assistant, "A")
                ],
                false
            ),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n\
             <|im_start|>assistant\nA<|im_end|>\n"
        );
        assert_eq!(
            ChatTemplate::recognise("{{ bos_token }}{{ messages }}"),
            None
        );
    }

    #[test]
    fn tiny_gguf_brings_its_tokenizer_and_template() {
        use burn::backend::NdArray;
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny.gguf");
        assert!(is_pretrained_source(&path));
        let p =
            load_pretrained::<NdArray<f32>>(&path, Some(32), &Default::default()).expect("loads");
        assert_eq!(p.model.config().max_seq_len, 32);
        assert!(matches!(p.chat, Some(ChatTemplate::ChatMl { .. })));
        let tok: &dyn rlany_framework::Tokenizer = &p.tokenizer;
        assert_eq!(tok.vocab_size(), 300);
        assert_eq!((tok.bos(), tok.eos(), tok.pad()), (1, 2, 2));
        let text = "<|im_start|>user\nthe cat sat\n<|im_end|>\n";
        let ids = tok.encode(text);
        assert_eq!(ids.first(), Some(&1));
        assert!(ids.contains(&2));
        // Control tokens decode to nothing; the rest round-trips.
        assert_eq!(tok.decode(&ids), "user\nthe cat sat\n\n");
        // Episodes are laid out as a chat: task and observations are user messages.
        let format = tok.prompt_format();
        let start = format.start(tok, "add 2+3\n", Some("Answer on one line."));
        assert_eq!(
            tok.decode(&start),
            "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\
             user\nAnswer on one line.\n\nadd 2+3\nassistant\n"
        );
        assert_eq!(start.iter().filter(|&&t| t == 1).count(), 3);
        // An action ended by EOS gets its newline; one cut short gets the end of message too.
        assert_eq!(format.close_action(tok, &[2]), tok.encode("\n"));
        assert_eq!(format.close_action(tok, &[97]), tok.encode("<|im_end|>\n"));
        assert_eq!(format.action_text(tok, &tok.encode("x=5\nmore")), "x=5");
        let stops = format.stop_tokens(tok);
        assert!(stops.contains(&2) && stops.contains(&tok.encode("\n")[0]));
    }

    #[test]
    fn missing_source_is_an_error_naming_it() {
        use burn::backend::NdArray;
        let e = load_pretrained::<NdArray<f32>>(
            Path::new("no/such/model.gguf"),
            None,
            &Default::default(),
        )
        .expect_err("absent");
        assert!(e.to_string().contains("no/such/model.gguf"), "{e}");
    }

    /// The tokenizer read from the real SmolLM2 GGUF gives llama.cpp's ids on the 32 strings
    /// of models/fixtures/smollm2_tokens.json (make_token_reference.py); skipped, with a
    /// message, when the model has not been fetched.
    #[test]
    fn smollm2_tokenizer_matches_llama_cpp() {
        use crate::gguf::tests::{ids, smollm2};
        use rlany_framework::Tokenizer;
        let Some(path) = smollm2() else { return };
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let tok = GgufFile::open(&path)
            .expect("open")
            .tokenizer()
            .expect("tokenizer");
        let cases: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join("fixtures/smollm2_tokens.json")).expect("fixture"),
        )
        .expect("json");
        let cases = cases.as_array().expect("cases");
        assert!(cases.len() >= 30);
        for case in cases {
            let text = case["text"].as_str().expect("text");
            assert_eq!(tok.encode(text), ids(&case["ids"]), "{text:?}");
        }
        assert_eq!((tok.bos(), tok.eos(), tok.vocab_size()), (1, 2, 49152));
    }
}
