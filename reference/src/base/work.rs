//! The work counter: multiply-accumulates and weight bytes read, counted from the shapes a layer
//! call really multiplies (`base::layer_work`; docs/m2r2/cost.md). `m2r2::cost::CostModel`
//! predicts the same numbers from the configs; the tests check that the two agree.
//!
//! MACs (FLOPs = 2 MACs) are counted in weight products and in attention; bytes are the f32 weights
//! read from memory, each matrix once per call however many rows share it (that is the point of
//! stacking slow and fast rows, and of verifying drafts in a chunk).

use crate::base::config::ModelConfig;
use std::ops::{Add, AddAssign};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// MACs in products with weight matrices (base, adapters, routers, LM head)
    pub weight_macs: u64,
    /// MACs in attention: `q.k` scores and the weighted sum of values
    pub attention_macs: u64,
    /// f32 weight bytes read (matrices, biases, norm weights, embedding rows)
    pub weight_bytes: u64,
}

impl Work {
    pub fn flops(&self) -> u64 {
        2 * (self.weight_macs + self.attention_macs)
    }

    /// Work for a product of `rows` rows with an `[out, in]` matrix (plus a bias of `out`).
    pub fn matmul(rows: usize, out: usize, inp: usize, bias: bool) -> Work {
        Work {
            weight_macs: (rows * out * inp) as u64,
            attention_macs: 0,
            weight_bytes: 4 * (out * inp + if bias { out } else { 0 }) as u64,
        }
    }

    /// Reading `n` f32 weights without multiplying by them (norm weights, embedding rows).
    pub fn read(n: usize) -> Work {
        Work {
            weight_bytes: 4 * n as u64,
            ..Work::default()
        }
    }

    /// Attention of one row over `visible` keys.
    pub fn attention(config: &ModelConfig, visible: usize) -> Work {
        Work {
            attention_macs: (2 * visible * config.num_attention_heads * config.head_dim) as u64,
            ..Work::default()
        }
    }
}

impl Add for Work {
    type Output = Work;
    fn add(self, o: Work) -> Work {
        Work {
            weight_macs: self.weight_macs + o.weight_macs,
            attention_macs: self.attention_macs + o.attention_macs,
            weight_bytes: self.weight_bytes + o.weight_bytes,
        }
    }
}

impl AddAssign for Work {
    fn add_assign(&mut self, o: Work) {
        *self = *self + o;
    }
}

impl std::iter::Sum for Work {
    fn sum<I: Iterator<Item = Work>>(iter: I) -> Work {
        iter.fold(Work::default(), Add::add)
    }
}
