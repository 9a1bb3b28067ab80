//! `m2r2 demo`: a tour of what the reference does today, on a built-in model with no files needed
//! (the ONNX section uses ONNX Runtime, fetched from PyPI on first use).
//! Each section is one function in [`SECTIONS`]; later issues append theirs. Sections that check
//! something print `OK` / `NOT OK`, and the demo exits 1 if any check failed.

pub mod onnx;

use crate::cli::args::bench::Sizes;
use crate::cli::args::model::ModelArgs;
use crate::cli::args::moe_sim::MoeSimArgs;
use crate::cli::common;
use crate::cli::decode_speed;
use crate::cli::moe_report;
use anyhow::{Context, Result, bail};
use reference::base::generate::{GenerateOptions, Generation, generate};
use reference::base::sampling::SamplingParams;
use reference::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
use reference::decode::mode::{DecodeRequest, M2r2Settings, Mode, ModeDetails, ModeRun, run_mode};
use reference::decode::speculative::DraftLength;
use reference::golden::{DEFAULT_ATOL, Golden};
use reference::io::load::LoadedModel;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use reference::moe_aot::expert_prefetch::collect_trace;
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
    let prompt = loaded.tokenizer()?.encode(PROMPT, true)?;
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

fn model_summary(demo: &mut Demo) -> Result<()> {
    let l = &demo.loaded;
    let c = &l.model.config;
    println!("  {} from {}", l.name, l.source);
    println!(
        "  {:?}, {} parameters ({} as f32), {} layers, D={}, I={}, {} query / {} kv heads of {}, context {}",
        c.architecture,
        common::count(c.parameter_count() as f64),
        common::bytes(4.0 * c.parameter_count() as f64),
        c.num_hidden_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        l.model.context_length()
    );
    match &c.moe {
        None => println!("  feed-forward: dense SwiGLU"),
        Some(m) => println!(
            "  feed-forward: MoE, {} experts, top-{}",
            m.num_local_experts, m.num_experts_per_tok
        ),
    }
    println!("  vocab {}, config hash {}", c.vocab_size, c.hash());
    Ok(())
}

fn greedy_generation(demo: &mut Demo) -> Result<()> {
    let g = demo.run(None, NEW_TOKENS)?;
    println!("  prompt {PROMPT:?} -> {:?}", demo.prompt);
    println!("  greedy {:?}", g.tokens);
    println!("  text   {:?}", demo.text(&g.tokens)?);
    println!(
        "  prefill {:.1} ms, decode {:.1} tokens/s",
        1e3 * g.prefill_seconds,
        g.decode_tokens_per_second()
    );
    let again = demo.run(None, NEW_TOKENS)?;
    demo.check("greedy decoding is deterministic", again.tokens == g.tokens);
    demo.greedy = g.tokens;
    Ok(())
}

fn seeded_sampling(demo: &mut Demo) -> Result<()> {
    let params = |seed| SamplingParams {
        temperature: 3.0,
        top_k: Some(40),
        top_p: Some(0.95),
        seed,
    };
    let a = demo.run(Some(params(7)), NEW_TOKENS)?;
    let b = demo.run(Some(params(7)), NEW_TOKENS)?;
    let c = demo.run(Some(params(8)), NEW_TOKENS)?;
    println!("  temperature 3.0, top-k 40, top-p 0.95");
    println!("  seed 7 {:?}", a.tokens);
    println!("  seed 8 {:?}", c.tokens);
    println!("  text (seed 7) {:?}", demo.text(&a.tokens)?);
    demo.check("the same seed gives the same tokens", a.tokens == b.tokens);
    println!(
        "  another seed gives {} tokens",
        if c.tokens == a.tokens {
            "the same"
        } else {
            "different"
        }
    );
    Ok(())
}

fn teacher_forced_logits(demo: &mut Demo) -> Result<()> {
    let tokens: Vec<u32> = demo.prompt.iter().chain(&demo.greedy).copied().collect();
    let logits = demo.loaded.model.teacher_forced_logits(&tokens)?; // [T, V]
    println!(
        "  {} tokens -> logits {:?} in one chunk",
        tokens.len(),
        logits.shape()
    );
    let last = logits.row(logits.nrows() - 1);
    let mut top: Vec<(usize, f32)> = last.iter().copied().enumerate().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = top[..5]
        .iter()
        .map(|(id, l)| format!("{id}: {l:.3}"))
        .collect();
    println!("  top 5 at the last position: {}", top.join(", "));
    // Greedy token i was chosen from position P - 1 + i.
    let p = demo.prompt.len();
    let argmax_agrees = demo.greedy.iter().enumerate().all(|(i, &t)| {
        let row = logits.row(p - 1 + i);
        reference::base::ops::argmax(row.as_slice().expect("contiguous")) as u32 == t
    });
    demo.check(
        "every greedy token is the argmax of its teacher-forced row",
        argmax_agrees,
    );
    Ok(())
}

fn cache_vs_recompute(demo: &mut Demo) -> Result<()> {
    let model = &demo.loaded.model;
    let options = GenerateOptions {
        max_new_tokens: NEW_TOKENS,
        stop_tokens: vec![],
        sampling: None,
    };
    // Decoding one token at a time from the cache ...
    let mut rows: Vec<Vec<f32>> = vec![];
    let g = generate(model, &demo.prompt, &options, &mut |_, logits| {
        rows.push(logits.to_vec())
    })?;
    // ... against the whole sequence in one chunk from an empty cache.
    let tokens: Vec<u32> = demo.prompt.iter().chain(&g.tokens).copied().collect();
    let full = model.teacher_forced_logits(&tokens[..tokens.len() - 1])?;
    let p = demo.prompt.len();
    let mut max_abs = 0.0f32;
    let mut bitwise = true;
    for (i, row) in rows.iter().enumerate() {
        for (a, b) in row.iter().zip(full.row(p - 1 + i)) {
            bitwise &= a.to_bits() == b.to_bits();
            max_abs = max_abs.max((a - b).abs());
        }
    }
    println!(
        "  {} decoded positions compared, max abs diff {max_abs:e}",
        rows.len()
    );
    demo.check(
        "cached decode logits == full recompute, bit for bit",
        bitwise,
    );

    let mut one_chunk = model.new_cache(tokens.len())?;
    model.forward(&tokens, &mut one_chunk)?;
    let mut step_by_step = model.new_cache(tokens.len())?;
    model.forward(&tokens[..p], &mut step_by_step)?;
    for &t in &tokens[p..] {
        model.forward(&[t], &mut step_by_step)?;
    }
    demo.check(
        "KV cache filled token by token == filled in one chunk, bit for bit",
        one_chunk.prefix_equals(&step_by_step, tokens.len()),
    );
    Ok(())
}

fn golden_round_trip(demo: &mut Demo) -> Result<()> {
    let dir = TempDir::new()?;
    let path = dir.0.join("golden.safetensors");
    let model = &demo.loaded.model;
    let golden = Golden::record_greedy(model, &demo.loaded.name, &demo.prompt, 8)?;
    golden.write(&path)?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "  wrote {} ({}), {} steps",
        path.display(),
        common::bytes(size as f64),
        golden.tokens.len()
    );
    let back = Golden::read(&path)?;
    let report = back.check(model, DEFAULT_ATOL)?;
    for e in &report.entries {
        println!(
            "    {:<7} {:<6} max abs diff {:.3e}  max rel diff {:.3e}  {}",
            e.name,
            if e.ok { "OK" } else { "NOT OK" },
            e.max_abs,
            e.max_rel,
            e.note
        );
    }
    demo.check("golden written, read back and checked", report.ok());
    let mut tampered = back;
    tampered.logits[[3, 5]] += 1e-2;
    let report = tampered.check(model, DEFAULT_ATOL)?;
    let logits = &report.entries[0];
    println!(
        "  one logit moved by 1e-2: logits {} (max abs diff {:.3e} at {:?})",
        if logits.ok { "OK" } else { "NOT OK" },
        logits.max_abs,
        logits.at
    );
    demo.check(
        "a tampered golden is caught",
        !report.ok() && logits.at == vec![3, 5],
    );
    Ok(())
}

/// Tokens decoded per model in the M2R2 section.
const M2R2_TOKENS: usize = 32;

/// Greedy, early exit and self-speculation side by side on the built-in models with their built-in
/// M2R2 weights, with the lossless properties checked: speculative tokens equal greedy tokens, and
/// the `exact` early-exit cache equals the base model's.
fn m2r2_modes(demo: &mut Demo) -> Result<()> {
    println!(
        "  {M2R2_TOKENS} tokens after {PROMPT:?}; built-in M2R2 weights; early exit: arla gate, \
         exact KV; speculative: draft gate 1"
    );
    println!(
        "  {:<9} {:<22} {:>9} {:>10} {:>8} {:>9} {:>10} {:>9}",
        "model", "mode", "= greedy", "layers/tok", "emit at", "accepted", "FLOPs/tok", "tokens/s"
    );
    println!(
        "  (layers/tok: slow layers computed per decoded token, deferred exact layers and \
         rejected drafts included; emit at: mean layer a decoded token was emitted after)"
    );
    for name in reference::io::builtin::BUILTIN_NAMES {
        let loaded = common::load(name)?;
        let weights = M2r2Weights::builtin_for(name, &loaded.model.config)?;
        let prompt = loaded.tokenizer()?.encode(PROMPT, true)?;
        let threshold = weights.config.arla.threshold;
        let settings = |mode, draft_length| M2r2Settings {
            mode,
            source: "builtin".into(),
            gates: weights.config.gates.clone(),
            gate: GateKind::Arla,
            threshold,
            gate_thresholds: None,
            kv_policy: KvPolicy::Exact,
            draft_gate: 1,
            draft_length,
            draft_head_tokens: None,
        };
        let request = DecodeRequest {
            prompt: &prompt,
            max_new_tokens: M2R2_TOKENS,
            stop_tokens: vec![],
            sampling: None,
        };
        let dynamic = DraftLength::Dynamic {
            max: 4,
            gate: GateKind::Arla,
            threshold,
        };
        let runs = [
            ("greedy", settings(Mode::Greedy, DraftLength::Fixed(4))),
            (
                "early-exit",
                settings(Mode::EarlyExit, DraftLength::Fixed(4)),
            ),
            (
                "speculative, 4 drafts",
                settings(Mode::Speculative, DraftLength::Fixed(4)),
            ),
            ("speculative, dynamic", settings(Mode::Speculative, dynamic)),
        ];
        let mut done: Vec<(&str, ModeRun)> = Vec::new();
        for (label, settings) in runs {
            let run = run_mode(
                &loaded.model,
                &weights,
                &settings,
                &request,
                false,
                &mut |_| {},
            )?;
            done.push((label, run));
        }
        let greedy = done[0].1.tokens.clone();
        for (label, run) in &done {
            let accepted = match &run.details {
                ModeDetails::Speculative {
                    mean_accepted_tokens,
                    ..
                } => format!("{mean_accepted_tokens:.2}"),
                _ => "-".into(),
            };
            let decoded = &run.steps[1.min(run.steps.len())..];
            let emit_at = decoded.iter().map(|s| s.layers).sum::<usize>() as f64
                / decoded.len().max(1) as f64;
            println!(
                "  {name:<9} {label:<22} {:>9} {:>10.2} {:>8.2} {:>9} {:>10} {:>9.0}",
                if run.tokens == greedy { "yes" } else { "no" },
                run.layers_per_token,
                emit_at,
                accepted,
                common::count(run.work.flops() as f64 / run.decoded().max(1) as f64),
                run.tokens_per_second()
            );
        }
        for (label, run) in &done[2..] {
            demo.check(
                format!("{name}: {label}: tokens == greedy tokens (lossless)"),
                run.tokens == greedy,
            );
        }

        // exact early exit leaves the base model's KV cache behind, bit for bit
        let options = EarlyExitOptions {
            max_new_tokens: M2R2_TOKENS,
            stop_tokens: vec![],
            gate: GateKind::Arla,
            threshold: threshold.into(),
            kv_policy: KvPolicy::Exact,
            sampling: None,
        };
        let out = early_exit_generate(M2r2::new(&loaded.model, &weights), &prompt, &options)?;
        let fed: Vec<u32> = prompt
            .iter()
            .chain(&out.tokens[..out.tokens.len() - 1])
            .copied()
            .collect();
        let mut base = loaded.model.new_cache(fed.len())?;
        loaded.model.forward(&fed, &mut base)?;
        let exited = out.trace.iter().filter(|t| t.exit_gate.is_some()).count();
        demo.check(
            format!(
                "{name}: exact early exit ({exited}/{} tokens exited) leaves the base model's KV \
                 cache, bit for bit",
                out.tokens.len()
            ),
            out.cache.len() == fed.len() && out.cache.prefix_equals(&base, fed.len()),
        );
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

/// Ahead-of-time expert loading (`m2r2 moe-sim`, docs/MOE_AOT.md) on the demo's prompt, for MoE
/// models; dense models say where to see it.
fn moe_prefetch(demo: &mut Demo) -> Result<()> {
    let loaded = &demo.loaded;
    if loaded.model.config.moe.is_none() {
        println!(
            "  {} has no MoE layers: `m2r2 demo --model tiny-moe` shows this section \
             (or `m2r2 moe-sim --model tiny-moe --prompt ..`)",
            loaded.name
        );
        return Ok(());
    }
    let steps = NEW_TOKENS - 1;
    let weights = M2r2Weights::builtin_for(&loaded.name, &loaded.model.config)?;
    let decoded = collect_trace(M2r2::new(&loaded.model, &weights), &demo.prompt, steps)?;
    let n = decoded.tokens.len().min(demo.greedy.len());
    demo.check(
        format!(
            "tracing the experts with the fast stream leaves the greedy tokens unchanged ({n})"
        ),
        decoded.tokens[..n] == demo.greedy[..n],
    );
    /// `moe-sim`'s flags with their defaults.
    #[derive(clap::Parser)]
    struct MoeSimFlags {
        #[command(flatten)]
        args: MoeSimArgs,
    }
    let ids: Vec<String> = demo.prompt.iter().map(|t| t.to_string()).collect();
    let steps = steps.to_string();
    let flags = <MoeSimFlags as clap::Parser>::try_parse_from([
        "moe-sim",
        "--model",
        &loaded.name,
        "--tokens",
        &ids.join(","),
        "--steps",
        &steps,
    ])?;
    moe_report::run_loaded(&flags.args, loaded)
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
