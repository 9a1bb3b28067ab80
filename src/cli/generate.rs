//! `m2r2 generate`: greedy or seeded sampled decoding with the base model, early exit, or
//! self-speculation (`--mode`, see [`super::m2r2_args`]), streamed to stdout or reported as one JSON
//! object.

use super::common::{self, ModelArgs, PromptArgs};
use super::m2r2_args::{
    DecodeRequest, M2r2Args, M2r2Settings, ModeRun, report_fields, run_mode, settings_json,
    trace_lines,
};
use super::progress;
use anyhow::{Result, bail};
use reference::base::sampling::SamplingParams;
use reference::io::load::LoadedModel;
use serde_json::json;
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
}

/// Sampling flags: greedy unless `--temperature` > 0.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sample at this temperature (> 0); absent or 0: greedy
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Sample only among the K most likely tokens (K >= 1)
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probability reaches P, in (0, 1]
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Seed of the sampler (same seed, same tokens on every machine)
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampling parameters, or `None` for greedy. Checked before any model is loaded.
    pub fn params(&self) -> Result<Option<SamplingParams>> {
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            bail!("--top-p must be in (0, 1], got {p}");
        }
        if self.top_k == Some(0) {
            bail!("--top-k must be at least 1");
        }
        let temperature = match self.temperature {
            None => 0.0,
            Some(t) if t.is_finite() && t >= 0.0 => t,
            Some(t) => bail!("--temperature must be a finite number >= 0 (0 is greedy), got {t}"),
        };
        if temperature == 0.0 {
            if self.top_k.is_some() || self.top_p.is_some() {
                eprintln!(
                    "note: --top-k/--top-p only apply when sampling (--temperature > 0); decoding greedily"
                );
            }
            return Ok(None);
        }
        let params = SamplingParams {
            temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        };
        params.validate()?;
        Ok(Some(params))
    }
}

pub fn run(args: &Args) -> Result<()> {
    let sampling = args.sampling.params()?;
    let loaded = common::load(&args.model.model)?;
    let weights = args.m2r2.weights(&loaded)?;
    let settings = args.m2r2.settings(&loaded, &weights)?;
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
    let run = run_mode(
        &loaded.model,
        &weights,
        &settings,
        &request,
        args.trace,
        &mut |token| {
            bar.inc(1);
            if let Some(stream) = &mut stream {
                stream.push(token);
            }
        },
    );
    bar.finish_and_clear();
    let run = run?;
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
        common::print_json(&report);
    } else {
        print_summary(&run, prompt.len(), stopped);
    }
    Ok(())
}

/// The `--json` report of one decode (`m2r2 generate`, and `m2r2 run` on ONNX Runtime, which adds
/// its own fields).
pub fn json_report(
    model: &str,
    source: &str,
    request: &DecodeRequest<'_>,
    run: &ModeRun,
    text: Option<String>,
    settings: &M2r2Settings,
) -> serde_json::Value {
    let stopped = run
        .tokens
        .last()
        .is_some_and(|t| request.stop_tokens.contains(t));
    let sampling = request.sampling.as_ref();
    let mut report = json!({
        "model": model,
        "source": source,
        "sampling": if sampling.is_some() { "sample" } else { "greedy" },
        "temperature": sampling.map(|s| decimal(s.temperature)),
        "top_p": sampling.and_then(|s| s.top_p).map(decimal),
        "top_k": sampling.and_then(|s| s.top_k),
        "seed": sampling.map(|s| s.seed),
        "max_new_tokens": request.max_new_tokens,
        "prompt_tokens": request.prompt,
        "tokens": run.tokens,
        "text": text,
        "stop_reason": if stopped { "stop_token" } else { "max_new_tokens" },
        "prefill_tokens_per_second": run.prefill_seconds.map(|s| rate(request.prompt.len(), s)),
        "m2r2": settings_json(settings),
    });
    let object = report.as_object_mut().expect("a JSON object");
    // `mode` names the decoding loop (greedy | early-exit | speculative); `sampling` says whether
    // tokens were sampled.
    object.extend(report_fields(run));
    report
}

/// An f32 flag value as the f64 with the same shortest decimal text, so 0.8 reports as 0.8 and not
/// as 0.800000011920929.
fn decimal(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// `n` per `seconds`, 0 when nothing was timed.
fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

pub fn print_summary(run: &ModeRun, prompt_tokens: usize, stopped: bool) {
    let prefill = match run.prefill_seconds {
        Some(s) => format!(
            "prefill {s:.3} s = {:.1} tokens/s; ",
            rate(prompt_tokens, s)
        ),
        None => String::new(),
    };
    eprintln!(
        "[{} mode: {prompt_tokens} prompt tokens, {} generated ({}); {prefill}decode {:.3} s = {:.1} tokens/s; {:.2} layers per token]",
        run.mode.name(),
        run.tokens.len(),
        if stopped {
            "stopped at an end token"
        } else {
            "reached --max-new-tokens"
        },
        run.decode_seconds,
        run.tokens_per_second(),
        run.layers_per_token,
    );
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
