//! Tests of speculative sampling over a token tree (`decode/tree_sampling.rs`).

use super::*;
use crate::base::config::ModelConfig;
use crate::base::generate::greedy;
use crate::base::model::Model;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_speculation::{
    TreeRound, TreeSpeculativeOutput, tree_speculate_dynamic, tree_speculate_with,
    tree_speculative_generate,
};
use crate::io::builtin::{self, random_model};
use crate::m2r2::bridge::BridgeSite;
use crate::m2r2::bridge_config::BridgeConfig;
use crate::m2r2::config::M2r2Config;
use crate::m2r2::draft_head::DraftHead;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use approx::assert_abs_diff_eq;
use rand::RngCore;

/// A random stream that returns the given uniforms (multiples of 2^-24 come back exactly).
struct Scripted(std::collections::VecDeque<f32>);

impl Scripted {
    fn new(uniforms: &[f32]) -> Self {
        Scripted(uniforms.iter().copied().collect())
    }
}

impl RngCore for Scripted {
    fn next_u32(&mut self) -> u32 {
        let u = self.0.pop_front().expect("a scripted uniform");
        // rand draws an f32 from the top 24 bits of a u32
        ((u * (1u32 << 24) as f32) as u32) << 8
    }
    fn next_u64(&mut self) -> u64 {
        u64::from(self.next_u32())
    }
    fn fill_bytes(&mut self, _: &mut [u8]) {
        unimplemented!("only uniforms are scripted")
    }
}

fn node(p: &[f32], q: &[f32], candidates: &[u32], uniforms: &[f32]) -> NodeChoice {
    verify_node(p.to_vec(), q, candidates, &mut Scripted::new(uniforms))
}

#[test]
fn residuals_hand_computed() {
    let r = residual(vec![0.4, 0.4, 0.2], &[0.1, 0.3, 0.6]);
    assert_abs_diff_eq!(
        r.as_slice(),
        [0.75f32, 0.25, 0.0].as_slice(),
        epsilon = 1e-6
    );
    // nothing left: p itself
    let r = residual(vec![0.5, 0.5], &[0.5, 0.5]);
    assert_eq!(r, [0.5, 0.5]);
}

/// One node by hand, uniforms scripted. p = [0.4, 0.4, 0.2], q = [0.1, 0.3, 0.6]:
/// x = 2 is accepted with probability p/q = 1/3; rejected, r_1 = norm([0.3, 0.1, 0]) =
/// [0.75, 0.25, 0]; then x = 1 with r_1/q = 0.25/0.3 = 0.833; rejected, r_2 = norm([0.65, 0,
/// 0]) = [1, 0, 0].
#[test]
fn nodes_hand_computed() {
    let (p, q) = ([0.4f32, 0.4, 0.2], [0.1f32, 0.3, 0.6]);
    assert_eq!(node(&p, &q, &[2, 1], &[0.25]), NodeChoice::Accept(0));
    assert_eq!(node(&p, &q, &[2, 1], &[0.5, 0.75]), NodeChoice::Accept(1));
    assert_eq!(
        node(&p, &q, &[2, 1], &[0.5, 0.875, 0.5]),
        NodeChoice::Sample(0)
    );
    // one candidate rejected: the sample comes from r_1 = [0.75, 0.25, 0]
    assert_eq!(node(&p, &q, &[2], &[0.5, 0.5]), NodeChoice::Sample(0));
    assert_eq!(node(&p, &q, &[2], &[0.5, 0.875]), NodeChoice::Sample(1));
    // a duplicate of a rejected token is rejected whatever the uniform (r_1(2) = 0), and
    // the sample comes from r_2 = norm(max(0, r_1 - q)) = [1, 0, 0]
    assert_eq!(
        node(&p, &q, &[2, 2], &[0.5, 0.0, 0.875]),
        NodeChoice::Sample(0)
    );
    // p(x) >= q(x): always accepted (token 0: 0.4 / 0.1)
    assert_eq!(node(&p, &q, &[0], &[0.99]), NodeChoice::Accept(0));
    // a leaf samples p itself
    assert_eq!(node(&p, &[], &[], &[0.5]), NodeChoice::Sample(1));
    assert_eq!(node(&p, &[], &[], &[0.25]), NodeChoice::Sample(0));
}

/// Chi-square statistic of `counts` against the probabilities `p` (cells with p = 0 must
/// count nothing).
fn chi2(counts: &[usize], p: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &p)| {
            if p == 0.0 {
                assert_eq!(c, 0, "a token of probability 0 was emitted");
                return 0.0;
            }
            let expected = p * n as f64;
            (c as f64 - expected).powi(2) / expected
        })
        .sum()
}

/// How a node's candidates are drawn and judged in `node_output`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum NodeRun {
    /// i.i.d. from q, [`verify_node`]: the rule
    Rule,
    /// i.i.d. from q, the first candidate accepted without the p/q test
    NoTest,
    /// i.i.d. from q, no residual between siblings (each tried against p, the sample from p)
    NoResidual,
    /// without replacement from q (q renormalised after each draw), [`verify_node`]
    WithoutReplacement,
}

/// The tokens one node emits (the accepted candidate's, or the sample) over `n` trials.
fn node_output(p: &[f32], q: &[f32], k: usize, run: NodeRun, n: usize) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut counts = vec![0; p.len()];
    for _ in 0..n {
        let mut candidates = Vec::new();
        let mut left = q.to_vec();
        for _ in 0..k {
            let x = draw(&left, &mut rng);
            candidates.push(x as u32);
            if run == NodeRun::WithoutReplacement {
                left[x] = 0.0;
                let mass: f32 = left.iter().sum();
                left.iter_mut().for_each(|l| *l /= mass);
            }
        }
        let token = match run {
            NodeRun::NoTest => candidates[0],
            NodeRun::NoResidual => candidates
                .iter()
                .copied()
                .find(|&x| rng.random::<f32>() < (p[x as usize] / q[x as usize]).min(1.0))
                .unwrap_or_else(|| draw(p, &mut rng) as u32),
            NodeRun::Rule | NodeRun::WithoutReplacement => {
                match verify_node(p.to_vec(), q, &candidates, &mut rng) {
                    NodeChoice::Accept(j) => candidates[j],
                    NodeChoice::Sample(t) => t,
                }
            }
        };
        counts[token as usize] += 1;
    }
    counts
}

/// One node emits p: 1 to 4 candidates drawn i.i.d. from q, 40000 trials, a chi-square test
/// at significance 0.001 (df = 4, critical value 18.467); q puts mass on a token p gives
/// nothing and misses one p needs. The wrong rules fail it by far.
#[test]
fn one_node_emits_p() {
    let p = [0.05f32, 0.1, 0.2, 0.3, 0.35];
    let q = [0.4f32, 0.3, 0.0, 0.2, 0.1];
    let (p0, q0) = ([0.0f32, 0.2, 0.3, 0.5, 0.0], q);
    let trials = 40_000;
    let expect = |p: &[f32]| p.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    for (p, q) in [(p, q), (p0, q0)] {
        for k in 1..=4 {
            let x = chi2(&node_output(&p, &q, k, NodeRun::Rule, trials), &expect(&p));
            assert!(x < 18.467, "{k} candidates: chi-square {x:.1}");
        }
    }
    for run in [
        NodeRun::NoTest,
        NodeRun::NoResidual,
        NodeRun::WithoutReplacement,
    ] {
        let counts = node_output(&p, &q, 3, run, trials);
        let x: f64 = counts
            .iter()
            .zip(&p)
            .map(|(&c, &p)| {
                let e = f64::from(p) * trials as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        assert!(x > 200.0, "{run:?} passes: chi-square {x:.1}");
    }
}

/// The test problem: a 4-layer model over 6 tokens and random M2R2 weights (full head, or a
/// pruned one of tokens {0, 2, 5}: the others are reached only through residuals).
fn six_token_problem(pruned: bool) -> (Model, M2r2Weights) {
    let config = ModelConfig {
        vocab_size: 6,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        max_position_embeddings: 64,
        ..builtin::tiny_config()
    };
    let model = random_model(config.clone(), 11).unwrap();
    let mut weights = M2r2Weights::random(&config, M2r2Config::default_for(&config), 12).unwrap();
    if pruned {
        weights.draft_head = Some(DraftHead::new(vec![0, 2, 5], 6, "test").unwrap());
    }
    (model, weights)
}

/// The exact marginals of the first `k` generated tokens when sampling from `model` after
/// `prompt`, by enumerating every prefix.
fn exact_marginals(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    k: usize,
) -> Vec<Vec<f64>> {
    let vocab = model.config.vocab_size;
    let mut marginals = vec![vec![0.0f64; vocab]; k];
    let mut stack = vec![(prompt.to_vec(), 1.0f64)];
    while let Some((seq, weight)) = stack.pop() {
        let logits = model.teacher_forced_logits(&seq).unwrap();
        let p = sampling_distribution(logits.row(seq.len() - 1).as_slice().unwrap(), params);
        let j = seq.len() - prompt.len();
        for (t, &pt) in p.iter().enumerate() {
            marginals[j][t] += weight * f64::from(pt);
            if j + 1 < k && pt > 0.0 {
                let mut next = seq.clone();
                next.push(t as u32);
                stack.push((next, weight * f64::from(pt)));
            }
        }
    }
    marginals
}

const TEMPERATURE: f32 = 6.0;

fn params(seed: u64) -> SamplingParams {
    // the random model is very peaked: temperature 6 puts every cell above 5 expected counts
    SamplingParams {
        temperature: TEMPERATURE,
        top_k: None,
        top_p: None,
        seed,
    }
}

/// Decode 4 tokens after prompt [3] with `tree`, seeds 0..4000, under `rule`: the chi-square
/// statistics of tokens 1..=4 against the exact marginals, and the outputs.
fn tree_chi2(
    model: &Model,
    weights: &M2r2Weights,
    tree: &TokenTree,
    rule: NodeRule,
) -> (Vec<f64>, Vec<TreeSpeculativeOutput>) {
    let (prompt, k, samples) = ([3u32], 4, 4000);
    let want = exact_marginals(model, &prompt, &params(0), k);
    let mut counts = vec![vec![0usize; model.config.vocab_size]; k];
    let mut outs = Vec::new();
    for seed in 0..samples {
        let capacity = prompt.len() + k + tree.nodes();
        let mut backend =
            ReferenceTreeSpeculation::new(M2r2::new(model, weights), 1, capacity).unwrap();
        let sampling = TreeSampling::with_rule(params(seed), rule);
        let out = tree_speculate_with(&mut backend, tree, &prompt, k, &[], Some(sampling)).unwrap();
        for (j, &t) in out.tokens.iter().enumerate() {
            counts[j][t as usize] += 1;
        }
        outs.push(out);
    }
    let x = counts.iter().zip(&want).map(|(c, m)| chi2(c, m)).collect();
    (x, outs)
}

/// Speculative sampling on a tree draws from the base model's distribution: trees `3,2` and
/// `2,2,2`, the full and a pruned draft head, 4000 seeds; tokens 1 to 4 (the first from the
/// prompt, the others from the first rounds: accepted drafts, corrections, bonus tokens)
/// against the exact marginals by enumeration, a chi-square test at significance 0.001 each
/// (df = 5, critical value 20.515). The rounds must reject every child of the root, accept a
/// runner-up and accept whole paths, else the test is weak.
#[test]
fn tree_sampling_preserves_the_distribution() {
    for pruned in [false, true] {
        let (model, weights) = six_token_problem(pruned);
        for spec in ["3,2", "2,2,2"] {
            let tree = TokenTree::parse(spec).unwrap();
            let (x, outs) = tree_chi2(&model, &weights, &tree, verify_node);
            println!("pruned {pruned} tree {spec}: chi-square {x:.2?}");
            assert!(
                x.iter().all(|&x| x < 20.515),
                "pruned {pruned} tree {spec}: chi-square {x:.2?} above 20.515"
            );
            let rounds: Vec<&TreeRound> = outs.iter().flat_map(|o| &o.rounds).collect();
            let count = |f: &dyn Fn(&TreeRound) -> bool| rounds.iter().filter(|r| f(r)).count();
            let none = count(&|r| r.accepted == 0);
            let whole = count(&|r| r.accepted == tree.max_depth());
            let runner_ups = count(&|r| {
                let path = tree.path(r.node);
                path.windows(2).any(|w| tree.children(w[0]).start != w[1])
            });
            println!(
                "  {} rounds: {none} accepted nothing, {runner_ups} a runner-up, {whole} a \
                 whole path",
                rounds.len()
            );
            assert!(none > 100 && runner_ups > 100 && whole > 100, "weak test");
        }
    }
}

/// The same test fails for wrong rules: accepting the first child without the p/q test
/// (the drafts' distribution), and trying every sibling against p without the residual
/// between them (a multi-candidate bug the chain cannot have).
#[test]
fn wrong_tree_rules_fail_the_test() {
    fn no_test(p: Vec<f32>, _: &[f32], candidates: &[u32], rng: &mut ChaCha8Rng) -> NodeChoice {
        match candidates {
            [] => NodeChoice::Sample(draw(&p, rng) as u32),
            _ => NodeChoice::Accept(0),
        }
    }
    fn no_residual(p: Vec<f32>, q: &[f32], candidates: &[u32], rng: &mut ChaCha8Rng) -> NodeChoice {
        for (j, &x) in candidates.iter().enumerate() {
            let u: f32 = rng.random();
            if u < (p[x as usize] / q[x as usize]).min(1.0) {
                return NodeChoice::Accept(j);
            }
        }
        NodeChoice::Sample(draw(&p, rng) as u32)
    }
    let (model, weights) = six_token_problem(false);
    let tree = TokenTree::parse("3,2").unwrap();
    for (name, rule) in [
        ("no test", no_test as NodeRule),
        ("no residual", no_residual),
    ] {
        let (x, _) = tree_chi2(&model, &weights, &tree, rule);
        println!("{name}: chi-square {x:.2?}");
        assert!(
            x.iter().any(|&x| x > 100.0),
            "{name}: chi-square {x:.2?} passes"
        );
    }
}

/// Dynamic drafting per branch keeps the distribution: tree `3,2` grown only below nodes
/// whose confidence is at least the median of the scores a first run saw (so about half the
/// nodes get no children), 4000 seeds, tokens 1 to 4 against the exact marginals (the
/// chi-square test above). The tree depends on the draft alone, so SpecInfer's rule stays
/// exact; the rounds must include trees pruned at the root, pruned partly and grown whole.
#[test]
fn dynamic_tree_sampling_preserves_the_distribution() {
    let (model, weights) = six_token_problem(false);
    let shape = TokenTree::parse("3,2").unwrap();
    let (prompt, k) = ([3u32], 4);
    let run = |seed: u64, threshold: f32| {
        let capacity = prompt.len() + k + shape.nodes();
        let mut backend = ReferenceTreeSpeculation::new(M2r2::new(&model, &weights), 1, capacity)
            .unwrap()
            .with_gate(Some(GateKind::Confidence));
        let sampling = Some(params(seed));
        tree_speculate_dynamic(&mut backend, &shape, threshold, &prompt, k, &[], sampling).unwrap()
    };
    let mut seen: Vec<f32> = (0..50)
        .flat_map(|seed| run(seed, -1.0).rounds)
        .flat_map(|r| r.scores)
        .collect();
    seen.sort_by(f32::total_cmp);
    let threshold = seen[seen.len() / 2];
    let want = exact_marginals(&model, &prompt, &params(0), k);
    let mut counts = vec![vec![0usize; model.config.vocab_size]; k];
    let (mut root_only, mut partial, mut whole) = (0, 0, 0);
    for seed in 0..4000 {
        let out = run(seed, threshold);
        for (j, &t) in out.tokens.iter().enumerate() {
            counts[j][t as usize] += 1;
        }
        for r in &out.rounds {
            match r.tree.nodes() {
                1 => root_only += 1,
                n if n == shape.nodes() => whole += 1,
                _ => partial += 1,
            }
        }
    }
    let x: Vec<f64> = counts.iter().zip(&want).map(|(c, m)| chi2(c, m)).collect();
    println!(
        "threshold {threshold}: chi-square {x:.2?}; rounds: {root_only} root only, {partial} \
         partly grown, {whole} whole"
    );
    assert!(
        x.iter().all(|&x| x < 20.515),
        "chi-square {x:.2?} above 20.515"
    );
    assert!(root_only > 100 && partial > 100 && whole > 100, "weak test");
}

/// A prompt-lookup branch's tokens are tested as deterministic proposals: accepted with
/// probability `r(g)`, and rejected they leave `r` without `g` for the siblings after them and
/// the final sample (hand-computed, with scripted uniforms).
#[test]
fn fixed_candidates_hand_computed() {
    let p = [0.5, 0.25, 0.25, 0.0];
    let q = [0.25, 0.25, 0.5, 0.0];
    let run = |candidates: &[u32], fixed: &[bool], uniforms: &[f32]| {
        let mut rng = Scripted::new(uniforms);
        verify_node_with_fixed(p.to_vec(), &q, (candidates, fixed), &mut rng)
    };
    // the branch's token 0 first: accepted when u < p(0) = 0.5
    assert_eq!(run(&[0], &[true], &[0.4375]), NodeChoice::Accept(0));
    // rejected: r = p without 0 = (0, 0.5, 0.5, 0); the final sample's uniform 0.25 -> 1
    assert_eq!(run(&[0], &[true], &[0.5, 0.25]), NodeChoice::Sample(1));
    // then a drafted 2 tested against r: r(2) / q(2) = 0.5 / 0.5 -> accepted for any u < 1
    assert_eq!(
        run(&[0, 2], &[true, false], &[0.5, 0.875]),
        NodeChoice::Accept(1)
    );
    // a drafted 0 first (r(0) / q(0) = 2: accepted), as verify_node
    assert_eq!(
        run(&[0, 1], &[false, true], &[0.875]),
        NodeChoice::Accept(0)
    );
    // a fixed 3 that p gives nothing: rejected even at u = 0, and r stays p (0.625 -> 1)
    assert_eq!(run(&[3], &[true], &[0.0, 0.625]), NodeChoice::Sample(1));
}

/// Sampling with a prompt-lookup branch keeps the distribution: 6 tokens, prompt `3 1 3`, a
/// branch of up to 2 tokens looked up by suffixes of 1 or 2 (so most rounds find one, right
/// or wrong), beside the chain `1` and the tree `2,1`, whole and grown at the median score;
/// 4000 seeds, tokens 1 to 4 against the exact marginals (the chi-square test above). Rounds
/// must accept the branch and reject it, else the test is weak.
#[test]
fn sampling_with_a_lookup_branch_preserves_the_distribution() {
    use crate::decode::prompt_lookup::LookupConfig;
    use crate::decode::tree_speculation::{TreeDrafting, tree_speculate_drafting};
    let (model, weights) = six_token_problem(false);
    let (prompt, k) = ([3u32, 1, 3], 4);
    let lookup = LookupConfig {
        max_tokens: 2,
        max_ngram: 2,
        min_ngram: 1,
    };
    let want = exact_marginals(&model, &prompt, &params(0), k);
    for (spec, grown) in [("1", false), ("2,1", false), ("2,1", true)] {
        let shape = TokenTree::parse(spec).unwrap();
        let run = |seed: u64, threshold: Option<f32>| {
            let capacity = prompt.len() + k + shape.nodes() + lookup.max_tokens;
            let mut backend =
                ReferenceTreeSpeculation::new(M2r2::new(&model, &weights), 1, capacity)
                    .unwrap()
                    .with_gate(Some(GateKind::Confidence));
            let drafting = TreeDrafting {
                threshold,
                lookup: Some(lookup),
            };
            let request = (&prompt[..], k, &[][..]);
            tree_speculate_drafting(&mut backend, &shape, drafting, request, Some(params(seed)))
                .unwrap()
        };
        let threshold = grown.then(|| {
            let mut seen: Vec<f32> = (0..50)
                .flat_map(|seed| run(seed, Some(-1.0)).rounds)
                .flat_map(|r| r.scores)
                .collect();
            seen.sort_by(f32::total_cmp);
            seen[seen.len() / 2]
        });
        let mut counts = vec![vec![0usize; model.config.vocab_size]; k];
        let (mut taken, mut refused) = (0, 0);
        for seed in 0..4000 {
            let out = run(seed, threshold);
            for (j, &t) in out.tokens.iter().enumerate() {
                counts[j][t as usize] += 1;
            }
            for r in out.rounds.iter().filter(|r| !r.lookup.is_empty()) {
                match r.lookup_accepted() > 0 {
                    true => taken += 1,
                    false => refused += 1,
                }
            }
        }
        let x: Vec<f64> = counts.iter().zip(&want).map(|(c, m)| chi2(c, m)).collect();
        println!(
            "tree {spec} grown {grown}: chi-square {x:.2?}; branch accepted in {taken} \
             rounds, rejected in {refused}"
        );
        assert!(
            x.iter().all(|&x| x < 20.515),
            "tree {spec} grown {grown}: chi-square {x:.2?} above 20.515"
        );
        assert!(taken > 100 && refused > 100, "weak test");
    }
}

/// A chain tree with sampling is the chain loop with the same seed, bit for bit: the same
/// tokens and rounds (the draws, the uniforms and the residuals in the same order), on the
/// built-in models, every draft gate, lengths 1 to 3, the full head and a bridge.
#[test]
fn a_sampled_chain_is_the_sampled_chain_loop() {
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        let full = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let bridge = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
        let bridged = full
            .clone()
            .with_bridge(&model.config, bridge, 3, 0.5)
            .unwrap();
        for weights in [&full, &bridged] {
            let m2r2 = M2r2::new(&model, weights);
            for gate in 1..=m2r2.num_gates() {
                for m in 1..=3 {
                    for seed in 0..3 {
                        let what = format!("{name} gate {gate} length {m} seed {seed}");
                        let sampling = SamplingParams {
                            temperature: 1.5,
                            top_k: Some(40),
                            top_p: Some(0.95),
                            seed,
                        };
                        let prompt = [3u32, 1, 4, 1];
                        let options = SpeculativeOptions {
                            max_new_tokens: 12,
                            stop_tokens: vec![],
                            draft_length: DraftLength::Fixed(m),
                            sampling: Some(sampling.clone()),
                        };
                        let mut backend = ReferenceSpeculation::new(m2r2, gate, None, 64).unwrap();
                        let chain = speculative_generate(&mut backend, &prompt, &options).unwrap();
                        let tree = TokenTree::chain(m).unwrap();
                        let (got, _) = tree_speculative_generate(
                            m2r2,
                            gate,
                            &tree,
                            &prompt,
                            12,
                            &[],
                            Some(sampling),
                        )
                        .unwrap();
                        assert_eq!(got.tokens, chain.tokens, "{what}");
                        let rounds: Vec<_> = got
                            .rounds
                            .iter()
                            .map(|t| (t.start, &t.tokens[1..], t.accepted, t.base_token))
                            .collect();
                        let want: Vec<_> = chain
                            .rounds
                            .iter()
                            .map(|c| (c.start, &c.drafted[..], c.accepted, c.base_token))
                            .collect();
                        assert_eq!(rounds, want, "{what}");
                    }
                }
            }
        }
    }
}

/// Top-k 1 makes p and q one-hot at their argmax: sampling on any tree is then greedy
/// decoding, whatever the seed and temperature (siblings are duplicates of the draft's top
/// token; a rejection's residual is the base model's top token).
#[test]
fn top_k_1_sampling_is_greedy() {
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [7u32, 2, 9, 4, 4, 1];
        let want = greedy(&model, &prompt, 24, &[]).unwrap();
        for spec in ["3,2,1", "2,2"] {
            let tree = TokenTree::parse(spec).unwrap();
            for (seed, temperature) in [(0, 0.5), (1, 1.0), (2, 3.0)] {
                let sampling = SamplingParams {
                    temperature,
                    top_k: Some(1),
                    top_p: None,
                    seed,
                };
                let (got, _) =
                    tree_speculative_generate(m2r2, 1, &tree, &prompt, 24, &[], Some(sampling))
                        .unwrap();
                assert_eq!(got.tokens, want, "{name} {spec} seed {seed}");
            }
        }
    }
}

#[test]
fn bad_params_are_refused() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let tree = TokenTree::parse("2,1").unwrap();
    let bad = SamplingParams {
        temperature: 0.0,
        top_k: None,
        top_p: None,
        seed: 0,
    };
    let err = tree_speculative_generate(
        M2r2::new(&model, &weights),
        1,
        &tree,
        &[1],
        4,
        &[],
        Some(bad),
    )
    .unwrap_err();
    assert!(err.to_string().contains("temperature must be > 0"), "{err}");
}
