//! The rows of a [`StaticKv`]'s buffers copied: out to the host, and within the buffers (a token
//! tree's accepted path compacted).

use super::StaticKv;
use crate::device_kv::host_array;
use crate::error::{Error, Result};
use crate::kv_store::KvStore;
use ndarray::{ArrayViewMutD, s};
use ort::memory::AllocationDevice;
use std::ops::Range;

impl StaticKv {
    /// The filled positions of every layer, copied to the host.
    pub fn to_host(&self) -> Result<KvStore> {
        self.layers_to_host(0..self.buffers.len(), self.len)
    }

    /// The first `len` positions of `layers`, copied to the host.
    pub fn layers_to_host(&self, layers: Range<usize>, len: usize) -> Result<KvStore> {
        let mut store = KvStore::new(layers.clone(), self.kv_heads, self.head_dim);
        let kept = self.buffers[layers]
            .iter()
            .map(|(k, v)| Ok((host_array(k, Some(len))?, host_array(v, Some(len))?)))
            .collect::<Result<Vec<_>>>()?;
        store.replace(kept);
        Ok(store)
    }

    /// Move a token tree's accepted path into place in every layer: the scratch slot `root +
    /// path[i]` of the path's node at depth `i` to position `root + i` (the reference's
    /// `KvCache::compact`; each row was computed for that position, so the copy is exact).
    /// Buffers in device memory go through the host (a copy of every layer each round).
    pub fn compact(&mut self, root: usize, path: &[usize]) -> Result<()> {
        // (from, to), to increasing and each from >= its to: no move overwrites a later source
        let moves: Vec<(usize, usize)> = (0..path.len())
            .filter(|&i| path[i] != i)
            .map(|i| (root + path[i], root + i))
            .collect();
        if moves.is_empty() {
            return Ok(());
        }
        if let Some(&(from, _)) = moves.iter().find(|(from, _)| *from >= self.l_max) {
            return Err(Error::Runtime(format!(
                "a token tree's accepted row sits at slot {from}, past the static KV buffers' \
                 {} positions",
                self.l_max
            )));
        }
        let err = |e: ort::Error| {
            Error::Runtime(format!(
                "cannot move a token tree's accepted rows in the static KV buffers: {e}"
            ))
        };
        let move_rows = |a: &mut ArrayViewMutD<f32>| {
            for &(from, to) in &moves {
                let row = a.slice(s![.., .., from, ..]).to_owned();
                a.slice_mut(s![.., .., to, ..]).assign(&row);
            }
        };
        for (k, v) in &mut self.buffers {
            for t in [k, v] {
                if t.memory_info().is_cpu_accessible() {
                    move_rows(&mut t.try_extract_array_mut::<f32>().map_err(err)?);
                } else {
                    let mut host = t.to(AllocationDevice::CPU, 0).map_err(err)?;
                    move_rows(&mut host.try_extract_array_mut::<f32>().map_err(err)?);
                    host.copy_into(&mut *t).map_err(err)?;
                }
            }
        }
        Ok(())
    }
}
