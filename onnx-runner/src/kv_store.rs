//! The runner's KV cache: one store per layer, fed to a graph as `past_key_values.{i}.*` and
//! replaced by its `present.{i}.*` outputs; rollback truncates along the sequence axis.
//!
//! # Shapes
//! - keys, values of layer `i`: `[1, Hkv, S, Dh]`, `S` positions (keys after RoPE).

use crate::error::{Error, Result};
use crate::session::{Input, Outputs};
use ndarray::{Array4, ArrayD, Axis, Ix4, s};
use std::ops::Range;

/// `past_key_values.{i}.key` / `.value`: the graph input names of layer `i`.
pub fn past_names(i: usize) -> (String, String) {
    (
        format!("past_key_values.{i}.key"),
        format!("past_key_values.{i}.value"),
    )
}

/// `present.{i}.key` / `.value`: the graph output names of layer `i`.
pub fn present_names(i: usize) -> (String, String) {
    (format!("present.{i}.key"), format!("present.{i}.value"))
}

/// Keys and values of a contiguous range of layers (global layer indices).
#[derive(Clone, Debug)]
pub struct KvStore {
    layers: Range<usize>,
    past: Vec<(String, String)>,
    present: Vec<(String, String)>,
    /// `[1, Hkv, S, Dh]` per layer of `layers`
    keys: Vec<Array4<f32>>,
    values: Vec<Array4<f32>>,
}

impl KvStore {
    /// An empty store (`S = 0`) for `layers`.
    pub fn new(layers: Range<usize>, kv_heads: usize, head_dim: usize) -> Self {
        let empty = Array4::zeros((1, kv_heads, 0, head_dim));
        KvStore {
            past: layers.clone().map(past_names).collect(),
            present: layers.clone().map(present_names).collect(),
            keys: vec![empty.clone(); layers.len()],
            values: vec![empty; layers.len()],
            layers,
        }
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Positions stored (the same in every layer).
    pub fn len(&self) -> usize {
        self.keys.first().map_or(0, |k| k.len_of(Axis(2)))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys and values of global layer `layer`, `[1, Hkv, S, Dh]` each.
    pub fn layer(&self, layer: usize) -> (&Array4<f32>, &Array4<f32>) {
        let i = layer - self.layers.start;
        (&self.keys[i], &self.values[i])
    }

    /// The `past_key_values.*` inputs of every layer.
    pub fn inputs(&self) -> Vec<(&str, Input<'_>)> {
        let mut inputs = Vec::with_capacity(2 * self.keys.len());
        for (i, (k, v)) in self.past.iter().enumerate() {
            inputs.push((k.as_str(), Input::F32(self.keys[i].view().into_dyn())));
            inputs.push((v.as_str(), Input::F32(self.values[i].view().into_dyn())));
        }
        inputs
    }

    /// Take the `present.*` outputs as the new store: they must hold the stored positions plus
    /// `added`, with the stored shape otherwise.
    pub fn update(&mut self, outputs: &mut Outputs, added: usize, file: &str) -> Result<()> {
        let expected_len = self.len() + added;
        for i in 0..self.keys.len() {
            let (kn, vn) = &self.present[i];
            let template = self.keys[i].dim();
            let expected = [template.0, template.1, expected_len, template.3];
            self.keys[i] = take4(outputs, kn, expected, file)?;
            self.values[i] = take4(outputs, vn, expected, file)?;
        }
        Ok(())
    }

    /// Replace every layer's keys and values (same layers, same positions in each).
    pub fn replace(&mut self, layers: Vec<(Array4<f32>, Array4<f32>)>) {
        assert_eq!(layers.len(), self.keys.len(), "one (key, value) per layer");
        for (i, (k, v)) in layers.into_iter().enumerate() {
            self.keys[i] = k;
            self.values[i] = v;
        }
    }

    /// Keep the positions `keep` (increasing), in that order: a token tree's accepted path
    /// (`Kv::compact`).
    pub fn select(&mut self, keep: &[usize]) {
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = t.select(Axis(2), keep);
        }
    }

    /// Keep the first `len` positions (no-op if already shorter).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = t.slice(s![.., .., ..len, ..]).to_owned();
        }
    }
}

fn take4(
    outputs: &mut Outputs,
    name: &str,
    expected: [usize; 4],
    file: &str,
) -> Result<Array4<f32>> {
    let t: ArrayD<f32> = outputs.take(name)?;
    if t.shape() != expected {
        return Err(Error::WrongShape {
            file: file.into(),
            tensor: name.into(),
            expected: format!("{expected:?}"),
            actual: t.shape().to_vec(),
        });
    }
    Ok(t.into_dimensionality::<Ix4>().expect("rank checked"))
}
