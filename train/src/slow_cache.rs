//! The slow stream of a data set on disk (`m2r2 train --slow-cache DIR`), so that a `--resume`, a
//! longer schedule or another rank / temperature / learning rate on the same data does not repeat
//! the base model's pass (44 minutes for SmolLM2's 685 k training tokens on 2 cores).
//!
//! One safetensors file per (model, gates, trained intervals, intermediate targets, data): its name
//! is a SHA-256 key over all of them, including every base weight's bytes and every sample's
//! tokens, so a changed model or data set never reads a stale file; the adapters' rank, targets and
//! training settings are not in the key (the slow stream does not depend on them). A data set made
//! of several folders ([`SlowPass::parts`]) is written as one file per folder, so another
//! combination of the same folders reads them; where a file exists for several consecutive folders
//! together (the whole set, or a set cached before), it is read instead. Tensors are
//! named `{sample}.start.{j}`, `{sample}.k.{layer}`, `{sample}.v.{layer}`, `{sample}.last` and
//! `{sample}.aligned.{j}.{i}`: exactly the [`SlowSample`] fields, f32, bit for bit what the pass
//! computes (tested). Files are written to a temporary name and renamed, so an interrupted write
//! leaves no file that could be read.

use crate::base_digest::hash_slow_weights;
use crate::data::DistillSample;
use crate::error::{Error, Result};
use crate::slow_stream::SlowSample;
use ndarray::Array2;
use reference::Model;
use reference::m2r2::config::M2r2Config;
use safetensors::tensor::{Dtype, View};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Version of the file layout, part of the key.
const FORMAT: &str = "m2r2-slow-stream-1";

/// What the slow stream of one data set is built from: everything its values depend on.
#[derive(Clone, Copy)]
pub struct SlowKey<'a> {
    pub model: &'a Model,
    pub config: &'a M2r2Config,
    pub data: &'a [DistillSample],
    /// Trained intervals (0-based).
    pub intervals: &'a [usize],
    pub keep_aligned: bool,
}

impl SlowKey<'_> {
    /// The cache file's name: `slow-` and the first 16 hex digits of the SHA-256 key.
    pub fn file_name(&self) -> String {
        self.file_name_after(self.settings_hash())
    }

    /// The key's hash state after everything but the data (the model's weights, most of the
    /// work): the same for every part of a data set, so it is computed once per set.
    fn settings_hash(&self) -> Sha256 {
        let mut h = Sha256::new();
        h.update(FORMAT.as_bytes());
        h.update(self.model.config.hash().as_bytes());
        hash_slow_weights(&mut h, self.model);
        let gates = format!(
            "gates {:?} of {} layers; intervals {:?}; aligned {}",
            self.config.gates, self.config.num_layers, self.intervals, self.keep_aligned
        );
        h.update(gates.as_bytes());
        h
    }

    /// [`file_name`](Self::file_name) from `h`, this key's [`settings_hash`](Self::settings_hash).
    fn file_name_after(&self, mut h: Sha256) -> String {
        for d in self.data {
            h.update((d.tokens.len() as u64).to_le_bytes());
            h.update((d.first_row() as u64).to_le_bytes());
            for t in &d.tokens {
                h.update(t.to_le_bytes());
            }
        }
        let digest = h.finalize();
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("slow-{hex}.safetensors")
    }
}

/// A `[rows, cols]` f32 array as a safetensors view, without copying on little-endian machines.
struct F32View<'a> {
    shape: [usize; 2],
    data: &'a [f32],
}

impl<'a> F32View<'a> {
    fn of(a: &'a Array2<f32>) -> Self {
        F32View {
            shape: [a.nrows(), a.ncols()],
            data: a
                .as_slice()
                .expect("slow-stream arrays are in standard layout"),
        }
    }
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            // SAFETY: f32 has no padding and every bit pattern is a valid u8 sequence; the slice
            // covers exactly the f32s' bytes and u8 has alignment 1. On little-endian machines
            // these are the little-endian bytes safetensors stores.
            Cow::Borrowed(unsafe {
                std::slice::from_raw_parts(
                    self.data.as_ptr().cast::<u8>(),
                    std::mem::size_of_val(self.data),
                )
            })
        } else {
            Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
    }
    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}

/// Write `samples` to `path` (through a temporary file in the same folder, renamed at the end).
pub fn write(path: &Path, samples: &[SlowSample<f32>]) -> Result<()> {
    let views: Vec<(String, F32View)> = samples
        .iter()
        .enumerate()
        .flat_map(|(i, s)| named_arrays(i, s))
        .map(|(name, a)| (name, F32View::of(a)))
        .collect();
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("samples".to_string(), samples.len().to_string()),
    ]);
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let written = reference::io::checkpoint::write_safetensors(views, Some(metadata), &tmp)
        .map_err(|e| Error::Data {
            file: tmp.display().to_string(),
            msg: format!("cannot write the slow-stream cache: {e}"),
        })
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Read the slow stream of `key`'s data from `path`, checking every tensor's presence and shape
/// against what the pass would compute (a file that is not one is an error naming it and the
/// tensor, never silently recomputed).
pub fn read(path: &Path, key: &SlowKey) -> Result<Vec<SlowSample<f32>>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only and only read while `file` is open here; a cache file changed
    // by another process while it is read would give wrong values, as with any file read.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let bad = |msg: String| Error::Data {
        file: path.display().to_string(),
        msg,
    };
    let tensors = safetensors::SafeTensors::deserialize(&map).map_err(|e| {
        bad(format!(
            "not a slow-stream cache file ({e}); delete it to recompute"
        ))
    })?;
    let count = tensors.len();
    let mut copied = copy_in_file_order(&map, &tensors);
    let (model, config) = (&key.model.config, key.config);
    let (d, kv_dim) = (model.hidden_size, model.kv_dim());
    let mut get = |name: String, cols: usize, rows: usize| -> Result<Array2<f32>> {
        let (dtype, shape, values) = copied.remove(&name).ok_or_else(|| {
            bad(format!(
                "no tensor `{name}` in the file; delete it to recompute"
            ))
        })?;
        if dtype != Dtype::F32 || shape != [rows, cols] {
            return Err(bad(format!(
                "tensor `{name}` is {dtype:?} {shape:?}, expected F32 [{rows}, {cols}]; delete the \
                 file to recompute"
            )));
        }
        Ok(Array2::from_shape_vec((rows, cols), values).expect("shape checked"))
    };
    let mut samples = Vec::with_capacity(key.data.len());
    for (i, sample) in key.data.iter().enumerate() {
        let t = sample.tokens.len();
        let mut starts = vec![None; config.num_gates()];
        let mut kv = vec![None; model.num_hidden_layers];
        let mut aligned: Vec<Option<Vec<Array2<f32>>>> = vec![None; config.num_gates()];
        for &j in key.intervals {
            starts[j] = Some(get(format!("{i}.start.{j}"), d, t)?);
            for l in config.interval_layers(j) {
                kv[l] = Some((
                    get(format!("{i}.k.{l}"), kv_dim, t)?,
                    get(format!("{i}.v.{l}"), kv_dim, t)?,
                ));
            }
            if key.keep_aligned && config.interval_len(j) > 1 {
                aligned[j] = Some(
                    (0..config.interval_len(j) - 1)
                        .map(|n| get(format!("{i}.aligned.{j}.{n}"), d, t))
                        .collect::<Result<_>>()?,
                );
            }
        }
        samples.push(SlowSample {
            tokens: sample.tokens.clone(),
            first_row: sample.first_row(),
            starts,
            kv,
            last: get(format!("{i}.last"), d, t)?,
            aligned,
        });
    }
    let expected: usize = samples
        .iter()
        .enumerate()
        .map(|(i, s)| named_arrays(i, s).len())
        .sum();
    if count != expected {
        return Err(bad(format!(
            "{count} tensors, expected {expected} for {} samples; delete the file to recompute",
            samples.len()
        )));
    }
    Ok(samples)
}

/// Every tensor's dtype, shape and f32 values (empty for other dtypes), copied out of `map` in file
/// order, handing each 256 MiB back to the kernel once copied: the mapped pages would otherwise
/// count as resident until the map is dropped, doubling the peak memory of reading a 10 GB cache.
fn copy_in_file_order(
    map: &memmap2::Mmap,
    tensors: &safetensors::SafeTensors,
) -> HashMap<String, (Dtype, Vec<usize>, Vec<f32>)> {
    const RELEASE_EVERY: usize = 256 << 20;
    let base = map.as_ptr() as usize;
    let mut views: Vec<_> = tensors.iter().collect();
    views.sort_by_key(|(_, t)| t.data().as_ptr() as usize);
    let (mut released, mut copied) = (0, HashMap::with_capacity(views.len()));
    for (name, t) in views {
        let values: Vec<f32> = match t.dtype() {
            Dtype::F32 => t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            _ => Vec::new(),
        };
        let end = t.data().as_ptr() as usize - base + t.data().len();
        copied.insert(name.to_string(), (t.dtype(), t.shape().to_vec(), values));
        if end - released >= RELEASE_EVERY {
            release(map, released, end - released);
            released = end;
        }
    }
    copied
}

/// Drop the pages of `map[offset..offset + len]` from this process (they are re-read from the file
/// if touched again). Only a hint: where the OS does not take it, nothing changes.
fn release(map: &memmap2::Mmap, offset: usize, len: usize) {
    #[cfg(unix)]
    // SAFETY: the map is a read-only mapping of a file; MADV_DONTNEED on it discards no data (a
    // later access reads the file again), and no reference into the range is used afterwards.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    #[cfg(not(unix))]
    let _ = (map, offset, len);
}

/// The arrays of sample `i` a cache file holds, with their tensor names: the one list [`write`]
/// stores, [`read`] checks the file's tensor count against, and [`data_bytes`] sizes.
fn named_arrays(i: usize, s: &SlowSample<f32>) -> Vec<(String, &Array2<f32>)> {
    let mut named = Vec::new();
    for (j, start) in s.starts.iter().enumerate() {
        named.extend(start.as_ref().map(|a| (format!("{i}.start.{j}"), a)));
    }
    for (l, kv) in s.kv.iter().enumerate() {
        if let Some((k, v)) = kv {
            named.push((format!("{i}.k.{l}"), k));
            named.push((format!("{i}.v.{l}"), v));
        }
    }
    named.push((format!("{i}.last"), &s.last));
    for (j, kept) in s.aligned.iter().enumerate() {
        for (n, a) in kept.iter().flatten().enumerate() {
            named.push((format!("{i}.aligned.{j}.{n}"), a));
        }
    }
    named
}

/// Bytes a cache of `samples` takes on disk (the tensors' data; the header adds a few hundred
/// bytes per sample).
pub fn data_bytes(samples: &[SlowSample<f32>]) -> u64 {
    samples
        .iter()
        .enumerate()
        .flat_map(|(i, s)| named_arrays(i, s))
        .map(|(_, a)| (a.len() * 4) as u64)
        .sum()
}

/// Where a data set's slow stream comes from: computed sample by sample (`on_sample(i)` after each
/// computed sample) and, with a `cache` folder, read from the file for its key when there is one,
/// else written there once computed.
#[derive(Default)]
pub struct SlowPass<'a> {
    pub cache: Option<&'a Path>,
    pub on_sample: Option<&'a mut dyn FnMut(usize)>,
    /// The sample counts of the data's folders, in order, for the next [`run`](Self::run) (which
    /// takes them): one cache file each. Empty: the data is one part.
    pub parts: Vec<usize>,
    /// Set by the pass: what it did with the cache, one entry per file.
    pub used: Vec<CacheUse>,
}

/// What a [`SlowPass`] did with its cache folder.
#[derive(Debug)]
pub enum CacheUse {
    /// Read instead of computed.
    Read(PathBuf),
    /// Computed, then written (bytes of tensor data).
    Written(PathBuf, u64),
    /// Computed, and the cache could not be written (the run goes on; the message says why).
    NotWritten(PathBuf, String),
}

impl<'a> SlowPass<'a> {
    /// A pass that reports each computed sample to `on_sample` and uses `cache` when given.
    pub fn new(cache: Option<&'a Path>, on_sample: &'a mut dyn FnMut(usize)) -> Self {
        SlowPass {
            cache,
            on_sample: Some(on_sample),
            ..SlowPass::default()
        }
    }

    /// The slow stream of `key`'s data: read from the cache, or computed (and cached), one file
    /// per part ([`parts`](Self::parts)); from each part on, the longest run of consecutive parts
    /// that has a file of its own (all of them: the whole set) is read from it instead.
    ///
    /// # Panics
    /// If the parts do not add up to the data's sample count.
    pub fn run(&mut self, key: &SlowKey) -> Result<Vec<SlowSample<f32>>> {
        let parts = std::mem::take(&mut self.parts);
        let Some(dir) = self.cache else {
            return self.compute(key, 0);
        };
        if parts.len() <= 1 {
            return self.run_file(dir.join(key.file_name()), dir, key, 0);
        }
        assert_eq!(
            parts.iter().sum::<usize>(),
            key.data.len(),
            "parts of the data"
        );
        // starts[i]: the first sample of part i; starts[n]: the end
        let starts: Vec<usize> = std::iter::once(0)
            .chain(parts.iter().scan(0, |end, n| {
                *end += n;
                Some(*end)
            }))
            .collect();
        let group = |i: usize, j: usize| SlowKey {
            data: &key.data[starts[i]..starts[j]],
            ..*key
        };
        let settings = key.settings_hash();
        let file = |i: usize, j: usize| dir.join(group(i, j).file_name_after(settings.clone()));
        let mut samples = Vec::with_capacity(key.data.len());
        let mut i = 0;
        while i < parts.len() {
            let j = (i + 2..=parts.len())
                .rev()
                .find(|&j| file(i, j).exists())
                .unwrap_or(i + 1);
            samples.extend(self.run_file(file(i, j), dir, &group(i, j), starts[i])?);
            i = j;
        }
        Ok(samples)
    }

    /// The slow stream of `key`'s data through `file`, its cache file in `dir` (the data's first
    /// sample is sample `offset` of the whole set, for `on_sample`).
    fn run_file(
        &mut self,
        file: PathBuf,
        dir: &Path,
        key: &SlowKey,
        offset: usize,
    ) -> Result<Vec<SlowSample<f32>>> {
        if file.exists() {
            let samples = read(&file, key)?;
            self.used.push(CacheUse::Read(file));
            return Ok(samples);
        }
        let samples = self.compute(key, offset)?;
        let made = std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(dir, e))
            .and_then(|()| write(&file, &samples));
        self.used.push(match made {
            Ok(()) => CacheUse::Written(file, data_bytes(&samples)),
            Err(e) => CacheUse::NotWritten(file, e.to_string()),
        });
        Ok(samples)
    }

    /// The base model's pass over every sample of `key`'s data (sample `offset + i` of the whole
    /// set for `on_sample`).
    fn compute(&mut self, key: &SlowKey, offset: usize) -> Result<Vec<SlowSample<f32>>> {
        key.data
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let s = SlowSample::compute_with(
                    key.model,
                    key.config,
                    &d.tokens,
                    d.first_row(),
                    key.intervals,
                    key.keep_aligned,
                );
                if let Some(f) = self.on_sample.as_mut() {
                    f(offset + i);
                }
                s
            })
            .collect()
    }
}
