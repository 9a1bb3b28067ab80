//! Causal grouped-query attention with a KV cache (reference `attention.rs` and the attention half
//! of `layer::decoder_layer`).
//!
//! Query head `h` reads key/value head `h / G` (`G = H / Hkv`): queries are reshaped to
//! `[B, Hkv, G, T, Dh]` and keys / values to `[B, Hkv, 1, S, Dh]`, so one broadcasting `MatMul`
//! computes every head without repeating keys. Which keys a row sees is one boolean mask
//! ([`visibility`]): causal over cache positions, the sliding window when the config has one, and
//! `attention_mask`. Masked scores become `f32::MIN` (not `-inf`), so a fully masked row gives a
//! finite uniform softmax instead of NaN; a visible row's masked keys get exactly zero weight.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::ops::softmax;
use crate::emit::rope::{RopeTables, apply};
use reference::base::config::ModelConfig;

/// Which cached keys each row may attend to, shared by every layer of a graph.
pub struct Visibility {
    /// bool `[B, 1, 1, T, S]`: slow row at cache position `p` sees keys `lo..=p`.
    pub slow: String,
    /// bool `[B, 1, 1, T, S]`: fast row at `p` sees SLOW keys `lo..p` (its own key comes apart).
    pub fast: Option<String>,
    /// int64 `[T, T]`: the `Split` sizes that separate slow and fast rows after a projection of
    /// both (`[B, 2T, ...]`, slow rows first), with fast rows.
    pub pair_split: Option<String>,
}

/// The masks of a chunk of `T` rows appended after `P` cached positions (`S = P + T`): `T` from
/// axis 1 of `rows`, `P` from axis 2 of `past_key`.
///
/// With `tree_mask` (the speculative graphs' input: int64 `[T, S]`, 1 where row `t` sees cache
/// row `j`, causal and windowed by position, or a token tree's mask, given by the runner) the
/// slow rows see what it says and the fast rows the same keys before their own row (a fast row's
/// own key comes apart); without it (model.onnx) the rows are causal over cache positions, with
/// the config's sliding window.
///
/// # Shapes
/// - `rows`: `[B, T, ...]`, `past_key`: `[B, Hkv, P, Dh]`, `attention_mask`: int64 `[B, S]`
pub fn visibility(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    rows: &str,
    past_key: &str,
    attention_mask: &str,
    tree_mask: Option<&str>,
    with_fast: bool,
) -> Visibility {
    b.scoped("mask", |b| {
        let shape = |b: &mut GraphBuilder, x: &str, axis: i64| {
            b.node(
                "Shape",
                &[x],
                vec![("start", Attr::Int(axis)), ("end", Attr::Int(axis + 1))],
            )
        };
        let t = shape(b, rows, 1);
        let p = shape(b, past_key, 2);
        let s = b.binary("Add", &p, &t);
        let axis0 = b.const_i64(&[0]);
        let p0 = b.binary("Squeeze", &p, &axis0);
        let s0 = b.binary("Squeeze", &s, &axis0);
        let (zero, one) = (b.scalar_i64(0), b.scalar_i64(1));
        let qpos = b.node("Range", &[&p0, &s0, &one], vec![]); // [T]: cache positions of the rows
        let kpos = b.node("Range", &[&zero, &s0, &one], vec![]); // [S]
        let axis1 = b.const_i64(&[1]);
        let qcol = b.binary("Unsqueeze", &qpos, &axis1); // [T, 1]
        let krow = b.binary("Unsqueeze", &kpos, &axis0); // [1, S]
        let mut fast = b.binary("Less", &krow, &qcol); // j < p
        let mut slow = match tree_mask {
            Some(given) => {
                let given = b.node("Cast", &[given], vec![("to", Attr::Int(9))]); // bool [T, S]
                fast = b.binary("And", &fast, &given);
                given
            }
            None => b.binary("LessOrEqual", &krow, &qcol), // j <= p
        };
        if let (Some(w), None) = (config.sliding_window, tree_mask) {
            // key j visible when p - j < w
            let diff = b.binary("Sub", &qcol, &krow);
            let w = b.scalar_i64(w as i64);
            let inside = b.binary("Less", &diff, &w);
            slow = b.binary("And", &slow, &inside);
            fast = b.binary("And", &fast, &inside);
        }
        let keep = b.node("Cast", &[attention_mask], vec![("to", Attr::Int(9))]); // bool [B, S]
        let axes = b.const_i64(&[1, 2, 3]);
        let keep = b.binary("Unsqueeze", &keep, &axes); // [B, 1, 1, 1, S]
        Visibility {
            slow: b.binary("And", &slow, &keep),
            fast: with_fast.then(|| b.binary("And", &fast, &keep)),
            pair_split: with_fast
                .then(|| b.node("Concat", &[&t, &t], vec![("axis", Attr::Int(0))])),
        }
    })
}

/// `[B, T, n*Dh]` -> `[B, n, T, Dh]`.
pub fn split_heads(b: &mut GraphBuilder, x: &str, heads: usize, dh: usize) -> String {
    let shape = b.const_i64(&[0, 0, heads as i64, dh as i64]);
    let x = b.binary("Reshape", x, &shape);
    b.node(
        "Transpose",
        &[&x],
        vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))],
    )
}

/// Projected rows to heads, RoPE on queries and keys: `[B, H, T, Dh]`, `[B, Hkv, T, Dh]` twice.
fn heads(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    rope: &RopeTables,
    q: &str,
    k: &str,
    v: &str,
) -> [String; 3] {
    let (h, hkv, dh) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    );
    let q = split_heads(b, q, h, dh);
    let k = split_heads(b, k, hkv, dh);
    [
        apply(b, rope, &q),
        apply(b, rope, &k),
        split_heads(b, v, hkv, dh),
    ]
}

/// Queries `[B, H, T, Dh]` -> `[B, Hkv, G, T, Dh]`.
fn group_queries(b: &mut GraphBuilder, config: &ModelConfig, q: &str) -> String {
    let g = config.num_attention_heads / config.num_key_value_heads;
    let shape = b.const_i64(&[
        0,
        config.num_key_value_heads as i64,
        g as i64,
        -1,
        config.head_dim as i64,
    ]);
    b.binary("Reshape", q, &shape)
}

/// Keys or values `[B, Hkv, S, Dh]` -> `[B, Hkv, 1, S, Dh]`.
fn kv_group_axis(b: &mut GraphBuilder, x: &str) -> String {
    let axis = b.const_i64(&[2]);
    b.binary("Unsqueeze", x, &axis)
}

/// `[B, Hkv, G, T, Dh]` -> `[B, T, H*Dh]`.
fn merge_heads(b: &mut GraphBuilder, config: &ModelConfig, ctx: &str) -> String {
    let (h, dh) = (config.num_attention_heads as i64, config.head_dim as i64);
    let heads = b.const_i64(&[0, h, -1, dh]);
    let ctx = b.binary("Reshape", ctx, &heads);
    let ctx = b.node(
        "Transpose",
        &[&ctx],
        vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))],
    );
    let flat = b.const_i64(&[0, 0, h * dh]);
    b.binary("Reshape", &ctx, &flat)
}

/// `(q . k) * Dh^-0.5` for grouped queries and keys, masked.
///
/// # Shapes
/// - `q5`: `[B, Hkv, G, T, Dh]`, `k5`: `[B, Hkv, 1, S, Dh]`, `mask`: `[B, 1, 1, T, S]` -> `[B, Hkv, G, T, S]`
fn masked_scores(b: &mut GraphBuilder, dh: usize, q5: &str, k5: &str, mask: &str) -> String {
    let kt = b.node(
        "Transpose",
        &[k5],
        vec![("perm", Attr::Ints(vec![0, 1, 2, 4, 3]))],
    );
    let dots = b.binary("MatMul", q5, &kt);
    let scale = b.scalar_f32((dh as f32).powf(-0.5));
    let scores = b.binary("Mul", &dots, &scale);
    let hidden = b.scalar_f32(f32::MIN);
    b.node("Where", &[mask, &scores, &hidden], vec![])
}

/// What the slow rows of one layer's attention produced.
pub struct SlowAttention {
    /// `[B, T, H*Dh]` before o_proj
    pub ctx: String,
    /// `[B, Hkv, S, Dh]` keys after RoPE, cache then this chunk
    pub present_key: String,
    /// `[B, Hkv, S, Dh]`
    pub present_value: String,
}

/// Slow rows: RoPE, append this chunk's keys / values to the cache, attend over visible keys.
///
/// # Shapes
/// - `q`: `[B, T, H*Dh]`, `k`, `v`: `[B, T, Hkv*Dh]`, `past_*`: `[B, Hkv, P, Dh]`
#[allow(clippy::too_many_arguments)]
pub fn slow_attention(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    rope: &RopeTables,
    q: &str,
    k: &str,
    v: &str,
    past_key: &str,
    past_value: &str,
    mask: &str,
) -> SlowAttention {
    let [q, k, v] = heads(b, config, rope, q, k, v);
    let dh = config.head_dim;
    let concat = |b: &mut GraphBuilder, past: &str, new: &str| {
        b.node("Concat", &[past, new], vec![("axis", Attr::Int(2))])
    };
    let present_key = concat(b, past_key, &k);
    let present_value = concat(b, past_value, &v);
    let q5 = group_queries(b, config, &q);
    let k5 = kv_group_axis(b, &present_key);
    let v5 = kv_group_axis(b, &present_value);
    let scores = masked_scores(b, dh, &q5, &k5, mask);
    let probs = softmax(b, &scores);
    let ctx = b.binary("MatMul", &probs, &v5); // [B, Hkv, G, T, Dh]
    SlowAttention {
        ctx: merge_heads(b, config, &ctx),
        present_key,
        present_value,
    }
}

/// Fast rows (docs/m2r2/shared_kv.md): the fast row of the token at cache position `p` attends over the
/// SLOW keys / values of positions `lo..p` (`present_*` under the fast mask) plus its own fast key /
/// value, which never enter the cache. One softmax over `[slow scores | own score]`.
///
/// # Shapes
/// - `q`: `[B, T, H*Dh]`, `k`, `v`: `[B, T, Hkv*Dh]` (fast rows), `present_*`: `[B, Hkv, S, Dh]`
///   -> `[B, T, H*Dh]`
#[allow(clippy::too_many_arguments)]
pub fn fast_attention(
    b: &mut GraphBuilder,
    config: &ModelConfig,
    rope: &RopeTables,
    q: &str,
    k: &str,
    v: &str,
    present_key: &str,
    present_value: &str,
    fast_mask: &str,
) -> String {
    let [q, k, v] = heads(b, config, rope, q, k, v);
    let dh = config.head_dim;
    let q5 = group_queries(b, config, &q); // [B, Hkv, G, T, Dh]
    let own_k = kv_group_axis(b, &k); // [B, Hkv, 1, T, Dh]
    let own_v = kv_group_axis(b, &v);
    let slow_k = kv_group_axis(b, present_key);
    let slow_v = kv_group_axis(b, present_value);
    let slow_scores = masked_scores(b, dh, &q5, &slow_k, fast_mask); // [B, Hkv, G, T, S]
    // own score: q . k_own per row
    let prod = b.binary("Mul", &q5, &own_k);
    let last = b.const_i64(&[-1]);
    let own = b.node(
        "ReduceSum",
        &[&prod, &last],
        vec![("keepdims", Attr::Int(1))],
    );
    let scale = b.scalar_f32((dh as f32).powf(-0.5));
    let own = b.binary("Mul", &own, &scale); // [B, Hkv, G, T, 1]
    let scores = b.node(
        "Concat",
        &[&slow_scores, &own],
        vec![("axis", Attr::Int(-1))],
    );
    let probs = softmax(b, &scores); // [B, Hkv, G, T, S+1]
    let (zero, minus_one, end) = (
        b.const_i64(&[0]),
        b.const_i64(&[-1]),
        b.const_i64(&[i64::MAX]),
    );
    let a_slow = b.node("Slice", &[&probs, &zero, &minus_one, &last], vec![]);
    let a_own = b.node("Slice", &[&probs, &minus_one, &end, &last], vec![]);
    let ctx_slow = b.binary("MatMul", &a_slow, &slow_v);
    let ctx_own = b.binary("Mul", &a_own, &own_v);
    let ctx = b.binary("Add", &ctx_slow, &ctx_own);
    merge_heads(b, config, &ctx)
}
