//! `m2r2 demo`: a tour of what the reference does today, on a built-in model with no files needed
//! (the ONNX section uses ONNX Runtime, fetched from PyPI on first use).
//! Each section is one function in [`SECTIONS`]; later issues append theirs. Sections that check
//! something print `OK` / `NOT OK`, and the demo exits 1 if any check failed.

mod base;
mod modes;
mod moe;
pub mod onnx;

use crate::cli::args::bench::Sizes;
use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use crate::cli::decode_speed;
use anyhow::{Context, Result, bail};
use base::{
    cache_vs_recompute, golden_round_trip, greedy_generation, model_summary, seeded_sampling,
    teacher_forced_logits,
};
use modes::m2r2_modes;
use moe::moe_prefetch;
use reference::base::generate::{GenerateOptions, Generation, generate};
use reference::base::sampling::SamplingParams;
use reference::io::load::LoadedModel;
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One section of the demo: prints what it shows, records its checks.
type Section = fn(&mut Demo) -> Result<()>;

/// The demo, in order: (title, section).
const SECTIONS: &[(&str, Section)] = &[
    ("model", model_summary),
    ("greedy generation", greedy_generation),
    ("seeded sampling", seeded_sampling),
    ("teacher-forced logits", teacher_forced_logits),
    ("KV cache vs full recompute", cache_vs_recompute),
    ("golden write + check", golden_round_trip),
    ("M2R2 modes", m2r2_modes),
    ("ONNX export + ONNX Runtime", onnx_runtime),
    ("MoE expert prefetch", moe_prefetch),
    ("bench", short_bench),
];

const PROMPT: &str = "The quick brown fox";
const NEW_TOKENS: usize = 16;

/// State shared by the sections.
struct Demo {
    loaded: LoadedModel,
    /// The demo prompt's token ids.
    prompt: Vec<u32>,
    /// The greedy continuation (set by the greedy section, used by later ones).
    greedy: Vec<u32>,
    /// (what, ok) of every check.
    checks: RefCell<Vec<(String, bool)>>,
}

impl Demo {
    fn check(&self, what: impl Into<String>, ok: bool) {
        let what = what.into();
        println!("  {:<6} {what}", if ok { "OK" } else { "NOT OK" });
        self.checks.borrow_mut().push((what, ok));
    }

    fn text(&self, tokens: &[u32]) -> Result<String> {
        Ok(self.loaded.tokenizer()?.decode(tokens, true)?)
    }

    fn run(&self, sampling: Option<SamplingParams>, max_new_tokens: usize) -> Result<Generation> {
        let options = GenerateOptions {
            max_new_tokens,
            stop_tokens: self.loaded.stop_tokens(),
            sampling,
        };
        Ok(generate(
            &self.loaded.model,
            &self.prompt,
            &options,
            &mut |_, _| {},
        )?)
    }
}

pub fn run(args: &Args) -> Result<()> {
    let start = Instant::now();
    let loaded = common::load(&args.model.model)?;
    // the tour prints text: a model without a tokenizer has no demo (the other commands take
    // token ids)
    let Some(tokenizer) = &loaded.tokenizer else {
        bail!(
            "{} has no tokenizer (no tokenizer.json beside its weights), and the demo prints \
             text: give a model with one, or use `generate --tokens IDS` on this one",
            loaded.name
        );
    };
    let prompt = tokenizer.encode(PROMPT, true)?;
    let mut demo = Demo {
        loaded,
        prompt,
        greedy: vec![],
        checks: RefCell::new(vec![]),
    };
    for (i, (title, section)) in SECTIONS.iter().enumerate() {
        println!("\n== {}/{} {title} ==", i + 1, SECTIONS.len());
        section(&mut demo).with_context(|| format!("demo section `{title}`"))?;
    }
    let checks = demo.checks.into_inner();
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.1)
        .map(|c| c.0.as_str())
        .collect();
    println!(
        "\ndemo finished in {:.1} s: {} checks, {} NOT OK",
        start.elapsed().as_secs_f64(),
        checks.len(),
        failed.len()
    );
    if !failed.is_empty() {
        bail!("demo checks failed: {}", failed.join("; "));
    }
    Ok(())
}

fn short_bench(demo: &mut Demo) -> Result<()> {
    let sizes = Sizes {
        prompt_len: 32,
        decode_tokens: 16,
        repeats: 2,
        bandwidth_mib: 1024,
    };
    let result = decode_speed::measure(&demo.loaded, &sizes)?;
    decode_speed::print_table(&result);
    Ok(())
}

/// Export, then greedy and speculative on ONNX Runtime against the reference (`demo/onnx.rs`).
fn onnx_runtime(demo: &mut Demo) -> Result<()> {
    let dir = TempDir::new()?;
    onnx::tour(
        &demo.loaded,
        &demo.prompt,
        NEW_TOKENS,
        &dir.0,
        &mut |what, ok| demo.check(what, ok),
    )
}

/// A fresh folder under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("m2r2-demo-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}
