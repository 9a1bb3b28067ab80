//! The base model: the slow residual stream of M2R2 (docs/m2r2/streams.md), exactly HF's
//! `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM` / `MixtralForCausalLM` in f32.
//!
//! ```text
//! s_0 = Embed[tokens]                                  [T, D]
//! for l in 0..N:
//!     s += Attention_l(RMSNorm(s), cache_l)            (writes K/V of the T positions)
//!     s += FeedForward_l(RMSNorm(s))                   (SwiGLU MLP or sparse MoE)
//! logits = LMHead(RMSNorm_final(s))                    [T, V]
//! ```

use crate::base::config::ModelConfig;
use crate::base::kv_cache::KvCache;
use crate::base::layer::{DecoderLayer, LayerOutput, Sequence, TreeRows};
use crate::base::matmul::linear;
use crate::base::ops::rms_norm;
use crate::base::rope::Rope;
use crate::base::tree::TokenTree;
use crate::base::weights::Weights;
use crate::base::work::Work;
use crate::error::{Error, Result};
use ndarray::{Array2, ArrayView2, Axis, s};

/// Logits and the work it took to compute them.
#[derive(Clone, Debug)]
pub struct Output {
    /// `[T, V]`
    pub logits: Array2<f32>,
    pub work: Work,
}

/// Logits of each sequence of a batch, and the work of the whole batch.
#[derive(Clone, Debug)]
pub struct BatchOutput {
    /// `[T_i, V]` per sequence
    pub logits: Vec<Array2<f32>>,
    pub work: Work,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    rope: Rope,
}

impl Model {
    /// Wrap validated config and weights (as produced by the loaders).
    pub fn new(config: ModelConfig, weights: Weights) -> Self {
        let rope = Rope::new(&config);
        Model {
            config,
            weights,
            rope,
        }
    }

    /// The longest sequence a cache may hold: the model's context.
    pub fn context_length(&self) -> usize {
        self.config.max_position_embeddings
    }

    /// A cache sized for `positions` positions, refused beyond the context.
    pub fn new_cache(&self, positions: usize) -> Result<KvCache> {
        if positions > self.context_length() {
            return Err(Error::ContextOverflow {
                needed: positions,
                capacity: self.context_length(),
            });
        }
        Ok(KvCache::new(&self.config, positions))
    }

    /// Refuse token ids outside the vocabulary and positions beyond the cache.
    pub fn check_input(&self, tokens: &[u32], pos0: usize, cache: &KvCache) -> Result<()> {
        if let Some(position) = tokens
            .iter()
            .position(|&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::TokenOutOfRange {
                id: tokens[position],
                position: pos0 + position,
                vocab_size: self.config.vocab_size,
            });
        }
        let needed = pos0 + tokens.len();
        let capacity = cache.capacity().min(self.context_length());
        if needed > capacity {
            return Err(Error::ContextOverflow { needed, capacity });
        }
        Ok(())
    }

    /// Refuse a token tree whose nodes do not fit the cache after its `cache.len()` positions (one
    /// scratch slot per node, `base/tree.rs`), and token ids outside the vocabulary.
    pub fn check_tree(&self, tokens: &[u32], tree: &TokenTree, cache: &KvCache) -> Result<()> {
        if tokens.len() != tree.nodes() {
            return Err(Error::Invalid(format!(
                "{} tokens for a token tree of {} nodes: give one token per node",
                tokens.len(),
                tree.nodes()
            )));
        }
        let n = cache.len();
        let capacity = cache.capacity().min(self.context_length());
        if n + tree.nodes() > capacity {
            return Err(Error::Invalid(format!(
                "a token tree of {} nodes after {n} positions needs {} cache slots (one scratch \
                 slot per node), but the cache holds {capacity} positions",
                tree.nodes(),
                n + tree.nodes()
            )));
        }
        if let Some(i) = tokens
            .iter()
            .position(|&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::TokenOutOfRange {
                id: tokens[i],
                position: tree.position(i, n),
                vocab_size: self.config.vocab_size,
            });
        }
        Ok(())
    }

    /// `s_0`: embedding rows of the tokens (ids already checked).
    ///
    /// # Shapes
    /// -> `[T, D]`
    pub fn embed(&self, tokens: &[u32]) -> Array2<f32> {
        let ids: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
        self.weights.embed.select(Axis(0), &ids)
    }

    /// Decoder layer `l` with the config, weights and RoPE tables it reads.
    pub fn layer(&self, l: usize) -> DecoderLayer<'_> {
        DecoderLayer {
            config: &self.config,
            index: l,
            weights: &self.weights.layers[l],
            rope: &self.rope,
        }
    }

    /// One decoder layer of the slow stream on a chunk of rows at positions `pos0..pos0+T`, in place:
    /// `s += Attn(RMSNorm(s)); s += FFN(RMSNorm(s))`. Writes the chunk's K/V into `cache`. Returns the
    /// expert routing of each row in MoE layers and the work done.
    ///
    /// # Shapes
    /// - `s`: `[T, D]`
    pub fn layer_forward(
        &self,
        l: usize,
        s: &mut Array2<f32>,
        pos0: usize,
        cache: &mut KvCache,
    ) -> LayerOutput {
        self.layer(l).forward(s, pos0, cache, None)
    }

    /// The RoPE tables of this model.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// `LMHead(RMSNorm_final(s))`, with the work done.
    ///
    /// # Shapes
    /// - `s`: `[T, D]` -> `[T, V]`
    pub fn head(&self, s: ArrayView2<f32>) -> Output {
        let h = self.final_norm(s);
        let head = self.weights.lm_head();
        let work = Work::read(self.weights.final_norm.len())
            + Work::matmul(s.nrows(), head.nrows(), head.ncols(), false);
        Output {
            logits: linear(h.view(), head.view(), None),
            work,
        }
    }

    /// `RMSNorm_final(s)`: the input of the LM head (and of the pruned draft head).
    ///
    /// # Shapes
    /// - `s`: `[T, D]` -> `[T, D]`
    pub fn final_norm(&self, s: ArrayView2<f32>) -> Array2<f32> {
        rms_norm(s, &self.weights.final_norm, self.config.rms_norm_eps as f32)
    }

    /// Run `tokens` through the whole model as one chunk appended at `cache.len()`, advance the cache
    /// and return the logits of every new position, with the work done (embedding rows, layers, head).
    ///
    /// # Shapes
    /// - `tokens`: `[T]` -> logits `[T, V]`
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Output> {
        let BatchOutput { mut logits, work } = self.forward_batch(&[tokens], &mut [cache])?;
        Ok(Output {
            logits: logits.pop().expect("one sequence"),
            work,
        })
    }

    /// A prefill that keeps what a speculative loop's bridge reads: `tokens` through every layer
    /// as one chunk appended at `cache.len()` (the cache advances), returning the logits of the
    /// last row and the final slow residuals `s_N` (before the final norm) of every row.
    ///
    /// # Shapes
    /// - `tokens`: `[T]` -> (`[V]`, `[T, D]`)
    pub fn prefill_states(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<(Vec<f32>, Array2<f32>)> {
        let pos0 = cache.len();
        self.check_input(tokens, pos0, cache)?;
        let mut s = self.embed(tokens);
        for l in 0..self.config.num_hidden_layers {
            self.layer_forward(l, &mut s, pos0, cache);
        }
        cache.set_len(pos0 + tokens.len());
        let last = s.nrows() - 1;
        let logits = self.head(s.slice(ndarray::s![last.., ..])).logits;
        Ok((logits.row(0).to_vec(), s))
    }

    /// [`Model::forward`] of several independent sequences at once: chunk `i` is appended to
    /// `caches[i]`. All rows go through each weight together (one weight read per batch), and
    /// every sequence's logits are bitwise those of its own `forward` (batch invariance).
    ///
    /// # Shapes
    /// - `chunks[i]`: `[T_i]` -> logits `[T_i, V]` each
    pub fn forward_batch(
        &self,
        chunks: &[&[u32]],
        caches: &mut [&mut KvCache],
    ) -> Result<BatchOutput> {
        assert_eq!(chunks.len(), caches.len(), "one cache per chunk");
        for (tokens, cache) in chunks.iter().zip(caches.iter()) {
            self.check_input(tokens, cache.len(), cache)?;
        }
        let all: Vec<u32> = chunks.concat();
        let mut s = self.embed(&all);
        let mut work = Work::read(all.len() * self.config.hidden_size);
        let pos0: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        for l in 0..self.config.num_hidden_layers {
            let mut seqs: Vec<Sequence> = caches
                .iter_mut()
                .zip(chunks)
                .zip(&pos0)
                .map(|((cache, tokens), &pos0)| Sequence {
                    rows: tokens.len(),
                    pos0,
                    cache,
                    tree: None,
                })
                .collect();
            work += self.layer(l).forward_batch(&mut s, &mut seqs, None).work;
        }
        let head = self.head(s.view());
        let mut first = 0;
        let mut logits = Vec::with_capacity(chunks.len());
        for (cache, tokens) in caches.iter_mut().zip(chunks) {
            cache.set_len(cache.len() + tokens.len());
            logits.push(
                head.logits
                    .slice(s![first..first + tokens.len(), ..])
                    .to_owned(),
            );
            first += tokens.len();
        }
        Ok(BatchOutput {
            logits,
            work: work + head.work,
        })
    }

    /// Run the nodes of a token tree through the whole model as one chunk, the root at position
    /// `n = cache.len()` (`tokens[i]` is node `i`'s token): node `i` at position `n + depth(i)`,
    /// its K/V written to slot `n + i` of every layer, attending to `cache[..n]` (within the
    /// window) and its ancestors only. `cache.len()` stays `n`: keep the accepted path with
    /// [`KvCache::compact`](crate::base::kv_cache::KvCache::compact). Row `i` of the logits is
    /// bitwise the last row of decoding `path(i)`'s tokens one at a time after the same cache, and
    /// the slots of a path hold that decode's K/V (`base/tree.rs`).
    ///
    /// # Shapes
    /// - `tokens`: `[T]` (one per node) -> logits `[T, V]`
    ///
    /// # Errors
    /// [`Model::check_tree`]'s.
    pub fn forward_tree(
        &self,
        tokens: &[u32],
        tree: &TokenTree,
        cache: &mut KvCache,
    ) -> Result<Output> {
        self.check_tree(tokens, tree, cache)?;
        let n = cache.len();
        let mut s = self.embed(tokens); // [T, D]
        let mut work = Work::read(tokens.len() * self.config.hidden_size);
        let rows = TreeRows { tree, first: 0 };
        for l in 0..self.config.num_hidden_layers {
            work += self
                .layer(l)
                .forward_tree(&mut s, n, rows, cache, None)
                .work;
        }
        let head = self.head(s.view());
        Ok(Output {
            logits: head.logits,
            work: work + head.work,
        })
    }

    /// Logits of every position of `tokens` computed in one chunk from an empty cache.
    ///
    /// # Shapes
    /// - `tokens`: `[T]` -> `[T, V]`
    pub fn teacher_forced_logits(&self, tokens: &[u32]) -> Result<Array2<f32>> {
        let mut cache = self.new_cache(tokens.len())?;
        Ok(self.forward(tokens, &mut cache)?.logits)
    }
}
