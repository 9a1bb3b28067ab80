//! The model and prompt flags: `--model`, and `--prompt [--chat]` or `--tokens`.

/// `--model`, with the built-in `tiny` as default.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// tiny | tiny-moe | smollm2 | a Hugging Face checkpoint folder | a .gguf file
    #[arg(long, value_name = "MODEL", default_value = "tiny")]
    pub model: String,
}

/// The prompt: text (optionally wrapped in the chat template) or token ids, exactly one of them.
// clap's group: a missing prompt reads "<--prompt <TEXT>|--tokens <IDS>>", one of the two.
#[derive(clap::Args, Clone, Debug)]
#[command(group(clap::ArgGroup::new("prompt_or_tokens").args(["prompt", "tokens"]).required(true)))]
pub struct PromptArgs {
    /// Prompt text, encoded with the model's tokenizer (adding its special tokens)
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Wrap --prompt as one user message in the tokenizer's chat template (with the generation prompt)
    // `conflicts_with`: clap waives `requires` for an argument that conflicts with one given, here
    // `--prompt` with `--tokens`, so `--tokens 1 --chat` would drop `--chat` silently.
    #[arg(long, requires = "prompt", conflicts_with = "tokens")]
    pub chat: bool,
    /// Prompt as comma-separated token ids, e.g. 1,2,3
    #[arg(long, value_name = "IDS", value_parser = parse_token_ids)]
    pub tokens: Option<TokenIds>,
}

/// Token ids given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

/// Parse `1,2,3` strictly: every comma-separated item must be a token id (spaces around items are
/// allowed; empty items are not).
pub fn parse_token_ids(text: &str) -> Result<TokenIds, String> {
    if text.trim().is_empty() {
        return Err("no token ids given (expected comma-separated ids such as 1,2,3)".into());
    }
    text.split(',')
        .enumerate()
        .map(|(i, item)| {
            let item = item.trim();
            if item.is_empty() {
                return Err(format!("item {} of `{text}` is empty (expected comma-separated ids such as 1,2,3)", i + 1));
            }
            item.parse::<u32>().map_err(|_| {
                format!("`{item}` (item {} of `{text}`) is not a token id (a non-negative integer below 2^32)", i + 1)
            })
        })
        .collect::<Result<Vec<u32>, String>>()
        .map(TokenIds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_are_parsed_strictly() {
        assert_eq!(parse_token_ids("1,2,3"), Ok(TokenIds(vec![1, 2, 3])));
        assert_eq!(parse_token_ids(" 4 , 5"), Ok(TokenIds(vec![4, 5])));
        let err = parse_token_ids("1,x,3").unwrap_err();
        assert!(err.contains("`x` (item 2 of `1,x,3`)"), "{err}");
        assert!(parse_token_ids("1,,2").unwrap_err().contains("item 2"));
        assert!(parse_token_ids("").is_err());
        assert!(parse_token_ids("-1").is_err());
        assert!(parse_token_ids("99999999999").is_err());
    }
}
