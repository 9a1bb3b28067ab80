//! Shared helpers of the cross-crate tests: where the fixtures are, how to read the tensors and JSON
//! that the Python generators in `scripts/fixtures/` wrote, and one llm.c-style comparison line per
//! tensor ("OK" / "NOT OK" with the max abs difference) printed before any assertion.

pub mod decode_problem;
pub mod hostile;
/// Sabotaged copies of an export folder (one initializer of one graph scaled or a column zeroed).
pub mod sabotage;
pub use decode_problem::{DecodeProblem, DraftSettings, draft_length_strategy, small_config};

use ndarray::{Array2, ArrayView2};
use reference::golden::{TensorCheck, compare};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// `tests/fixtures/` of this crate (independent of the working directory `cargo test` runs in).
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A fixture file's bytes.
///
/// # Panics
/// If the file cannot be read; the message names it and the script that makes it.
pub fn read_fixture(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with the scripts in scripts/fixtures/, see scripts/fixtures/README.md)",
            path.display()
        )
    })
}

/// A checkpoint's tensors as (HF name, shape, f32 values), in name order.
pub type NamedTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Every tensor of the HF checkpoint folder `dir` (`model.safetensors` or its shards), to edit
/// and write back with `reference::io::checkpoint::write_f32_safetensors`.
pub fn checkpoint_tensors(dir: &Path) -> NamedTensors {
    use reference::base::weights::TensorSource;
    let src = reference::io::checkpoint::SafetensorsSource::open_dir(dir).unwrap();
    src.names()
        .into_iter()
        .map(|n| {
            let t = src.read(&n).unwrap().unwrap();
            (n, t.shape, t.data)
        })
        .collect()
}

/// A fixture JSON document.
pub fn read_json(path: &Path) -> serde_json::Value {
    let bytes = read_fixture(path);
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{}: not valid JSON: {e}", path.display()))
}

/// The tensors of one safetensors fixture, kept in memory.
pub struct Tensors {
    label: String,
    bytes: Vec<u8>,
}

impl Tensors {
    pub fn open(path: &Path) -> Self {
        Tensors {
            label: path.display().to_string(),
            bytes: read_fixture(path),
        }
    }

    /// Shape and a copy of the little-endian bytes of tensor `name`, which must have `dtype`.
    fn raw(&self, name: &str, dtype: Dtype) -> (Vec<usize>, Vec<u8>) {
        let st =
            SafeTensors::deserialize(&self.bytes).unwrap_or_else(|e| panic!("{}: {e}", self.label));
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: tensor `{name}`: {e}", self.label));
        assert_eq!(t.dtype(), dtype, "{}: tensor `{name}` dtype", self.label);
        (t.shape().to_vec(), t.data().to_vec())
    }

    /// An F32 tensor of rank 2.
    ///
    /// # Shapes
    /// -> `[rows, cols]` as stored
    pub fn f32_2d(&self, name: &str) -> Array2<f32> {
        let (shape, data) = self.raw(name, Dtype::F32);
        assert_eq!(
            shape.len(),
            2,
            "{}: tensor `{name}` has shape {shape:?}, expected rank 2",
            self.label
        );
        let values: Vec<f32> = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        Array2::from_shape_vec((shape[0], shape[1]), values).expect("shape matches data")
    }

    /// An F32 tensor of any rank, flattened in row-major order.
    pub fn f32_flat(&self, name: &str) -> Vec<f32> {
        let (_, data) = self.raw(name, Dtype::F32);
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    }

    /// An I64 tensor of any rank, flattened in row-major order.
    pub fn i64_flat(&self, name: &str) -> Vec<i64> {
        let (_, data) = self.raw(name, Dtype::I64);
        data.chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect()
    }

    /// An I64 tensor of rank 1 holding token ids.
    pub fn token_ids(&self, name: &str) -> Vec<u32> {
        self.i64_flat(name)
            .iter()
            .map(|&t| {
                u32::try_from(t).unwrap_or_else(|_| panic!("{}: `{name}` holds {t}", self.label))
            })
            .collect()
    }
}

/// Compare `got` to `want` elementwise and print one line, llm.c style:
/// `OK     <name>  max abs diff 1.2e-6 (atol 1e-4)` or `NOT OK ...` with where the worst element is.
/// Returns the check so that the caller asserts after every line has been printed.
pub fn check_close(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    atol: f32,
) -> TensorCheck {
    let check = compare(name, want, got, atol);
    let status = if check.ok { "OK    " } else { "NOT OK" };
    println!(
        "{status} {name:<44} max abs diff {:.3e} at {:?} (atol {atol:e}) {}",
        check.max_abs,
        check.at,
        if want.shape() == got.shape() {
            String::new()
        } else {
            check.note.clone()
        }
    );
    check
}

/// Panic with the names of every failed check (after all lines were printed).
pub fn assert_all_ok(checks: &[TensorCheck]) {
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| {
            format!(
                "{} (max abs diff {:.3e} at {:?}; {})",
                c.name, c.max_abs, c.at, c.note
            )
        })
        .collect();
    assert!(failed.is_empty(), "NOT OK: {}", failed.join(", "));
}
