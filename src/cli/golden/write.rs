//! `m2r2 golden write`: record a golden (or a suite, one per prompt) with the reference, stopping
//! at the model's end-of-turn tokens unless `--ignore-eos`, with the suite's pinned tolerance and
//! precision.

use super::{SUITE_SUFFIX, WriteArgs};
use crate::cli::args::m2r2::ModeArg;
use crate::cli::args::model::PromptArgs;
use crate::cli::args::tree::{
    TreeRequest, check_gate_flags_read, draft_tree_settings, lookup_chain, prompt_lookup,
    tree_widths,
};
use crate::cli::common;
use anyhow::{Context, Result, bail};
use reference::decode::early_exit::EarlyExitOptions;
use reference::decode::mode::{M2r2Settings, Mode};
use reference::decode::speculative::{DraftLength, SpeculativeOptions};
use reference::golden::{Golden, Pins, TreeRecipe};
use reference::io::load::LoadedModel;
use reference::m2r2::fast_stream::M2r2;
use serde_json::json;
use std::path::PathBuf;

/// The file name of a suite member: the prompt id with anything but `[A-Za-z0-9._-]` replaced.
fn suite_file(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}{SUITE_SUFFIX}")
}

pub(super) fn write(args: &WriteArgs) -> Result<()> {
    for (name, x) in [("--atol", &args.atol), ("--rtol", &args.rtol)] {
        if let Some(x) = x {
            x.checked(name)?;
        }
    }
    // `check` takes an M2R2 golden's tolerance as atol alone (its help says so): a pinned rtol
    // would make the golden one no check reads
    if args.rtol.is_some() && args.m2r2.mode != ModeArg::Greedy {
        bail!(
            "--rtol is for greedy goldens: an M2R2 golden (--mode {}) is checked with --atol \
             alone, so pin --atol",
            Mode::from(args.m2r2.mode).name()
        );
    }
    if args.steps == 0 {
        bail!("--steps 0 records nothing to check: give 1 or more");
    }
    // refused before the model loads: a tree outside speculative decoding, with a draft length;
    // a lookup branch outside it; any flag the mode would not read, and M2R2 weights a greedy
    // golden would not record (it pins the base model alone)
    if let (Some(dir), ModeArg::Greedy) = (&args.m2r2.m2r2, args.m2r2.mode) {
        bail!(
            "--m2r2 {dir} is for M2R2 goldens (--mode early-exit or speculative): a greedy golden \
             records the base model alone"
        );
    }
    args.m2r2.check_mode_flags()?;
    tree_widths(&tree_request(args))?;
    prompt_lookup(
        args.prompt_lookup.unwrap_or(0),
        args.m2r2.mode == ModeArg::Speculative,
    )?;
    let loaded = common::load(&args.model.model)?;
    // (output path, prompt arguments) of every golden to write
    let jobs: Vec<(PathBuf, PromptArgs)> = match &args.prompts {
        Some(file) => {
            let prompts = common::read_prompts(file)?;
            let mut seen = std::collections::HashSet::new();
            let mut jobs = Vec::new();
            for (line, id, text) in prompts {
                // `OUT/.golden.safetensors`, `OUT/...golden.safetensors`: hidden files
                if id.is_empty() || id.starts_with('.') {
                    bail!(
                        "{} line {line}: the prompt id {id:?} would name a hidden file: give an id \
                         that is not empty and does not start with a dot",
                        file.display()
                    );
                }
                let name = suite_file(&id);
                if !seen.insert(name.clone()) {
                    bail!(
                        "{}: two prompts map to the file name {name}",
                        file.display()
                    );
                }
                let prompt = PromptArgs {
                    prompt: Some(text),
                    chat: args.chat,
                    tokens: None,
                };
                jobs.push((args.out.join(name), prompt));
            }
            std::fs::create_dir_all(&args.out)
                .with_context(|| format!("cannot create {}", args.out.display()))?;
            jobs
        }
        None => {
            if args.prompt.is_none() && args.tokens.is_none() {
                bail!("give a prompt: --prompt TEXT, --tokens IDS or --prompts FILE.jsonl");
            }
            if args.chat && args.prompt.is_none() {
                bail!("--chat needs --prompt or --prompts");
            }
            let prompt = PromptArgs {
                prompt: args.prompt.clone(),
                chat: args.chat,
                tokens: args.tokens.clone(),
            };
            vec![(args.out.clone(), prompt)]
        }
    };
    let mut written = Vec::new();
    for (out, prompt) in &jobs {
        let golden = common::prompt_tokens(&loaded, prompt)
            .and_then(|tokens| record(args, &loaded, &tokens))
            .map_err(in_steps)
            .with_context(|| match &args.prompts {
                // a suite names the golden (its prompt's id) and what is already written
                Some(_) => format!(
                    "cannot record {} ({} of the suite's goldens written before it)",
                    out.display(),
                    written.len()
                ),
                None => format!("cannot record {}", out.display()),
            })?;
        common::create_parent(out)?;
        golden
            .write(out)
            .with_context(|| format!("cannot write golden {}", out.display()))?;
        if !args.json {
            println!(
                "wrote {}: {} {} steps of {} after {} prompt tokens ({}; logits [{}, {}], config {})",
                out.display(),
                golden.tokens.len(),
                golden.mode,
                golden.model,
                golden.prompt_tokens.len(),
                super::stop_line(&golden),
                golden.logits.nrows(),
                golden.logits.ncols(),
                golden.config_hash
            );
        }
        let (tree_grown, prompt_lookup) = super::tree_policy_json(&golden);
        written.push(json!({
            "file": out.display().to_string(),
            "model": golden.model,
            "config_hash": golden.config_hash,
            "mode": golden.mode,
            "draft_tree": golden.draft_tree(),
            "tree_grown": tree_grown,
            "prompt_lookup": prompt_lookup,
            "format_version": golden.format_version(),
            "prompt_tokens": golden.prompt_tokens,
            "tokens": golden.tokens,
            "stop_tokens": golden.stop_tokens,
            "max_steps": golden.max_steps,
            "logits_shape": golden.logits.shape(),
        }));
    }
    if args.json {
        match &args.prompts {
            Some(_) => common::print_json(&json!({ "files": written }))?,
            None => common::print_json(&written[0])?,
        }
    }
    Ok(())
}

/// The reference's context error, naming a golden's budget, `--steps`.
fn in_steps(error: anyhow::Error) -> anyhow::Error {
    common::name_budget_flag(error, "the golden", "--steps")
}

/// Record up to `args.steps` tokens in `args.m2r2.mode` (greedy), stopping at the model's
/// end-of-turn tokens unless `--ignore-eos`, with the pins of the command line.
fn record(args: &WriteArgs, loaded: &LoadedModel, prompt: &[u32]) -> Result<Golden> {
    let model = &loaded.model;
    let stops = if args.ignore_eos {
        vec![]
    } else {
        loaded.stop_tokens()
    };
    let mut golden = match Mode::from(args.m2r2.mode) {
        Mode::Greedy => {
            Golden::record_greedy_until(model, &loaded.name, prompt, args.steps, &stops)?
        }
        _ => record_m2r2(args, loaded, prompt, stops)?,
    };
    golden.pins = Pins {
        atol: args.atol.as_ref().map(|b| b.value),
        rtol: args.rtol.as_ref().map(|b| b.value),
        expect_dtype: args.expect_dtype.clone(),
    };
    Ok(golden)
}

fn record_m2r2(
    args: &WriteArgs,
    loaded: &LoadedModel,
    prompt: &[u32],
    stop_tokens: Vec<u32>,
) -> Result<Golden> {
    let weights = args.m2r2.weights(loaded)?;
    let settings = args.m2r2.settings(loaded, &weights)?;
    let m2r2 = M2r2::new(&loaded.model, &weights);
    let golden = match settings.mode {
        Mode::Greedy => unreachable!("recorded by the caller"),
        Mode::EarlyExit => {
            // Golden::record_early_exit refuses any KV policy but `exact`.
            let options = EarlyExitOptions {
                max_new_tokens: args.steps,
                stop_tokens,
                gate: settings.gate,
                threshold: settings.exit_threshold(),
                kv_policy: settings.kv_policy,
                sampling: None,
            };
            Golden::record_early_exit(m2r2, &loaded.name, prompt, args.steps, &options)?
        }
        Mode::Speculative if args.draft_tree.is_some() || args.prompt_lookup.unwrap_or(0) > 0 => {
            let recipe = tree_recipe(args, &settings)?;
            let mut drafted = settings.clone();
            draft_tree_settings(&mut drafted, &recipe.widths, recipe.grown);
            check_gate_flags_read(
                args.m2r2.gate.is_some(),
                args.m2r2.threshold.is_some(),
                &drafted,
            )?;
            Golden::record_tree_drafting(
                m2r2,
                &loaded.name,
                prompt,
                args.steps,
                &recipe,
                &stop_tokens,
            )?
        }
        Mode::Speculative => {
            check_gate_flags_read(
                args.m2r2.gate.is_some(),
                args.m2r2.threshold.is_some(),
                &settings,
            )?;
            if let Some(n) = weights.config.prompt_lookup.filter(|_| {
                args.prompt_lookup.is_none()
                    && args.m2r2.draft_len.is_none()
                    && !args.m2r2.dynamic_draft
            }) {
                eprintln!(
                    "note: this golden records the chain loop; `generate --mode speculative` \
                     also verifies the M2R2 config's prompt-lookup branch (up to {n} tokens): add \
                     --prompt-lookup {n} to record that"
                );
            }
            // The draft gate's score is recorded when it decides the draft length.
            let gate = matches!(settings.draft_length, DraftLength::Dynamic { .. })
                .then_some(settings.gate);
            let options = SpeculativeOptions {
                max_new_tokens: args.steps,
                stop_tokens,
                draft_length: settings.draft_length.clone(),
                sampling: None,
            };
            Golden::record_speculative(
                m2r2,
                &loaded.name,
                prompt,
                args.steps,
                settings.draft_gate,
                gate,
                &options,
            )?
        }
    };
    Ok(golden)
}

fn tree_request(args: &WriteArgs) -> TreeRequest<'_> {
    TreeRequest {
        spec: args.draft_tree.as_deref(),
        speculative: args.m2r2.mode == ModeArg::Speculative,
        draft_len: args.m2r2.draft_len,
    }
}

/// The token tree a speculative golden drafts, as `generate` would with the same flags: the
/// `--draft-tree` shape (grown per branch with `--dynamic-draft`), else the chain of the draft
/// length beside a `--prompt-lookup` branch (grown when the drafting is dynamic).
fn tree_recipe(args: &WriteArgs, settings: &M2r2Settings) -> Result<TreeRecipe> {
    let lookup = prompt_lookup(args.prompt_lookup.unwrap_or(0), true)?;
    let dynamic = |settings: &M2r2Settings| match settings.draft_length {
        DraftLength::Dynamic {
            gate, threshold, ..
        } => Some((gate, threshold)),
        DraftLength::Fixed(_) => None,
    };
    let (widths, grown) = match tree_widths(&tree_request(args))? {
        Some(widths) => (
            widths,
            dynamic(settings).filter(|_| args.m2r2.dynamic_draft),
        ),
        None => {
            let mut grown = None;
            let widths = lookup_chain(settings, &mut grown);
            (widths, grown)
        }
    };
    Ok(TreeRecipe {
        draft_gate: settings.draft_gate,
        widths,
        grown,
        lookup,
    })
}
