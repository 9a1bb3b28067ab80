//! A two-level memory for MoE experts (docs/MOE_AOT.md "The memory model"): experts live in host
//! memory (LBM) and run from a device cache (HBM) of fixed capacity; a copy engine moves them host
//! -> device while the layers compute. A pure, deterministic function of (expert trace, predictor,
//! parameters).
//!
//! # The model
//! - Time per decoded token: layers run one after the other. Layer `l` computes its pre-MoE part
//!   (attention, norms, router: `pre_l` seconds), then waits until every expert it uses is on the
//!   device (the wait is the *stall*), then runs the experts (`moe_l` seconds).
//! - Copy engine: one transfer at a time, `latency + expert_bytes / bandwidth` seconds each. It
//!   always serves the pending transfer whose layer comes soonest (then the oldest request), and a
//!   sooner one preempts a later one (transfers are chunked, modelled as fluid). Demand loads are
//!   issued when a layer finds an expert missing at the end of its pre-MoE part.
//! - Cache: `capacity` experts, one pool (`global`) or one pool per layer (`per-layer`). An expert
//!   enters it when a layer uses it; the victim is chosen by the eviction policy among the experts
//!   the layer does not use (`lru`: least recently used; `keep-predicted`: least recently used
//!   among those no outstanding prediction of this token names, else LRU). With per-layer pools
//!   `keep-predicted` is exactly `lru`: layer `l` evicts only layer `l`'s experts, when it runs,
//!   and by then this token's predictions for `l` are settled and the next token's not yet made
//!   (the CLI refuses the combination).
//! - Prefetch: a prediction issues a transfer for each predicted expert that is neither cached nor
//!   already requested. It lands in a prefetch buffer (reported as `peak_buffered_experts`, not
//!   counted in `capacity`) and enters the cache only when its layer uses it; an unused prefetch is
//!   dropped (cancelled if still copying) when its layer runs. A predicted expert that is cached but
//!   evicted before its layer runs is requested again at the eviction.
//!
//! Consequences, checked by the tests: with `lru` the cache holds exactly what plain LRU over the
//! access stream holds, whatever the predictor (predictors only decide which transfers run and
//! when); `lazy` + `lru` is plain LRU; and `oracle` (the true experts, requested at the start of the
//! token) is never slower than any other predictor: every transfer another policy needs, it needs
//! too and requests no later, and with the soonest-layer-first engine extra or later requests only
//! delay the set of transfers a layer waits for.
//!
//! A transfer counts as a *hit* for its access when the expert is cached or has landed by the end
//! of the layer's pre-MoE part (no wait); `cache_hit_rate` counts cached experts only.
//!
//! The parts: `params.rs` (what is simulated), `cache.rs` (the device cache), `copy_queue.rs` (the
//! copy engine), `meter.rs` (the counters); they are private to the simulation, whose invariants
//! (above) only hold together.

use crate::error::{Error, Result};
use crate::moe_aot::expert_prefetch::{ExpertTrace, IssuePoint, Predictor};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// An expert: (code layer, expert index).
pub type Expert = (usize, usize);

mod cache;
mod copy_queue;
mod meter;
mod params;

use cache::Cache;
use copy_queue::CopyQueue;
use meter::Meter;
pub use params::{CapacityScope, Eviction, LayerTime, SimParams};

/// One expert access (a MoE layer of a decoded token using one expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub step: usize,
    pub expert: Expert,
    /// cached when the layer needed it
    pub cache_hit: bool,
    /// cached or landed by a prefetch when the layer needed it (no wait)
    pub hit: bool,
}

/// Per MoE layer, over the measured tokens.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerStats {
    pub layer: usize,
    pub accesses: usize,
    pub hits: usize,
    /// experts predicted (union of a token's predictions for this layer), summed over tokens
    pub predicted: usize,
    /// of those, experts the layer used
    pub predicted_used: usize,
    /// `predicted_used / predicted` (null without predictions)
    pub precision: Option<f64>,
    /// `predicted_used / accesses` (0 without predictions: none of the experts was found)
    pub recall: Option<f64>,
    pub stall_seconds: f64,
}

/// What one simulation measured (warm-up tokens excluded). Field names are the JSON report's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimResult {
    pub policy: String,
    pub eviction: Eviction,
    pub capacity: usize,
    pub capacity_scope: CapacityScope,
    /// measured decoded tokens
    pub tokens: usize,
    pub accesses: usize,
    pub hits: usize,
    pub hit_rate: f64,
    pub cache_hits: usize,
    pub cache_hit_rate: f64,
    /// transfers issued by predictions
    pub prefetches: usize,
    /// prefetched experts that their layer used
    pub useful_prefetches: usize,
    /// transfers issued when a layer found an expert missing
    pub demand_loads: usize,
    /// host -> device bytes copied (cancelled transfers: the part copied)
    pub bytes_moved: f64,
    /// of those, bytes of prefetches their layer did not use
    pub wasted_bytes: f64,
    /// predicted experts used / predicted experts, over all layers (null without predictions)
    pub precision: Option<f64>,
    /// predicted experts used / all accesses, layers without predictions included (0 for `lazy`)
    pub recall: Option<f64>,
    pub stall_seconds: f64,
    pub stall_per_token_seconds: f64,
    /// compute alone (no stalls) per token
    pub compute_per_token_seconds: f64,
    pub time_per_token_seconds: f64,
    /// lazy's time per token / this one's (filled by [`compare`])
    pub speedup_over_lazy: Option<f64>,
    /// most prefetched experts waiting in buffers (copying or landed) at once
    pub peak_buffered_experts: usize,
    pub layers: Vec<LayerStats>,
    /// every measured access, in order (not in the JSON report)
    #[serde(skip)]
    pub access_log: Vec<Access>,
}

/// Simulate `predictor` on `trace` with `params`.
pub fn simulate(
    trace: &ExpertTrace,
    predictor: Predictor,
    params: &SimParams,
) -> Result<SimResult> {
    params.validate(trace)?;
    let moe_layers = trace.moe_layers();
    let times = if predictor.uses_fast_stream() {
        &params.fast_compute
    } else {
        &params.compute
    };
    let transfer = params.transfer_seconds();
    let mut cache = Cache::new(params, trace.num_layers);
    let mut queue = CopyQueue::default();
    let mut m = Meter::new(trace.num_layers);
    let mut clock = 0.0f64;
    let mut measure_from = 0.0f64;
    for (t, step) in trace.steps.iter().enumerate() {
        let measured = t >= params.warmup_tokens;
        if t == params.warmup_tokens {
            measure_from = clock;
        }
        // This token's predictions, in issue order.
        let mut issues: Vec<(IssuePoint, usize, Vec<usize>)> = moe_layers
            .iter()
            .flat_map(|&l| {
                predictor
                    .predictions(step, l)
                    .into_iter()
                    .map(move |p| (p.at, l, p.experts))
            })
            .collect();
        issues.sort_by_key(|(at, l, _)| (*at, *l));
        let mut issues = issues.into_iter().peekable();
        let mut outstanding: HashSet<Expert> = HashSet::new();
        let mut predicted: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); trace.num_layers];
        // Live transfers of this token, by expert.
        let mut jobs: BTreeMap<Expert, usize> = BTreeMap::new();
        let mut issue = |point: IssuePoint,
                         now: f64,
                         queue: &mut CopyQueue,
                         jobs: &mut BTreeMap<Expert, usize>,
                         outstanding: &mut HashSet<Expert>,
                         predicted: &mut [BTreeSet<usize>],
                         cache: &Cache,
                         m: &mut Meter| {
            while let Some((_, l, experts)) = issues.next_if(|(at, _, _)| *at == point) {
                for e in experts {
                    outstanding.insert((l, e));
                    predicted[l].insert(e);
                    if !cache.contains((l, e)) && !jobs.contains_key(&(l, e)) {
                        jobs.insert((l, e), queue.push(now, (t, l), transfer, false));
                        m.prefetched(measured, jobs.len());
                    }
                }
            }
        };
        for l in 0..trace.num_layers {
            let start = clock;
            issue(
                IssuePoint::start(l),
                start,
                &mut queue,
                &mut jobs,
                &mut outstanding,
                &mut predicted,
                &cache,
                &mut m,
            );
            let pre_end = start + times[l].pre;
            let mut end = pre_end + times[l].moe;
            if let Some(Some(layer)) = step.layers.get(l) {
                queue.run_until(pre_end);
                let used = &layer.used;
                for &e in used {
                    let cache_hit = cache.contains((l, e));
                    let landed = jobs.get(&(l, e)).is_some_and(|&id| queue.is_done(id));
                    if measured {
                        m.access(Access {
                            step: t,
                            expert: (l, e),
                            cache_hit,
                            hit: cache_hit || landed,
                        });
                    }
                    if !cache_hit && !jobs.contains_key(&(l, e)) {
                        jobs.insert((l, e), queue.push(pre_end, (t, l), transfer, true));
                        m.demand(measured);
                    }
                }
                let needed: Vec<usize> = used
                    .iter()
                    .filter_map(|&e| jobs.get(&(l, e)).copied())
                    .collect();
                let moe_start = queue.finish(&needed).max(pre_end);
                // This layer's predictions are settled: count them, drop the unused prefetches.
                let layer_jobs: Vec<(Expert, usize)> = jobs
                    .range((l, 0)..(l + 1, 0))
                    .map(|(&x, &id)| (x, id))
                    .collect();
                for ((_, e), id) in layer_jobs {
                    jobs.remove(&(l, e));
                    let copied = params.expert_bytes * queue.cancel(id);
                    m.bytes(measured, copied);
                    if !used.contains(&e) {
                        m.wasted(measured, copied);
                    } else if !queue.jobs[id].demand {
                        m.useful(measured);
                    }
                }
                m.layer(measured, l, &predicted[l], used, moe_start - pre_end);
                outstanding.retain(|&(pl, _)| pl != l);
                // The used experts enter the cache; a predicted expert evicted now is re-requested.
                for evicted in cache.admit(l, used, &outstanding, params.eviction) {
                    if outstanding.contains(&evicted) && !jobs.contains_key(&evicted) {
                        jobs.insert(
                            evicted,
                            queue.push(moe_start, (t, evicted.0), transfer, false),
                        );
                        m.prefetched(measured, jobs.len());
                    }
                }
                end = moe_start + times[l].moe;
            }
            if measured {
                m.compute += times[l].pre + times[l].moe;
            }
            issue(
                IssuePoint::end(l),
                end,
                &mut queue,
                &mut jobs,
                &mut outstanding,
                &mut predicted,
                &cache,
                &mut m,
            );
            clock = end;
        }
    }
    let tokens = trace.steps.len() - params.warmup_tokens;
    Ok(m.result(predictor, params, tokens, clock - measure_from))
}

/// Simulate each predictor (and `lazy`, the baseline) and fill in the speedups over `lazy`.
pub fn compare(
    trace: &ExpertTrace,
    predictors: &[Predictor],
    params: &SimParams,
) -> Result<Vec<SimResult>> {
    let lazy = simulate(trace, Predictor::Lazy, params)?;
    predictors
        .iter()
        .map(|&p| {
            let mut r = if p == Predictor::Lazy {
                lazy.clone()
            } else {
                simulate(trace, p, params)?
            };
            r.speedup_over_lazy = Some(lazy.time_per_token_seconds / r.time_per_token_seconds);
            Ok(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe_aot::expert_prefetch::{MoeLayerTrace, Prediction, StepTrace};

    /// (used, next-gate guess, m2r2 guess) of one layer.
    type Layer = (usize, Option<usize>, Option<usize>);

    /// A trace of 2 MoE layers, 4 experts, k = 1; m2r2's guess is issued at the end of the layer
    /// before.
    fn trace(steps: &[[Layer; 2]]) -> ExpertTrace {
        ExpertTrace {
            num_layers: 2,
            num_experts: 4,
            top_k: 1,
            gates: vec![1],
            steps: steps
                .iter()
                .enumerate()
                .map(|(t, layers)| StepTrace {
                    position: t,
                    token: 0,
                    layers: layers
                        .iter()
                        .enumerate()
                        .map(|(l, &(used, next_gate, m2r2))| {
                            Some(MoeLayerTrace {
                                used: vec![used],
                                next_gate: next_gate.map(|e| vec![e]),
                                m2r2: m2r2
                                    .map(|e| Prediction {
                                        at: IssuePoint::end(l - 1),
                                        experts: vec![e],
                                    })
                                    .into_iter()
                                    .collect(),
                            })
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// pre = moe = 1 s per layer, transfers of 1 s latency + 2 B at 1 B/s = 3 s.
    fn params(capacity: usize, eviction: Eviction) -> SimParams {
        let unit = vec![LayerTime { pre: 1.0, moe: 1.0 }; 2];
        SimParams {
            capacity,
            scope: CapacityScope::Global,
            eviction,
            expert_bytes: 2.0,
            bandwidth: 1.0,
            latency: 1.0,
            compute: unit.clone(),
            fast_compute: unit,
            warmup_tokens: 0,
        }
    }

    /// Worked by hand (times in s; "L1e3" = layer 1 expert 3; capacity 2):
    /// - lazy: t0 L0 misses e0 (demand 1->4, stall 3), L1 misses e1 (6->9, stall 3); t1 L0 hits,
    ///   L1 misses e2 (13->16, stall 3, evicts L1e1): 17 s, stall 9.
    /// - next-gate: L1e1 requested at 0; the demand for L0e0 at 1 preempts it (1->4), L1e1 resumes
    ///   4->6 and has landed when L1 needs it at 6; t1: the wrong guess L1e3 copies 7->10, the
    ///   demand for L1e2 runs 10->13: 14 s, stall 6.
    /// - m2r2: guesses issued at the end of layer 0 (5 and 11) are right but late by 2 s each: 15 s,
    ///   stall 7.
    /// - oracle: t0 requests L0e0 and L1e1 at 0 (0->3, 3->6: stalls 2 and 1); t1 requests L1e2 at 7
    ///   (L0e0 is cached), landed at 10 exactly when needed: 11 s, stall 3.
    #[test]
    fn hand_worked_stalls() {
        let tr = trace(&[
            [(0, None, None), (1, Some(1), Some(1))],
            [(0, None, None), (2, Some(3), Some(2))],
        ]);
        let run = |p| simulate(&tr, p, &params(2, Eviction::Lru)).unwrap();
        let expect = |p, total: f64, stall: f64, hits: usize| {
            let r = run(p);
            assert_eq!(r.time_per_token_seconds, total / 2.0, "{p} time");
            assert_eq!(r.stall_seconds, stall, "{p} stall");
            assert_eq!(r.hits, hits, "{p} hits");
            assert_eq!(r.accesses, 4);
            r
        };
        let lazy = expect(Predictor::Lazy, 17.0, 9.0, 1);
        assert_eq!(
            (lazy.demand_loads, lazy.prefetches, lazy.bytes_moved),
            (3, 0, 6.0)
        );
        assert_eq!(lazy.compute_per_token_seconds, 4.0);
        let ng = expect(Predictor::NextGate, 14.0, 6.0, 2);
        assert_eq!(
            (ng.demand_loads, ng.prefetches, ng.useful_prefetches),
            (2, 2, 1)
        );
        assert_eq!((ng.bytes_moved, ng.wasted_bytes), (8.0, 2.0));
        // Recall over all accesses: nothing predicts layer 0, where precision is undefined and
        // recall 0; lazy predicts nothing at all.
        assert_eq!((ng.precision, ng.recall), (Some(0.5), Some(0.25)));
        assert_eq!(ng.layers[1].recall, Some(0.5));
        assert_eq!(
            (ng.layers[0].precision, ng.layers[0].recall),
            (None, Some(0.0))
        );
        assert_eq!((lazy.precision, lazy.recall), (None, Some(0.0)));
        let m2r2 = expect(Predictor::M2r2, 15.0, 7.0, 1);
        assert_eq!((m2r2.precision, m2r2.recall), (Some(1.0), Some(0.5)));
        assert_eq!(m2r2.layers[1].stall_seconds, 4.0);
        let oracle = expect(Predictor::Oracle, 11.0, 3.0, 2);
        assert_eq!(oracle.peak_buffered_experts, 2);
        assert_eq!(oracle.cache_hits, 1);
    }

    /// Capacity 3; steps use (L0, L1) = (e0, e0), (e1, e1), (e2, e0). At t2 LRU makes room for L0e2
    /// by evicting L1e0, which L1 needs next; keep-predicted (with oracle's predictions) evicts L0e1
    /// instead, so L1e0 is a cache hit. Lazy has no predictions: both policies are plain LRU.
    #[test]
    fn keep_predicted_spares_a_predicted_expert() {
        let tr = trace(&[
            [(0, None, None), (0, None, None)],
            [(1, None, None), (1, None, None)],
            [(2, None, None), (0, None, None)],
        ]);
        let log = |p, e| {
            simulate(&tr, p, &params(3, e))
                .unwrap()
                .access_log
                .iter()
                .map(|a| a.cache_hit)
                .collect::<Vec<_>>()
        };
        let lru = [false, false, false, false, false, false];
        assert_eq!(log(Predictor::Lazy, Eviction::Lru), lru);
        assert_eq!(log(Predictor::Lazy, Eviction::KeepPredicted), lru);
        assert_eq!(log(Predictor::Oracle, Eviction::Lru), lru);
        let mut kept = lru;
        kept[5] = true;
        assert_eq!(log(Predictor::Oracle, Eviction::KeepPredicted), kept);
        // Under LRU the oracle re-requests L1e0 when it is evicted at t2.
        let r = simulate(&tr, Predictor::Oracle, &params(3, Eviction::Lru)).unwrap();
        assert_eq!((r.prefetches, r.demand_loads), (6, 0));
    }

    /// Per-layer pools: every prediction that names an expert of layer `l`'s pool is settled when
    /// `l` evicts, so `keep-predicted` protects nothing and equals `lru` (why the CLI refuses it),
    /// also on the trace of `keep_predicted_spares_a_predicted_expert`, where one global pool of 3
    /// tells them apart.
    #[test]
    fn per_layer_keep_predicted_is_lru() {
        let spares = trace(&[
            [(0, None, None), (0, None, None)],
            [(1, None, None), (1, None, None)],
            [(2, None, None), (0, None, None)],
        ]);
        let guesses = trace(&[
            [(0, None, None), (0, Some(1), Some(0))],
            [(1, None, None), (1, Some(1), Some(3))],
            [(2, None, None), (0, Some(0), Some(0))],
            [(0, None, None), (3, Some(3), Some(2))],
        ]);
        for tr in [&spares, &guesses] {
            for capacity in 1..=4 {
                let run = |p, eviction| {
                    let mut params = params(capacity, eviction);
                    params.scope = CapacityScope::PerLayer;
                    let mut r = simulate(tr, p, &params).unwrap();
                    r.eviction = Eviction::Lru;
                    r
                };
                for p in Predictor::ALL {
                    assert_eq!(
                        run(p, Eviction::KeepPredicted),
                        run(p, Eviction::Lru),
                        "{p}, {capacity} per layer"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        let tr = trace(&[[(0, None, None), (1, None, None)]]);
        let err = |p: SimParams| simulate(&tr, Predictor::Lazy, &p).unwrap_err().to_string();
        assert!(err(params(0, Eviction::Lru)).contains("capacity 0 is below k = 1"));
        let mut p = params(2, Eviction::Lru);
        p.warmup_tokens = 1;
        assert!(err(p).contains("leave none of the 1 decoded tokens"));
        let mut p = params(2, Eviction::Lru);
        p.bandwidth = 0.0;
        assert!(err(p).contains("bandwidth must be positive"));
        let mut p = params(2, Eviction::Lru);
        p.compute.pop();
        assert!(err(p).contains("compute has 1 layers, the trace 2"));
        // Traces: an expert outside the model, a guess issued after its layer started.
        let p = params(2, Eviction::Lru);
        let bad = trace(&[[(4, None, None), (1, None, None)]]);
        let e = simulate(&bad, Predictor::Lazy, &p).unwrap_err().to_string();
        assert!(e.contains("step 0 layer 0: used experts [4]"), "{e}");
        let mut late = trace(&[[(0, None, None), (1, None, Some(2))]]);
        late.steps[0].layers[1].as_mut().unwrap().m2r2[0].at = IssuePoint::end(1);
        let e = simulate(&late, Predictor::M2r2, &p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("m2r2 predicts [2]"), "{e}");
    }
}
