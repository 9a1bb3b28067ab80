//! Text <-> token ids, and chat templates, built on the `tokenizers` crate (HF's own Rust tokenizer).
//!
//! Three ways to get a [`Tokenizer`]:
//! - [`Tokenizer::from_gguf`]: the vocabulary, merges and special tokens stored in a GGUF's
//!   metadata, assembled into exactly the pipeline transformers 5.23 builds for the same file
//!   (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`).
//! - [`Tokenizer::from_file`]: a HF `tokenizer.json` (with `tokenizer_config.json` beside it for
//!   the chat template and the BOS / EOS tokens).
//! - [`Tokenizer::byte_level_builtin`]: a small byte-level BPE for the built-in random models.
//!
//! Ids follow transformers: [`Tokenizer::encode`] with `add_special_tokens = true` is
//! `tokenizer(text).input_ids`, [`Tokenizer::decode`] is `tokenizer.decode(ids,
//! skip_special_tokens=...)`, [`Tokenizer::apply_chat_template`] is `apply_chat_template(messages,
//! tokenize=False, add_generation_prompt=...)`.

mod byte_level;
mod chat_template;
mod gguf;
mod guard;
mod hf_json;
mod stream;

pub use chat_template::{CHATML_TEMPLATE, ChatMessage};
pub use stream::StreamDecoder;

use crate::error::{Error, Result};

/// A special token: its text and id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    pub content: String,
    pub id: u32,
}

/// A text tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<SpecialToken>,
    eos: Option<SpecialToken>,
    unk: Option<SpecialToken>,
    pad: Option<SpecialToken>,
    /// Tokens that end a generation: EOS, then end-of-turn tokens (`<|im_end|>`, ...).
    eos_ids: Vec<u32>,
    /// Jinja source of the chat template.
    chat_template: String,
    /// Where the template came from, for error messages (`` GGUF key `tokenizer.chat_template` in
    /// model.gguf ``, ...).
    chat_template_origin: String,
    /// True when the source had no template and [`CHATML_TEMPLATE`] stands in.
    chat_template_is_fallback: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eos_ids", &self.eos_ids)
            .field("chat_template_is_fallback", &self.chat_template_is_fallback)
            .finish()
    }
}

/// End-of-turn tokens of common chat formats, stopped on when the vocabulary has them.
const END_OF_TURN: &[&str] = &["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"];

impl Tokenizer {
    /// Wrap a built `tokenizers` pipeline; `chat_template` is the Jinja source and where it came
    /// from, `None` falls back to ChatML.
    fn assemble(
        inner: tokenizers::Tokenizer,
        specials: [Option<SpecialToken>; 4],
        extra_eos: &[u32],
        chat_template: Option<(String, String)>,
    ) -> Tokenizer {
        let [bos, eos, unk, pad] = specials;
        let mut eos_ids: Vec<u32> = eos.iter().map(|t| t.id).collect();
        let turn_ends = END_OF_TURN.iter().filter_map(|t| inner.token_to_id(t));
        for id in extra_eos.iter().copied().chain(turn_ends) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let chat_template_is_fallback = chat_template.is_none();
        let (chat_template, chat_template_origin) = chat_template.unwrap_or_else(|| {
            let origin = "ChatML, standing in for a template the tokenizer lacks";
            (CHATML_TEMPLATE.to_string(), origin.to_string())
        });
        Tokenizer {
            inner,
            bos,
            eos,
            unk,
            pad,
            eos_ids,
            chat_template,
            chat_template_origin,
            chat_template_is_fallback,
        }
    }

    /// Token ids of `text`. With `add_special_tokens` the post-processor adds what the tokenizer
    /// adds by default (BOS / EOS when the source asks for them; nothing for SmolLM2). Special
    /// tokens written in the text (`<|im_start|>`) are always matched whole.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let what = || format!("cannot encode {:?}", preview(text));
        let encoding = guard::guarded(&what(), || self.inner.encode(text, add_special_tokens))?
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", what())))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`; with `skip_special_tokens` special tokens are left out. As in
    /// transformers, ids without a token (beyond the vocabulary) decode to nothing, and an
    /// incomplete UTF-8 sequence decodes to U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let what = || format!("cannot decode {} ids", ids.len());
        guard::guarded(&what(), || self.inner.decode(ids, skip_special_tokens))?
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", what())))
    }

    /// A decoder that turns ids into text one at a time, holding back bytes until they form whole
    /// UTF-8 characters.
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special_tokens)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of token ids, added tokens included (transformers' `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|t| t.id)
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos.as_ref().map(|t| t.id)
    }

    /// Ids that end a generation: EOS first, then end-of-turn tokens present in the vocabulary
    /// (`<|im_end|>`, `<|eot_id|>`, ...), without repeats.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// The Jinja source of the chat template.
    pub fn chat_template(&self) -> &str {
        &self.chat_template
    }

    /// True when the source had no chat template and ChatML ([`CHATML_TEMPLATE`]) is used.
    pub fn chat_template_is_fallback(&self) -> bool {
        self.chat_template_is_fallback
    }

    /// The underlying `tokenizers` pipeline (to save it as `tokenizer.json`, inspect it, ...).
    pub fn backend(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// The start of `text` for error messages.
fn preview(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_ids_decode_to_nothing() {
        let t = Tokenizer::byte_level_builtin(300).unwrap();
        assert_eq!(
            t.decode(&[b'h' as u32, 300, b'i' as u32], false).unwrap(),
            "hi"
        );
        assert_eq!(preview(&"x".repeat(50)), format!("{}...", "x".repeat(40)));
    }
}
