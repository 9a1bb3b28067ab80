//! Pricing the chain and tree policies (`lookup.rs` prices them again beside a prompt-lookup
//! branch): each policy is replayed on a gate's traces (`draft_sim::simulate`, `simulate_tree`,
//! `simulate_dynamic_tree`) and its predicted speed-up computed from each engine's step costs.

use super::measure::{EngineCosts, GateTrace};
use super::{Args, Family, PolicyResult};
use anyhow::Result;
use reference::base::tree::TokenTree;
use reference::decode::draft_sim::tree::shape_text;
use reference::decode::draft_sim::{
    Policy, Simulated, simulate, simulate_dynamic_tree, simulate_tree,
};
use reference::m2r2::config::DynamicDraftConfig;
use reference::m2r2::exit_gate::GateKind;

/// The chain policies of gate trace `t` priced on the reference's costs and ONNX Runtime's
/// (`ort`, when it was timed at this gate); dynamic drafting by ARLA only when there is ARLA.
pub(super) fn chain_results(
    t: &GateTrace,
    (reference, ort): (&EngineCosts, Option<&EngineCosts>),
    policies: &[Policy],
    has_arla: bool,
) -> Result<Vec<PolicyResult>> {
    let mut results = Vec::new();
    for &policy in policies {
        if let Policy::Dynamic {
            gate: GateKind::Arla,
            ..
        } = policy
            && !has_arla
        {
            continue;
        }
        let mut sim = Simulated::default();
        for points in &t.samples {
            sim.add(&simulate(points, policy)?);
        }
        let speedup = |c: &EngineCosts| c.for_policy(policy).and_then(|c| sim.speedup(&c));
        let (draft_len, dynamic_draft) = match policy {
            Policy::Fixed(k) => (k, None),
            Policy::Dynamic {
                gate,
                threshold,
                max,
            } => (max, Some(DynamicDraftConfig { gate, threshold })),
        };
        results.push(PolicyResult {
            draft_gate: t.gate,
            family: Family::Chain,
            policy: describe(policy),
            draft_len,
            dynamic_draft,
            draft_tree: None,
            tree_nodes: None,
            prompt_lookup: None,
            tokens_per_round: sim.tokens_per_round(),
            proposals_per_round: sim.proposals_per_round(),
            speedup_reference: speedup(reference),
            speedup_onnx: ort.and_then(speedup),
        });
    }
    Ok(results)
}

/// The tree shapes of gate trace `t`, whole and grown per branch by each of `growths`, priced as
/// [`chain_results`] prices the chains.
pub(super) fn tree_results(
    t: &GateTrace,
    (reference, ort): (&EngineCosts, Option<&EngineCosts>),
    shapes: &[Vec<usize>],
    growths: &[Option<(GateKind, f32)>],
) -> Result<Vec<PolicyResult>> {
    let mut results = Vec::new();
    for widths in shapes {
        for &grown in growths {
            let mut sim = Simulated::default();
            for points in &t.samples {
                sim.add(&match grown {
                    None => simulate_tree(points, widths)?,
                    Some(g) => simulate_dynamic_tree(points, widths, g)?,
                });
            }
            let shape = shape_text(widths);
            results.push(PolicyResult {
                draft_gate: t.gate,
                family: Family::Tree,
                policy: match grown {
                    None => format!("tree {shape}"),
                    Some((gate, threshold)) => {
                        format!("tree {shape}, dynamic {gate} >= {threshold}")
                    }
                },
                draft_len: widths.len(),
                dynamic_draft: grown
                    .map(|(gate, threshold)| DynamicDraftConfig { gate, threshold }),
                draft_tree: Some(widths.clone()),
                tree_nodes: Some(TokenTree::from_widths(widths)?.nodes()),
                prompt_lookup: None,
                tokens_per_round: sim.tokens_per_round(),
                proposals_per_round: sim.proposals_per_round(),
                speedup_reference: sim.speedup(&reference.costs),
                speedup_onnx: ort.and_then(|c| sim.speedup(&c.costs)),
            });
        }
    }
    Ok(results)
}

/// How a tree grows: whole every round, then per branch by each gate and threshold (ARLA's score
/// needs fast rows the timed tree levels do not run: not priced).
pub(super) fn growths(args: &Args) -> Vec<Option<(GateKind, f32)>> {
    let mut growths = vec![None];
    for gate in [GateKind::Confidence, GateKind::Entropy] {
        growths.extend(args.thresholds.iter().map(|&t| Some((gate, t))));
    }
    growths
}

/// Fixed drafting of 1..=max tokens, and dynamic drafting with each gate kind, threshold and
/// maximum length.
pub(super) fn policies(args: &Args) -> Vec<Policy> {
    let mut all: Vec<Policy> = (1..=args.max_draft).map(Policy::Fixed).collect();
    for gate in GateKind::ALL {
        for &threshold in &args.thresholds {
            for max in 1..=args.max_draft {
                all.push(Policy::Dynamic {
                    gate,
                    threshold,
                    max,
                });
            }
        }
    }
    all
}

pub(super) fn describe(policy: Policy) -> String {
    match policy {
        Policy::Fixed(k) => format!("fixed {k}"),
        Policy::Dynamic {
            gate,
            threshold,
            max,
        } => format!("dynamic {gate} >= {threshold}, at most {max}"),
    }
}
