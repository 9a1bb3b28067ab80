//! The counters of the memory simulator's measured tokens.

use super::*;

/// Counters of the measured tokens.
pub(super) struct Meter {
    pub(super) log: Vec<Access>,
    pub(super) layers: Vec<LayerStats>,
    pub(super) prefetches: usize,
    pub(super) useful: usize,
    pub(super) demand: usize,
    pub(super) bytes: f64,
    pub(super) wasted: f64,
    pub(super) compute: f64,
    pub(super) peak_buffered: usize,
}

impl Meter {
    pub(super) fn new(num_layers: usize) -> Self {
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

    pub(super) fn access(&mut self, a: Access) {
        let row = &mut self.layers[a.expert.0];
        row.accesses += 1;
        row.hits += a.hit as usize;
        self.log.push(a);
    }

    pub(super) fn prefetched(&mut self, measured: bool, live: usize) {
        if measured {
            self.prefetches += 1;
            self.peak_buffered = self.peak_buffered.max(live);
        }
    }

    pub(super) fn demand(&mut self, measured: bool) {
        self.demand += measured as usize;
    }

    pub(super) fn useful(&mut self, measured: bool) {
        self.useful += measured as usize;
    }

    pub(super) fn bytes(&mut self, measured: bool, b: f64) {
        if measured {
            self.bytes += b;
        }
    }

    pub(super) fn wasted(&mut self, measured: bool, b: f64) {
        if measured {
            self.wasted += b;
        }
    }

    pub(super) fn layer(
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

    pub(super) fn result(
        mut self,
        predictor: Predictor,
        params: &SimParams,
        tokens: usize,
        elapsed: f64,
    ) -> SimResult {
        let ratio = |a: usize, b: usize| (b > 0).then(|| a as f64 / b as f64);
        self.layers.retain(|r| r.accesses > 0);
        // Precision over no predictions is undefined (null); recall is defined by the accesses, so a
        // layer, or a predictor, that predicts nothing has found none of its experts: 0.
        for r in &mut self.layers {
            r.precision = ratio(r.predicted_used, r.predicted);
            r.recall = ratio(r.predicted_used, r.accesses);
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
            precision: ratio(predicted_used, predicted),
            recall: ratio(predicted_used, accesses),
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
