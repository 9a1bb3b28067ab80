//! `m2r2 generate`: greedy or seeded sampled decoding with the base model, early exit, or
//! self-speculation (`--mode`, see `cli::args::m2r2`), streamed to stdout or reported as one JSON
//! object.

use crate::cli::args::m2r2::M2r2Args;
use crate::cli::args::m2r2::ModeArg;
use crate::cli::args::model::{ModelArgs, PromptArgs};
use crate::cli::args::sampling::SamplingArgs;
use crate::cli::args::tree::{check_gate_flags_read, config_tree_growth};
use crate::cli::common;
use crate::cli::progress;
use crate::cli::report::{json_report, print_summary, trace_lines};
use anyhow::Result;
use reference::decode::mode::{DecodeRequest, run_mode, tree_speculative_mode_run};
use reference::decode::prompt_lookup::LookupConfig;
use reference::decode::speculative::DraftLength;
use reference::io::load::LoadedModel;
use reference::m2r2::config::{DraftTreeConfig, M2r2Config};
use std::io::{IsTerminal, Write};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Tokens to generate at most (0 generates nothing); generation also stops at an end token
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub m2r2: M2r2Args,
    /// Print one JSON object (tokens, text, timings, M2R2 statistics) instead of streaming text
    #[arg(long)]
    pub json: bool,
    /// Print a per-token teaching trace on stderr: greedy: logit and probability; early-exit: gate
    /// scores and where the token exited; speculative: per round the drafts, how many were accepted
    /// and the correction or bonus token
    #[arg(long)]
    pub trace: bool,
    /// Speculative drafting with a token tree of widths W1,W2,... per depth (`2,1,1`: the top 2
    /// drafts, each continued by its top 1 for two more depths), verified in one chunk, on the
    /// reference (`--draft-len N` is the chain 1,1,...). Greedy; with --temperature the children
    /// are sampled from the draft and verified by multi-candidate speculative sampling (lossless).
    /// Default: the M2R2 config's `draft_tree` when it has one (speculative, greedy, no
    /// --draft-len / --dynamic-draft)
    #[arg(long, value_name = "W1,W2,...")]
    pub draft_tree: Option<String>,
    /// Speculative decoding with a prompt-lookup branch: each round also verifies up to N tokens
    /// copied from the text so far (what followed the latest earlier occurrence of its last 3, else
    /// 2, tokens) at no draft step; 0: off. Beside the tree (--draft-tree or the config's
    /// draft_tree), else beside the chain of the draft length, grown per branch when the drafting
    /// is dynamic; with --temperature its tokens are verified as deterministic proposals
    /// (lossless). Default: the M2R2 config's prompt_lookup (speculative, greedy, no --draft-tree
    /// / --draft-len / --dynamic-draft), else off
    #[arg(long, value_name = "N")]
    pub prompt_lookup: Option<usize>,
}

/// `--draft-tree`'s widths, by the rules `run` shares (`cli/args/tree.rs`).
fn tree_widths(args: &Args) -> Result<Option<Vec<usize>>> {
    crate::cli::args::tree::tree_widths(&crate::cli::args::tree::TreeRequest {
        spec: args.draft_tree.as_deref(),
        speculative: args.m2r2.mode == ModeArg::Speculative,
        draft_len: args.m2r2.draft_len,
    })
}

/// `--prompt-lookup`'s branch, by the rules `run` shares (`cli/args/tree.rs`); `None` when the
/// flag is not given.
fn prompt_lookup(args: &Args) -> Result<Option<LookupConfig>> {
    let Some(n) = args.prompt_lookup else {
        return Ok(None);
    };
    crate::cli::args::tree::prompt_lookup(n, args.m2r2.mode == ModeArg::Speculative)
}

/// The M2R2 config's default tree (`draft_tree`, chosen by `tune-drafting`), when nothing asks
/// for other drafting: speculative decoding, greedy, without `--draft-len`, `--dynamic-draft` or
/// `--draft-tree`. `--draft-gate` still moves it to another gate.
fn config_tree<'a>(
    args: &Args,
    sampling: bool,
    config: &'a M2r2Config,
) -> Option<&'a DraftTreeConfig> {
    let asks_otherwise = args.draft_tree.is_some()
        || args.m2r2.draft_len.is_some()
        || args.m2r2.dynamic_draft
        || sampling;
    config
        .draft_tree
        .as_ref()
        .filter(|_| args.m2r2.mode == ModeArg::Speculative && !asks_otherwise)
}

pub fn run(args: &Args) -> Result<()> {
    let sampling = args.sampling.params()?;
    let tree = tree_widths(args)?;
    let lookup = prompt_lookup(args)?;
    let loaded = common::load(&args.model.model)?;
    let weights = args.m2r2.weights(&loaded)?;
    let lookup = crate::cli::args::tree::lookup_or_default(
        (args.prompt_lookup, lookup),
        (
            args.m2r2.mode == ModeArg::Speculative,
            sampling.is_some(),
            args.draft_tree.is_some() || args.m2r2.draft_len.is_some() || args.m2r2.dynamic_draft,
        ),
        weights.config.prompt_lookup,
    );
    let mut settings = args.m2r2.settings(&loaded, &weights)?;
    // how the tree grows: per branch while this gate's score passes its threshold, or whole
    let mut grown = None;
    if args.m2r2.dynamic_draft
        && let DraftLength::Dynamic {
            gate, threshold, ..
        } = settings.draft_length
    {
        grown = Some((gate, threshold));
    }
    let tree = match (tree, config_tree(args, sampling.is_some(), &weights.config)) {
        (Some(widths), _) => Some(widths),
        (None, Some(t)) => {
            settings.draft_gate = args.m2r2.draft_gate.unwrap_or(t.draft_gate);
            // `--threshold` is one number here (settings refuse one per gate outside early exit)
            let threshold = args.m2r2.threshold.is_some().then_some(settings.threshold);
            grown = config_tree_growth(t, args.m2r2.gate, threshold);
            Some(t.widths.clone())
        }
        // a lookup branch beside the chain of the draft length, dynamic or fixed as configured
        (None, None) if lookup.is_some() => {
            Some(crate::cli::args::tree::lookup_chain(&settings, &mut grown))
        }
        (None, None) => None,
    };
    if let Some(widths) = &tree {
        crate::cli::args::tree::draft_tree_settings(&mut settings, widths, grown);
    }
    // --trace scores every draft of a chain with the gate, fixed drafting or not
    let traced_chain = args.trace && tree.is_none();
    check_gate_flags_read(
        args.m2r2.gate.is_some() && !traced_chain,
        args.m2r2.threshold.is_some(),
        &settings,
    )?;
    let prompt = common::prompt_tokens(&loaded, &args.prompt)?;
    let request = DecodeRequest {
        prompt: &prompt,
        max_new_tokens: args.max_new_tokens,
        stop_tokens: loaded.stop_tokens(),
        sampling,
    };

    // Streaming text and a progress bar would fight over one terminal: the bar is shown only when
    // the text is not going to it.
    let show_bar = request.max_new_tokens >= 32 && (args.json || !std::io::stdout().is_terminal());
    let bar = if show_bar {
        progress::tokens(request.max_new_tokens as u64, "generating")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut stream = (!args.json).then(|| TextStream::new(&loaded));
    let mut on_token = |token| {
        bar.inc(1);
        if let Some(stream) = &mut stream {
            stream.push(token);
        }
    };
    let run = match &tree {
        Some(widths) => tree_speculative_mode_run(
            &loaded.model,
            &weights,
            &settings,
            &request,
            widths,
            lookup,
            &mut on_token,
        ),
        None => run_mode(
            &loaded.model,
            &weights,
            &settings,
            &request,
            args.trace,
            &mut on_token,
        ),
    };
    bar.finish_and_clear();
    let run =
        run.map_err(|e| common::name_budget_flag(e.into(), "sequence", "--max-new-tokens"))?;
    if let Some(stream) = stream {
        stream.finish()?;
    }
    if args.trace {
        let text = |token: u32| match &loaded.tokenizer {
            Some(t) => t.decode(&[token], false).unwrap_or_default(),
            None => String::new(),
        };
        for line in trace_lines(&run, &settings, &text) {
            eprintln!("{line}");
        }
    }

    let stopped = run
        .tokens
        .last()
        .is_some_and(|t| request.stop_tokens.contains(t));
    if args.json {
        let text = match &loaded.tokenizer {
            Some(t) => Some(t.decode(&run.tokens, true)?),
            None => None,
        };
        let report = json_report(
            &loaded.name,
            &loaded.source,
            &request,
            &run,
            text,
            &settings,
        );
        common::print_json(&report)?;
    } else {
        print_summary(&run, &request, stopped);
    }
    Ok(())
}

/// Prints generated tokens to stdout as they arrive: text through the tokenizer's streaming decoder,
/// or space-separated ids for a model without a tokenizer. Write errors (a closed pipe) stop the
/// printing and are reported once generation is over.
struct TextStream<'a> {
    decoder: Option<reference::io::tokenizer::StreamDecoder<'a>>,
    out: std::io::Stdout,
    printed_any: bool,
    ends_with_newline: bool,
    error: Option<anyhow::Error>,
}

impl<'a> TextStream<'a> {
    fn new(loaded: &'a LoadedModel) -> Self {
        TextStream {
            decoder: loaded.tokenizer.as_ref().map(|t| t.stream_decoder(true)),
            out: std::io::stdout(),
            printed_any: false,
            ends_with_newline: true,
            error: None,
        }
    }

    fn push(&mut self, token: u32) {
        if self.error.is_some() {
            return;
        }
        let piece = match &mut self.decoder {
            Some(decoder) => match decoder.step(token) {
                Ok(Some(text)) => text,
                Ok(None) => return,
                Err(e) => {
                    self.error = Some(e.into());
                    return;
                }
            },
            None if self.printed_any => format!(" {token}"),
            None => token.to_string(),
        };
        self.write(&piece);
    }

    fn write(&mut self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        let mut out = self.out.lock();
        if let Err(e) = out.write_all(piece.as_bytes()).and_then(|()| out.flush()) {
            self.error = Some(anyhow::Error::new(e).context("cannot write to stdout"));
            return;
        }
        self.printed_any = true;
        self.ends_with_newline = piece.ends_with('\n');
    }

    /// Print the text the decoder still holds, end the output with a newline, and report the first
    /// error.
    fn finish(mut self) -> Result<()> {
        if let Some(decoder) = self.decoder.take()
            && self.error.is_none()
        {
            let rest = decoder.finish()?;
            self.write(&rest);
        }
        if !self.ends_with_newline && self.error.is_none() {
            self.write("\n");
        }
        match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
