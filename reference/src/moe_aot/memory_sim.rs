//! A two-level memory for MoE experts (spec section 6): experts live in host memory (LBM) and run
//! from a device cache (HBM) of fixed capacity; a copy engine moves them host -> device while the
//! layers compute. A pure, deterministic function of (expert trace, predictor, parameters).
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
//!   among those no outstanding prediction of this token names, else LRU).
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
//! One file past the usual size: the cache, the copy engine and the counters are private parts of
//! one simulation whose invariants (above) only hold together.

use crate::error::{Error, Result};
use crate::moe_aot::expert_prefetch::{ExpertTrace, IssuePoint, Predictor};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// An expert: (code layer, expert index).
pub type Expert = (usize, usize);

/// Which cached expert makes room for a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Eviction {
    Lru,
    KeepPredicted,
}

impl Eviction {
    pub fn name(self) -> &'static str {
        match self {
            Eviction::Lru => "lru",
            Eviction::KeepPredicted => "keep-predicted",
        }
    }
}

impl std::str::FromStr for Eviction {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lru" => Ok(Eviction::Lru),
            "keep-predicted" => Ok(Eviction::KeepPredicted),
            _ => Err(Error::Invalid(format!(
                "unknown eviction policy `{s}` (expected lru or keep-predicted)"
            ))),
        }
    }
}

/// Whether `capacity` counts experts over all layers or in each layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityScope {
    Global,
    PerLayer,
}

/// Compute time of one layer, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerTime {
    /// attention, norms and router: before the experts are needed
    pub pre: f64,
    /// the experts (or the dense MLP)
    pub moe: f64,
}

/// Everything the simulator needs besides the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SimParams {
    /// Experts the device cache holds (in all, or per layer: see `scope`); at least k.
    pub capacity: usize,
    pub scope: CapacityScope,
    pub eviction: Eviction,
    /// Bytes of one expert (gate, up and down projections).
    pub expert_bytes: f64,
    /// Host -> device bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Fixed cost of one transfer, seconds.
    pub latency: f64,
    /// Per layer: the base model's compute.
    pub compute: Vec<LayerTime>,
    /// Per layer: the compute with the fast stream's rows (what `m2r2` pays).
    pub fast_compute: Vec<LayerTime>,
    /// Decoded tokens simulated first and left out of every metric.
    pub warmup_tokens: usize,
}

impl SimParams {
    /// Seconds one expert transfer occupies the copy engine.
    pub fn transfer_seconds(&self) -> f64 {
        self.latency + self.expert_bytes / self.bandwidth
    }

    /// Refuse parameters, and traces, that the simulator cannot run.
    fn validate(&self, trace: &ExpertTrace) -> Result<()> {
        let bad = |msg: String| Err(Error::Invalid(msg));
        if self.capacity < trace.top_k {
            return bad(format!(
                "capacity {} is below k = {} experts per token: a layer's experts must fit",
                self.capacity, trace.top_k
            ));
        }
        for (name, v) in [
            ("bandwidth", self.bandwidth),
            ("expert size", self.expert_bytes),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("{name} must be positive and finite, got {v}"));
            }
        }
        if !(self.latency.is_finite() && self.latency >= 0.0) {
            return bad(format!(
                "latency must be >= 0 and finite, got {}",
                self.latency
            ));
        }
        for (name, times) in [
            ("compute", &self.compute),
            ("fast_compute", &self.fast_compute),
        ] {
            if times.len() != trace.num_layers {
                return bad(format!(
                    "{name} has {} layers, the trace {}",
                    times.len(),
                    trace.num_layers
                ));
            }
            if times
                .iter()
                .any(|t| !(t.pre >= 0.0 && t.moe >= 0.0 && (t.pre + t.moe).is_finite()))
            {
                return bad(format!("{name}: layer times must be >= 0 and finite"));
            }
        }
        if self.warmup_tokens >= trace.steps.len() {
            return bad(format!(
                "{} warm-up tokens leave none of the {} decoded tokens to measure",
                self.warmup_tokens,
                trace.steps.len()
            ));
        }
        if trace.moe_layers().is_empty() {
            return bad("the trace has no MoE layer".into());
        }
        for (t, step) in trace.steps.iter().enumerate() {
            if step.layers.len() != trace.num_layers {
                return bad(format!(
                    "step {t} has {} layers, the trace {}",
                    step.layers.len(),
                    trace.num_layers
                ));
            }
            for (l, layer) in step.layers.iter().enumerate() {
                let Some(layer) = layer else { continue };
                let valid = |experts: &[usize]| {
                    experts.iter().all(|&e| e < trace.num_experts)
                        && (1..experts.len()).all(|i| !experts[..i].contains(&experts[i]))
                };
                if layer.used.len() != trace.top_k || !valid(&layer.used) {
                    return bad(format!(
                        "step {t} layer {l}: used experts {:?} are not {} distinct experts below {}",
                        layer.used, trace.top_k, trace.num_experts
                    ));
                }
                for p in Predictor::ALL {
                    for guess in p.predictions(step, l) {
                        if guess.at > IssuePoint::start(l) || !valid(&guess.experts) {
                            return bad(format!(
                                "step {t} layer {l}: {p} predicts {:?} at {:?}, not distinct experts \
                                 below {} issued by the start of the layer",
                                guess.experts, guess.at, trace.num_experts
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

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
    /// `predicted_used / accesses` (null without predictions)
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
    /// predicted experts used / all accesses, layers without predictions included
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

/// The device cache: one LRU pool in all, or one per layer.
struct Cache {
    scope: CapacityScope,
    capacity: usize,
    /// per pool: expert -> last use (a global counter, so there are no ties)
    pools: Vec<BTreeMap<Expert, u64>>,
    tick: u64,
}

impl Cache {
    fn new(params: &SimParams, num_layers: usize) -> Self {
        let pools = match params.scope {
            CapacityScope::Global => 1,
            CapacityScope::PerLayer => num_layers,
        };
        Cache {
            scope: params.scope,
            capacity: params.capacity,
            pools: vec![BTreeMap::new(); pools],
            tick: 0,
        }
    }

    fn pool(&self, x: Expert) -> usize {
        match self.scope {
            CapacityScope::Global => 0,
            CapacityScope::PerLayer => x.0,
        }
    }

    fn contains(&self, x: Expert) -> bool {
        self.pools[self.pool(x)].contains_key(&x)
    }

    /// Layer `l` uses `used`: touch the cached ones (in top-k order), then admit the others, each
    /// evicting a victim that `l` does not use. Returns the evicted experts.
    fn admit(
        &mut self,
        l: usize,
        used: &[usize],
        outstanding: &HashSet<Expert>,
        eviction: Eviction,
    ) -> Vec<Expert> {
        let mut evicted = Vec::new();
        let (hits, misses): (Vec<usize>, Vec<usize>) =
            used.iter().partition(|&&e| self.contains((l, e)));
        for e in hits.into_iter().chain(misses) {
            let x = (l, e);
            let p = self.pool(x);
            if !self.pools[p].contains_key(&x) && self.pools[p].len() >= self.capacity {
                let lru = |keep: &dyn Fn(&Expert) -> bool| {
                    self.pools[p]
                        .iter()
                        .filter(|(y, _)| !(keep(y) || y.0 == l && used.contains(&y.1)))
                        .min_by_key(|&(_, &tick)| tick)
                        .map(|(&y, _)| y)
                };
                let victim = match eviction {
                    Eviction::Lru => None,
                    Eviction::KeepPredicted => lru(&|y| outstanding.contains(y)),
                }
                .or_else(|| lru(&|_| false))
                .expect("capacity >= k leaves a victim outside the layer's experts");
                self.pools[p].remove(&victim);
                evicted.push(victim);
            }
            self.tick += 1;
            self.pools[p].insert(x, self.tick);
        }
        evicted
    }
}

/// The copy engine: one transfer at a time, soonest-needed layer first (then request order),
/// preemptive. Every request is made at the engine's current time.
#[derive(Default)]
struct CopyQueue {
    now: f64,
    jobs: Vec<Job>,
    /// (needed at (step, layer), request number) of the pending jobs; the request number is the id
    pending: BTreeSet<((usize, usize), usize)>,
}

struct Job {
    /// (step, layer) that uses the expert
    need: (usize, usize),
    duration: f64,
    served: f64,
    done: bool,
    cancelled: bool,
    /// requested by the layer that found the expert missing (not by a prediction)
    demand: bool,
}

impl CopyQueue {
    /// Request a transfer needed by (step, layer) `need` at time `at`; returns its id.
    fn push(&mut self, at: f64, need: (usize, usize), duration: f64, demand: bool) -> usize {
        self.run_until(at);
        let id = self.jobs.len();
        self.jobs.push(Job {
            need,
            duration,
            served: 0.0,
            done: false,
            cancelled: false,
            demand,
        });
        self.pending.insert((need, id));
        id
    }

    /// Serve pending transfers until time `t`.
    fn run_until(&mut self, t: f64) {
        while self.now < t {
            let Some(&(_, id)) = self.pending.first() else {
                self.now = t;
                return;
            };
            self.serve(id, Some(t));
        }
    }

    /// Serve job `id` until done or until time `limit`.
    fn serve(&mut self, id: usize, limit: Option<f64>) {
        let job = &mut self.jobs[id];
        let left = job.duration - job.served;
        match limit {
            Some(t) if t - self.now < left => {
                job.served += t - self.now;
                self.now = t;
            }
            _ => {
                job.served = job.duration;
                job.done = true;
                self.now += left;
                self.pending.remove(&(job.need, id));
            }
        }
    }

    /// Serve (soonest first) until every job in `ids` is done; returns the time then.
    fn finish(&mut self, ids: &[usize]) -> f64 {
        while ids.iter().any(|&id| !self.jobs[id].done) {
            let &(_, id) = self.pending.first().expect("an unfinished job is pending");
            self.serve(id, None);
        }
        self.now
    }

    fn is_done(&self, id: usize) -> bool {
        self.jobs[id].done
    }

    /// Stop job `id` if it is still copying; returns the fraction of it copied.
    fn cancel(&mut self, id: usize) -> f64 {
        let job = &mut self.jobs[id];
        if !job.done && !job.cancelled {
            job.cancelled = true;
            self.pending.remove(&(job.need, id));
        }
        job.served / job.duration
    }
}

/// Counters of the measured tokens.
struct Meter {
    log: Vec<Access>,
    layers: Vec<LayerStats>,
    prefetches: usize,
    useful: usize,
    demand: usize,
    bytes: f64,
    wasted: f64,
    compute: f64,
    peak_buffered: usize,
}

impl Meter {
    fn new(num_layers: usize) -> Self {
        Meter {
            log: vec![],
            layers: (0..num_layers)
                .map(|layer| LayerStats {
                    layer,
                    accesses: 0,
                    hits: 0,
                    predicted: 0,
                    predicted_used: 0,
                    precision: None,
                    recall: None,
                    stall_seconds: 0.0,
                })
                .collect(),
            prefetches: 0,
            useful: 0,
            demand: 0,
            bytes: 0.0,
            wasted: 0.0,
            compute: 0.0,
            peak_buffered: 0,
        }
    }

    fn access(&mut self, a: Access) {
        let row = &mut self.layers[a.expert.0];
        row.accesses += 1;
        row.hits += a.hit as usize;
        self.log.push(a);
    }

    fn prefetched(&mut self, measured: bool, live: usize) {
        if measured {
            self.prefetches += 1;
            self.peak_buffered = self.peak_buffered.max(live);
        }
    }

    fn demand(&mut self, measured: bool) {
        self.demand += measured as usize;
    }

    fn useful(&mut self, measured: bool) {
        self.useful += measured as usize;
    }

    fn bytes(&mut self, measured: bool, b: f64) {
        if measured {
            self.bytes += b;
        }
    }

    fn wasted(&mut self, measured: bool, b: f64) {
        if measured {
            self.wasted += b;
        }
    }

    fn layer(
        &mut self,
        measured: bool,
        l: usize,
        predicted: &BTreeSet<usize>,
        used: &[usize],
        stall: f64,
    ) {
        if measured {
            let row = &mut self.layers[l];
            row.predicted += predicted.len();
            row.predicted_used += used.iter().filter(|e| predicted.contains(e)).count();
            row.stall_seconds += stall;
        }
    }

    fn result(
        mut self,
        predictor: Predictor,
        params: &SimParams,
        tokens: usize,
        elapsed: f64,
    ) -> SimResult {
        let ratio = |a: usize, b: usize| (b > 0).then(|| a as f64 / b as f64);
        self.layers.retain(|r| r.accesses > 0);
        for r in &mut self.layers {
            if r.predicted > 0 {
                r.precision = ratio(r.predicted_used, r.predicted);
                r.recall = ratio(r.predicted_used, r.accesses);
            }
        }
        let sum = |f: fn(&LayerStats) -> usize| self.layers.iter().map(f).sum::<usize>();
        let (accesses, predicted, predicted_used) = (
            sum(|r| r.accesses),
            sum(|r| r.predicted),
            sum(|r| r.predicted_used),
        );
        let hits = self.log.iter().filter(|a| a.hit).count();
        let cache_hits = self.log.iter().filter(|a| a.cache_hit).count();
        let stall: f64 = self.layers.iter().map(|r| r.stall_seconds).sum();
        SimResult {
            policy: predictor.name().into(),
            eviction: params.eviction,
            capacity: params.capacity,
            capacity_scope: params.scope,
            tokens,
            accesses,
            hits,
            hit_rate: hits as f64 / accesses as f64,
            cache_hits,
            cache_hit_rate: cache_hits as f64 / accesses as f64,
            prefetches: self.prefetches,
            useful_prefetches: self.useful,
            demand_loads: self.demand,
            bytes_moved: self.bytes,
            wasted_bytes: self.wasted,
            precision: (predicted > 0).then(|| predicted_used as f64 / predicted as f64),
            recall: (predicted > 0).then(|| predicted_used as f64 / accesses as f64),
            stall_seconds: stall,
            stall_per_token_seconds: stall / tokens as f64,
            compute_per_token_seconds: self.compute / tokens as f64,
            time_per_token_seconds: elapsed / tokens as f64,
            speedup_over_lazy: None,
            peak_buffered_experts: self.peak_buffered,
            layers: self.layers,
            access_log: self.log,
        }
    }
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
        // Recall over all accesses: nothing predicts layer 0.
        assert_eq!((ng.precision, ng.recall), (Some(0.5), Some(0.25)));
        assert_eq!(ng.layers[1].recall, Some(0.5));
        assert_eq!(ng.layers[0].recall, None);
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
