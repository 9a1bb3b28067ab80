//! The device cache of the memory simulator.

use super::*;

/// The device cache: one LRU pool in all, or one per layer.
pub(super) struct Cache {
    pub(super) scope: CapacityScope,
    pub(super) capacity: usize,
    /// per pool: expert -> last use (a global counter, so there are no ties)
    pub(super) pools: Vec<BTreeMap<Expert, u64>>,
    pub(super) tick: u64,
}

impl Cache {
    pub(super) fn new(params: &SimParams, num_layers: usize) -> Self {
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

    pub(super) fn pool(&self, x: Expert) -> usize {
        match self.scope {
            CapacityScope::Global => 0,
            CapacityScope::PerLayer => x.0,
        }
    }

    pub(super) fn contains(&self, x: Expert) -> bool {
        self.pools[self.pool(x)].contains_key(&x)
    }

    /// Layer `l` uses `used`: touch the cached ones (in top-k order), then admit the others, each
    /// evicting a victim that `l` does not use. Returns the evicted experts.
    pub(super) fn admit(
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
