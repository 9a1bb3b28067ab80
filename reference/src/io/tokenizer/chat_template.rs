//! Chat templates: Jinja templates (`tokenizer.chat_template`) rendered with minijinja the way
//! transformers renders them with jinja2 (`apply_chat_template(..., tokenize=False)`).
//!
//! transformers' environment, reproduced here: `trim_blocks` and `lstrip_blocks` on; the
//! variables `messages`, `add_generation_prompt` and the special tokens (`bos_token`, `eos_token`,
//! `unk_token`, `pad_token`, those the tokenizer has); the function `raise_exception(msg)`.
//! Python string methods templates call (`.strip()`, `.startswith()`, ...) and dict methods
//! (`.items()`, `.get()`) are provided for the common cases. Not available: `tojson`, loop
//! `break` / `continue`, `strftime_now` (a template that uses them fails with a message naming
//! what is missing).

use super::Tokenizer;
use crate::error::{Error, Result};
use minijinja::value::{Value, ValueKind, from_args};
use minijinja::{Environment, ErrorKind, State, context};
use serde::{Deserialize, Serialize};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Instructions a chat template may run per rendering (minijinja's fuel): SmolLM2's template
/// over a 100-message conversation needs 2 315; this is ample for real templates and stops a
/// template that loops for ever (or for 10^10 steps) in about 0.1 s.
pub const CHAT_TEMPLATE_FUEL: u64 = 1_000_000;
/// Bytes a rendered chat template may have (16 MiB: far above any model's context in text).
/// A template can still build a large string in a variable within its fuel (doubling it in a
/// loop); minijinja has no bound on that, see docs/TESTING.md "Hostile inputs and fuzzing".
pub const CHAT_TEMPLATE_MAX_OUTPUT: usize = 16 << 20;

/// ChatML, used when the tokenizer's source has no chat template: every message as
/// `<|im_start|>{role}\n{content}<|im_end|>\n`, then `<|im_start|>assistant\n` when a generation
/// prompt is asked for. Unlike SmolLM2's own template it adds no default system message.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

impl Tokenizer {
    /// The conversation rendered by the chat template, as text (encode it with
    /// `add_special_tokens = false`: the template writes the special tokens). With
    /// `add_generation_prompt` the text ends with the start of an assistant turn.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let env = environment();
        let template = env
            .template_from_str(&self.chat_template)
            .map_err(|e| self.template_error(e))?;
        let token = |t: &Option<super::SpecialToken>| t.as_ref().map(|t| t.content.clone());
        let mut out = Bounded(Vec::new());
        template
            .render_captured_to(
                context! {
                    messages => messages,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => token(&self.bos),
                    eos_token => token(&self.eos),
                    unk_token => token(&self.unk),
                    pad_token => token(&self.pad),
                },
                &mut out,
            )
            .map_err(|e| self.template_error(e))?;
        String::from_utf8(out.0)
            .map_err(|e| Error::Tokenizer(format!("chat template: the output is not UTF-8: {e}")))
    }

    /// Whether the chat template parses (`info` reports one that does not, before a `--chat`
    /// run fails on it); the error is the one [`Tokenizer::apply_chat_template`] would give.
    pub fn check_chat_template(&self) -> Result<()> {
        environment()
            .template_from_str(&self.chat_template)
            .map(|_| ())
            .map_err(|e| self.template_error(e))
    }

    /// A template error with its causes, naming where the template came from.
    fn template_error(&self, e: minijinja::Error) -> Error {
        let mut msg = format!("chat template ({}): {e}", self.chat_template_origin);
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        if e.kind() == ErrorKind::OutOfFuel {
            msg.push_str(&format!(
                " (a rendering may run at most {CHAT_TEMPLATE_FUEL} template instructions)"
            ));
        }
        Error::Tokenizer(msg)
    }
}

/// transformers' jinja2 environment for chat templates (see the module's documentation).
fn environment<'source>() -> Environment<'source> {
    let mut env = Environment::new();
    // A template is code from the model's files: bound its work (a loop of loops) and its
    // recursion (minijinja's default, 500) so a hostile one fails instead of hanging.
    env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.set_unknown_method_callback(python_method);
    env
}

/// The rendered text, refused past [`CHAT_TEMPLATE_MAX_OUTPUT`] bytes.
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > CHAT_TEMPLATE_MAX_OUTPUT {
            return Err(std::io::Error::other(format!(
                "the rendered text exceeds {CHAT_TEMPLATE_MAX_OUTPUT} bytes"
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The Python `str` and `dict` methods chat templates commonly call.
fn python_method(
    _state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, minijinja::Error> {
    if let Some(s) = value.as_str() {
        let chars = |arg: Option<&str>| -> Vec<char> {
            arg.map(|a| a.chars().collect()).unwrap_or_default()
        };
        let strip_set = |c: char, set: &[char]| {
            if set.is_empty() {
                c.is_whitespace()
            } else {
                set.contains(&c)
            }
        };
        return Ok(match method {
            "strip" | "lstrip" | "rstrip" => {
                let (arg,): (Option<&str>,) = from_args(args)?;
                let set = chars(arg);
                let out = match method {
                    "strip" => s.trim_matches(|c| strip_set(c, &set)),
                    "lstrip" => s.trim_start_matches(|c| strip_set(c, &set)),
                    _ => s.trim_end_matches(|c| strip_set(c, &set)),
                };
                Value::from(out)
            }
            "startswith" => {
                let (prefix,): (&str,) = from_args(args)?;
                Value::from(s.starts_with(prefix))
            }
            "endswith" => {
                let (suffix,): (&str,) = from_args(args)?;
                Value::from(s.ends_with(suffix))
            }
            "lower" => Value::from(s.to_lowercase()),
            "upper" => Value::from(s.to_uppercase()),
            "replace" => {
                let (old, new): (&str, &str) = from_args(args)?;
                Value::from(s.replace(old, new))
            }
            "split" => {
                let (sep,): (Option<&str>,) = from_args(args)?;
                let parts: Vec<Value> = match sep {
                    Some(sep) => s.split(sep).map(Value::from).collect(),
                    None => s.split_whitespace().map(Value::from).collect(),
                };
                Value::from(parts)
            }
            _ => return Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
        });
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" | "keys" | "values" => {
                let _: () = from_args(args)?;
                let mut out = vec![];
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    out.push(match method {
                        "items" => Value::from(vec![key, item]),
                        "keys" => key,
                        _ => item,
                    });
                }
                Ok(Value::from(out))
            }
            "get" => {
                let (key, default): (Value, Option<Value>) = from_args(args)?;
                let item = value.get_item(&key)?;
                Ok(if item.is_undefined() {
                    default.unwrap_or(Value::from(()))
                } else {
                    item
                })
            }
            _ => Err(minijinja::Error::from(ErrorKind::UnknownMethod)),
        };
    }
    Err(minijinja::Error::from(ErrorKind::UnknownMethod))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_template(template: &str) -> Tokenizer {
        let mut t = Tokenizer::byte_level_builtin(300).unwrap();
        t.chat_template = template.to_string();
        t.chat_template_origin = "test.jinja".into();
        t.chat_template_is_fallback = false;
        t
    }

    #[test]
    fn chatml_fallback() {
        let t = Tokenizer::byte_level_builtin(300).unwrap();
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        assert_eq!(
            t.apply_chat_template(&messages, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.apply_chat_template(&messages[1..], false).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
        let ids = t
            .encode(&t.apply_chat_template(&messages[1..], true).unwrap(), false)
            .unwrap();
        assert_eq!(ids[0], t.token_to_id("<|im_start|>").unwrap());
    }

    #[test]
    fn jinja2_whitespace_rules() {
        // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it.
        let t = with_template(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n",
        );
        let out = t.apply_chat_template(
            &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
            false,
        );
        assert_eq!(out.unwrap(), "[a]\n[b]\n");
    }

    #[test]
    fn python_methods_and_special_tokens() {
        let t = with_template(
            "{{ eos_token }}|{{ messages[0].content.strip() }}|{{ messages[0].content.lstrip(' x') }}|\
             {{ messages[0]['role'].startswith('us') }}|{{ messages[0].role.upper() }}|\
             {{ 'a,b'.split(',') | join('+') }}|{{ messages[0].get('role') }}|{{ messages[0].get('x', 'd') }}|\
             {% for k, v in messages[0].items() %}{{ k }}={{ v | length }};{% endfor %}",
        );
        let out = t
            .apply_chat_template(&[ChatMessage::new("user", "  x hi ")], false)
            .unwrap();
        assert_eq!(
            out,
            "<|endoftext|>|x hi|hi |True|USER|a+b|user|d|role=4;content=7;"
        );
    }

    #[test]
    fn template_errors_are_tokenizer_errors() {
        let t = with_template("{{ raise_exception('no system role allowed') }}");
        let err = t.apply_chat_template(&[], false).unwrap_err();
        assert!(matches!(err, Error::Tokenizer(_)));
        assert!(err.to_string().contains("no system role allowed"), "{err}");
        // a template that does not parse: found before a rendering, named by where it came from
        let t = with_template("{% for m in messages %}{{ m.content");
        let err = t.apply_chat_template(&[], false).unwrap_err().to_string();
        assert!(
            err.contains("chat template (test.jinja): syntax error"),
            "{err}"
        );
        assert_eq!(t.check_chat_template().unwrap_err().to_string(), err);
        assert!(
            with_template("{{ messages }}")
                .check_chat_template()
                .is_ok()
        );
        let chatml = Tokenizer::byte_level_builtin(300).unwrap();
        assert!(chatml.check_chat_template().is_ok());
        let t = with_template("{{ messages[0].content.frobnicate() }}");
        let err = t
            .apply_chat_template(&[ChatMessage::new("user", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("frobnicate") || err.contains("unknown method"),
            "{err}"
        );
    }
}

/// Fuel: real templates over long conversations fit in [`CHAT_TEMPLATE_FUEL`] with room to
/// spare; a template that loops for 10^10 steps stops with a clear error, fast.
#[cfg(test)]
mod fuel_tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template (as in its tokenizer_config.json).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn with_template(template: &str) -> Tokenizer {
        let mut t = Tokenizer::byte_level_builtin(300).unwrap();
        t.chat_template = template.to_string();
        t.chat_template_origin = "test.jinja".into();
        t.chat_template_is_fallback = false;
        t
    }

    fn fuel_used(template: &str, messages: &[ChatMessage]) -> u64 {
        let mut env = Environment::new();
        env.set_fuel(Some(u64::MAX / 2));
        let t = env.template_from_str(template).unwrap();
        let rendered = t
            .render_captured(context! { messages => messages, add_generation_prompt => true })
            .unwrap();
        rendered.state().fuel_levels().unwrap().0
    }

    #[test]
    fn long_conversations_fit_the_fuel() {
        let messages: Vec<ChatMessage> = (0..100)
            .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "Hello there"))
            .collect();
        let used = fuel_used(SMOLLM2, &messages);
        eprintln!("SmolLM2's template, 100 messages: {used} instructions of fuel");
        assert!(used * 100 < CHAT_TEMPLATE_FUEL, "{used}");
        let text = with_template(SMOLLM2)
            .apply_chat_template(&messages, true)
            .unwrap();
        assert_eq!(text.matches("<|im_start|>").count(), 102);
    }

    #[test]
    fn a_template_that_loops_runs_out_of_fuel() {
        let bomb = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}";
        let start = std::time::Instant::now();
        let err = with_template(bomb)
            .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("chat template") && err.contains("fuel"),
            "{err}"
        );
        // Not a timing assertion: a hang would never get here.
        eprintln!("stopped after {:?}: {err}", start.elapsed());
        let deep = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let err = with_template(deep)
            .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("recursion"), "{err}");
        let wide = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
        let err = with_template(wide)
            .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceeds 16777216 bytes"), "{err}");
    }
}
