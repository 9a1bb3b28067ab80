//! The simulator against hand-computed rounds, and against the speculative loop itself.

use super::*;
use crate::base::generate::{GenerateOptions, generate};
use crate::base::model::Model;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use crate::io::builtin;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;

/// A depth-1 trace (exact without a bridge).
fn points(agrees: &[bool], confidence: &[f32]) -> Trace {
    agrees
        .iter()
        .zip(confidence)
        .map(|(&agrees, &confidence)| {
            vec![DraftPoint {
                agrees,
                rank: usize::from(!agrees),
                confidence,
                entropy: 0.0,
                arla: None,
                top: [u32::MAX; TOP_CANDIDATES],
            }]
        })
        .collect()
}

#[test]
fn hand_computed_rounds() {
    let (t, f) = (true, false);
    let p = points(&[t, t, f, t, f, f, t], &[0.9, 0.9, 0.2, 0.6, 0.6, 0.1, 0.9]);
    // k = 2: rounds at 0 (TT: 2 accepted, 3 emitted), 3 (TF: 1, 2), 5 (F: 0, 1), 6 (T, then the
    // end: 1 accepted, 1 emitted)
    let fixed = simulate(&p, Policy::Fixed(2)).unwrap();
    assert_eq!(fixed.accepted, [2, 1, 0, 1]);
    assert_eq!(fixed.proposals, [2, 2, 2, 2]);
    assert_eq!((fixed.rounds, fixed.emitted), (4, 7));
    assert_eq!((fixed.propose_steps, fixed.feed_steps), (8, 4));
    assert_eq!(fixed.verifies, [0, 0, 0, 4]);
    // dynamic, confidence >= 0.5, at most 3: at 0 scores .9 .9 .2 -> 2 proposals (3 steps); at 3
    // .6 .6 .1 -> 2 (3 steps), 1 accepted; at 5 .1 -> none (1 step); at 6 .9 then the end (2 steps)
    let policy = Policy::Dynamic {
        gate: GateKind::Confidence,
        threshold: 0.5,
        max: 3,
    };
    let dynamic = simulate(&p, policy).unwrap();
    assert_eq!(dynamic.accepted, [2, 1, 0, 1]);
    assert_eq!(dynamic.proposals, [3, 3, 1, 2]);
    assert_eq!((dynamic.propose_steps, dynamic.feed_steps), (9, 0));
    assert_eq!(dynamic.verifies, [0, 1, 1, 2, 0]);
    // at most 1: at 0 (.9: propose, feed; 1 accepted), 2 (.2: none), 3 (.6: 1 accepted), 5 (.1:
    // none), 6 (.9, then the end)
    let one = simulate(
        &p,
        Policy::Dynamic {
            gate: GateKind::Confidence,
            threshold: 0.5,
            max: 1,
        },
    )
    .unwrap();
    assert_eq!(one.accepted, [1, 0, 1, 0, 1]);
    assert_eq!((one.propose_steps, one.feed_steps), (5, 3));

    // costs: greedy 10 ms; propose 3, feed 1, verify 1/2/3 rows = 8/9/11 ms
    let costs = StepCosts {
        greedy: 10.0,
        propose: 3.0,
        feed: 1.0,
        verify: vec![8.0, 9.0, 11.0],
        tree: None,
    };
    let ms = 8.0 * 3.0 + 4.0 * 1.0 + 4.0 * 11.0;
    assert_eq!(fixed.milliseconds(&costs), Some(ms));
    assert_eq!(fixed.speedup(&costs), Some(70.0 / ms));
    assert_eq!(fixed.tokens_per_round(), 7.0 / 4.0);
    assert_eq!(dynamic.proposals_per_round(), 9.0 / 4.0);
    let short = StepCosts {
        verify: vec![8.0, 9.0],
        ..costs
    };
    assert_eq!(fixed.milliseconds(&short), None);
    let mut sum = fixed.clone();
    sum.add(&dynamic);
    assert_eq!((sum.rounds, sum.emitted, sum.propose_steps), (8, 14, 17));
    assert_eq!(sum.verifies, [0, 1, 1, 6, 0]);

    assert!(simulate(&p, Policy::Fixed(0)).is_err());
    let err = simulate(
        &p,
        Policy::Dynamic {
            gate: GateKind::Arla,
            threshold: 0.5,
            max: 2,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("arla"), "{err}");
}

/// The simulation predicts the rounds `speculative_generate` really runs: the same accepted count
/// in every round (the last one aside: past the end of the trace the decoder still drafts), and
/// the same proposals where they do not depend on a wrong prefix. Depth-1 traces without a
/// bridge; with a bridge (both sites), traces as deep as the longest policy.
#[test]
fn predicts_the_speculative_loop() {
    let bridge =
        crate::m2r2::bridge::BridgeConfig::new(1, 4, crate::m2r2::bridge::BridgeSite::ALL.to_vec());
    for (name, bridged) in builtin::BUILTIN_NAMES
        .iter()
        .flat_map(|&n| [(n, false), (n, true)])
    {
        let model = builtin::builtin(name).unwrap();
        let mut weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        if bridged {
            weights = weights
                .with_bridge(&model.config, bridge.clone(), 11, 0.5)
                .unwrap();
        }
        let depth = if bridged { 4 } else { 1 };
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [5, 17, 3, 9];
        let response = greedy_response(&model, &prompt, 48);
        let capacity = prompt.len() + response.len() + 8;
        // (accepted drafts, rejected rounds): the comparison must see both
        let mut seen = (0, 0);
        for draft_gate in 1..=weights.config.num_gates() {
            let mut backend =
                ReferenceSpeculation::new(m2r2, draft_gate, Some(GateKind::Arla), capacity)
                    .unwrap();
            let trace = trace(&mut backend, &prompt, &response, depth).unwrap();
            assert_eq!(trace.len(), response.len() - 1);
            assert!(trace.iter().all(|r| r.len() <= depth));
            let mut confidences: Vec<f32> = trace.iter().map(|p| p[0].confidence).collect();
            confidences.sort_by(f32::total_cmp);
            let median = confidences[confidences.len() / 2];
            let mut policies: Vec<Policy> = (1..=4).map(Policy::Fixed).collect();
            policies.push(Policy::Dynamic {
                gate: GateKind::Confidence,
                threshold: median,
                max: 4,
            });
            policies.push(Policy::Dynamic {
                gate: GateKind::Arla,
                threshold: 0.5,
                max: 3,
            });
            for policy in policies {
                let (draft_length, gate) = match policy {
                    Policy::Fixed(k) => (DraftLength::Fixed(k), None),
                    Policy::Dynamic {
                        gate,
                        threshold,
                        max,
                    } => (
                        DraftLength::Dynamic {
                            max,
                            gate,
                            threshold,
                        },
                        Some(gate),
                    ),
                };
                let options = SpeculativeOptions {
                    max_new_tokens: response.len(),
                    stop_tokens: vec![],
                    draft_length,
                    sampling: None,
                };
                let mut backend =
                    ReferenceSpeculation::new(m2r2, draft_gate, gate, capacity).unwrap();
                let real = speculative_generate(&mut backend, &prompt, &options).unwrap();
                assert_eq!(real.tokens, response);
                let sim = simulate(&trace, policy).unwrap();
                let context = format!("{name} (bridge {bridged}), gate {draft_gate}, {policy:?}");
                assert_eq!(sim.rounds, real.rounds.len(), "{context}");
                assert_eq!(sim.emitted, response.len() - 1, "{context}");
                let last = real.rounds.len() - 1;
                for (r, (round, (&accepted, &proposals))) in real
                    .rounds
                    .iter()
                    .zip(sim.accepted.iter().zip(&sim.proposals))
                    .enumerate()
                    .take(last)
                {
                    assert_eq!(round.accepted, accepted, "{context}, round {r}");
                    seen.0 += accepted;
                    seen.1 += usize::from(accepted < round.drafted.len());
                    if round.accepted == round.drafted.len() {
                        assert_eq!(round.proposals, proposals, "{context}, round {r}");
                    }
                }
            }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "{name}: {seen:?}");
    }
}

#[test]
fn trace_refuses_a_response_that_is_not_greedy() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let mut backend = ReferenceSpeculation::new(M2r2::new(&model, &weights), 1, None, 32).unwrap();
    let mut response = greedy_response(&model, &[1, 2], 6);
    response[3] = (response[3] + 1) % model.config.vocab_size as u32;
    let err = trace(&mut backend, &[1, 2], &response, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("response token 3"), "{err}");
    assert!(trace(&mut backend, &[], &response, 1).is_err());
    assert!(trace(&mut backend, &[1, 2], &response, 0).is_err());
}

/// The model's greedy continuation of `prompt`, `n` tokens (no stop token).
pub(super) fn greedy_response(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let options = GenerateOptions {
        max_new_tokens: n,
        stop_tokens: vec![],
        sampling: None,
    };
    generate(model, prompt, &options, &mut |_, _| {})
        .unwrap()
        .tokens
}
