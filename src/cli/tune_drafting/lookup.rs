//! Pricing prompt-lookup branches (`--prompt-lookup`): every chain and tree policy again with a
//! branch beside it, replayed on the traces (`draft_sim::simulate_guesses`: the branch's accepted
//! length is exact, the context being known) and priced with the tree loop's step costs. A chain
//! beside a branch runs on the tree loop as the tree `1,1,...` (what `generate` drafts with the
//! config's `prompt_lookup` and no tree), grown per branch when it is dynamic.

use super::{EngineCosts, Family, GateTrace, PolicyResult, describe};
use anyhow::Result;
use reference::base::tree::TokenTree;
use reference::decode::draft_sim::tree::shape_text;
use reference::decode::draft_sim::{Policy, Simulated, lookup_guesses, simulate_guesses};
use reference::decode::prompt_lookup::LookupConfig;
use reference::m2r2::config::DynamicDraftConfig;
use reference::m2r2::exit_gate::GateKind;

/// One sample's greedy response and the guess of the longest branch at each traced position (a
/// shorter branch guesses a prefix of it).
pub(super) struct SampleGuesses {
    response: Vec<u32>,
    guesses: Vec<Vec<u32>>,
}

/// The guesses of branches of up to `longest` tokens on every sample of `data`.
pub(super) fn sample_guesses(
    data: &[train::data::DistillSample],
    longest: usize,
) -> Vec<SampleGuesses> {
    let lookup = LookupConfig::new(longest);
    data.iter()
        .map(|d| {
            let (prompt, response) = d.tokens.split_at(d.prompt_len);
            SampleGuesses {
                guesses: lookup_guesses(prompt, response, lookup),
                response: response.to_vec(),
            }
        })
        .collect()
}

/// What is priced beside each branch: the chain policies, the tree shapes and how a tree grows
/// (`None`: whole).
pub(super) struct Candidates<'a> {
    pub chains: &'a [Policy],
    pub shapes: &'a [Vec<usize>],
    pub growths: &'a [Option<(GateKind, f32)>],
}

/// The policies of `candidates` at `t`'s draft gate with a branch of each of `branches` tokens,
/// priced on `reference` and, where given, on `ort`. ARLA-grown chains are skipped: the tree
/// loop's timed levels do not run ARLA's fast rows (as for trees).
///
/// # Errors
/// The simulator's (a shape it refuses, a trace without the gate's scores).
pub(super) fn lookup_results(
    t: &GateTrace,
    samples: &[SampleGuesses],
    branches: &[usize],
    candidates: &Candidates<'_>,
    (reference, ort): (&EngineCosts, Option<&EngineCosts>),
) -> Result<Vec<PolicyResult>> {
    let mut results = Vec::new();
    for &branch in branches {
        let price = |widths: &[usize], grown: Option<(GateKind, f32)>| -> Result<Simulated> {
            let mut sim = Simulated::default();
            for (points, s) in t.samples.iter().zip(samples) {
                let replayed =
                    simulate_guesses(points, (&s.response, &s.guesses), widths, grown, branch)?;
                sim.add(&replayed);
            }
            Ok(sim)
        };
        let result = |sim: &Simulated| PolicyResult {
            draft_gate: t.gate,
            family: Family::Chain,
            policy: String::new(),
            draft_len: 0,
            dynamic_draft: None,
            draft_tree: None,
            tree_nodes: None,
            prompt_lookup: Some(branch),
            tokens_per_round: sim.tokens_per_round(),
            proposals_per_round: sim.proposals_per_round(),
            speedup_reference: sim.speedup(&reference.costs),
            speedup_onnx: ort.and_then(|c| sim.speedup(&c.costs)),
        };
        for &policy in candidates.chains {
            let (max, grown) = match policy {
                Policy::Fixed(k) => (k, None),
                Policy::Dynamic {
                    gate: GateKind::Arla,
                    ..
                } => continue,
                Policy::Dynamic {
                    gate,
                    threshold,
                    max,
                } => (max, Some((gate, threshold))),
            };
            let sim = price(&vec![1; max], grown)?;
            results.push(PolicyResult {
                policy: format!("{}, lookup {branch}", describe(policy)),
                draft_len: max,
                dynamic_draft: grown
                    .map(|(gate, threshold)| DynamicDraftConfig { gate, threshold }),
                ..result(&sim)
            });
        }
        for widths in candidates.shapes {
            for &grown in candidates.growths {
                let sim = price(widths, grown)?;
                let shape = shape_text(widths);
                results.push(PolicyResult {
                    family: Family::Tree,
                    policy: match grown {
                        None => format!("tree {shape}, lookup {branch}"),
                        Some((gate, threshold)) => {
                            format!("tree {shape}, dynamic {gate} >= {threshold}, lookup {branch}")
                        }
                    },
                    draft_len: widths.len(),
                    dynamic_draft: grown
                        .map(|(gate, threshold)| DynamicDraftConfig { gate, threshold }),
                    draft_tree: Some(widths.clone()),
                    tree_nodes: Some(TokenTree::from_widths(widths)?.nodes()),
                    ..result(&sim)
                });
            }
        }
    }
    Ok(results)
}
