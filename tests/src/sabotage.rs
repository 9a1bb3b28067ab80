//! Sabotaged copies of an export folder, for tests that a golden check catches a broken graph:
//! the folder is copied (files hard-linked where possible), then one graph is rewritten with one
//! initializer altered (scaled, or one column of a 2-D weight set to zero).
//!
//! The source folder is never written: a hard-linked graph is replaced by a new file (written beside
//! it, then renamed over the link), and an altered initializer that lived in `<graph>.onnx.data` is
//! written inline into the new graph (its `external_data` cleared), so the shared data file stays as
//! it was.
//!
//! Initializers of ONNX data type 1 (f32) and 10 (f16) are handled, whether stored in `raw_data`,
//! in the typed fields (`float_data`; f16 bit patterns in `int32_data`) or as external data.

use export::proto::tensor_proto::{DataLocation, DataType};
use export::proto::{ModelProto, TensorProto};
use half::f16;
use prost::Message;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How to alter an initializer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sabotage {
    /// Multiply every value by the factor (f16 values are rounded back to f16).
    Scale(f32),
    /// Set column `c` of a 2-D weight `[rows, cols]` to zero: `w[r, c] = 0` for every row `r`.
    ZeroColumn(usize),
}

/// One sabotage of one graph of an export folder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Target {
    /// The graph file, e.g. `verifier.onnx`.
    pub graph: &'static str,
    pub initializer: &'static str,
    pub how: Sabotage,
}

/// Sabotages of `m2r2 export --model tiny` (f32 or f16, inline or external data), one per graph a
/// deployment runs, each moving its graph's outputs far past tolerance (max |diff| measured with
/// `export::check::check_folder` on its probe, f32):
/// - `model.onnx`: the final norm scaled by 1.05, so `logits` are exactly 1.05 times the golden's
///   (max |diff| 2.3) and every argmax, hence every greedy token, is kept;
/// - `verifier.onnx`: column 3 of the last layer's `down_proj` (`[hidden, intermediate]`) zeroed:
///   verifier `logits` off by 0.78; `model.onnx` and `draft.onnx` untouched;
/// - `draft.onnx`: column 3 of an accelerator adapter's `lora_B` (`[hidden, rank]`, the fast stream
///   only) zeroed: `draft_logits` off by 1.2, `exit_prob` by 0.04, `hidden_states` (the slow stream
///   the verifier reads) untouched, so speculative tokens stay the same.
pub const TINY_TARGETS: [Target; 3] = [
    Target {
        graph: "model.onnx",
        initializer: "model.norm.weight",
        how: Sabotage::Scale(1.05),
    },
    Target {
        graph: "verifier.onnx",
        initializer: "model.layers.7.mlp.down_proj.weight",
        how: Sabotage::ZeroColumn(3),
    },
    Target {
        graph: "draft.onnx",
        initializer: "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight",
        how: Sabotage::ZeroColumn(3),
    },
];

/// The same three sabotages for `m2r2 export --model smollm2` (shipped M2R2 weights, draft gate 1:
/// draft layers 0..2, verifier layers 2..30):
/// - `model.onnx`: final norm x 1.05 (`logits` off by 1.6 with the earlier weights, argmaxes kept);
/// - `verifier.onnx`: column 3 of the first verifier layer's `o_proj` (`[576, 576]`) zeroed;
/// - `draft.onnx`: column 0 of layer 1's `down_proj` adapter `lora_B` (`[576, 16]`) zeroed, the
///   last layer of the draft gate's interval.
///
/// `five_sabotages_on_smollm2` checks that each is caught in the tensor it changes and only there.
pub const SMOLLM2_TARGETS: [Target; 3] = [
    Target {
        graph: "model.onnx",
        initializer: "model.norm.weight",
        how: Sabotage::Scale(1.05),
    },
    Target {
        graph: "verifier.onnx",
        initializer: "model.layers.2.self_attn.o_proj.weight",
        how: Sabotage::ZeroColumn(3),
    },
    Target {
        graph: "draft.onnx",
        initializer: "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight",
        how: Sabotage::ZeroColumn(0),
    },
];

/// What [`sabotage_export`] altered.
#[derive(Clone, Debug, PartialEq)]
pub struct Sabotaged {
    /// The graph file rewritten, e.g. `verifier.onnx`.
    pub graph: String,
    /// The initializer altered.
    pub initializer: String,
    /// Its dims, as stored.
    pub dims: Vec<i64>,
    /// `f32` or `f16`.
    pub dtype: String,
    /// How many values differ from the original (a zero stays zero, so this can be below the
    /// number of values touched).
    pub changed_values: usize,
}

/// Name, dims and ONNX `data_type` of every initializer of the graph file `graph`, in file order.
pub fn initializers(graph: &Path) -> Result<Vec<(String, Vec<i64>, i32)>, String> {
    let model = read(graph)?;
    Ok(model
        .graph
        .iter()
        .flat_map(|g| &g.initializer)
        .map(|t| {
            (
                t.name.clone().unwrap_or_default(),
                t.dims.clone(),
                t.data_type.unwrap_or(0),
            )
        })
        .collect())
}

/// Copy the export folder `src` into `dst` (hard-link files where possible, else copy; sub-folders
/// too), then rewrite `dst/<graph>` with the initializer `initializer` altered as `how` says.
///
/// `dst` must not exist or be an empty folder. The source folder is left untouched byte for byte.
pub fn sabotage_export(
    src: &Path,
    dst: &Path,
    graph: &str,
    initializer: &str,
    how: Sabotage,
) -> Result<Sabotaged, String> {
    if graph.is_empty() || Path::new(graph).file_name() != Some(graph.as_ref()) {
        return Err(format!(
            "graph `{graph}` is not a file name in the export folder {}",
            src.display()
        ));
    }
    if !src.join(graph).is_file() {
        return Err(format!(
            "graph `{graph}` does not exist in the export folder {}",
            src.display()
        ));
    }
    // Altered in memory from the source (external data read there), then written into the copy.
    let path = src.join(graph);
    let mut model = read(&path)?;
    let tensor = model
        .graph
        .as_mut()
        .and_then(|g| {
            g.initializer
                .iter_mut()
                .find(|t| t.name.as_deref() == Some(initializer))
        })
        .ok_or_else(|| {
            format!(
                "{}: no initializer named `{initializer}` in graph `{graph}`",
                path.display()
            )
        })?;
    let changed_values = alter(tensor, &path, how)
        .map_err(|e| format!("{}: initializer `{initializer}`: {e}", path.display()))?;
    let sabotaged = Sabotaged {
        graph: graph.to_string(),
        initializer: initializer.to_string(),
        dims: tensor.dims.clone(),
        dtype: dtype_name(tensor.data_type.unwrap_or(0)).to_string(),
        changed_values,
    };
    copy_folder(src, dst)?;
    let path = dst.join(graph);
    write_replacing(&model, &path)?;
    Ok(sabotaged)
}

/// The values of initializer `name` of the graph file `graph` as f32 (f16 widened), flattened in
/// row-major order; external data is read from beside the graph.
pub fn initializer_values(graph: &Path, name: &str) -> Result<Vec<f32>, String> {
    let model = read(graph)?;
    let tensor = model
        .graph
        .iter()
        .flat_map(|g| &g.initializer)
        .find(|t| t.name.as_deref() == Some(name))
        .ok_or_else(|| format!("{}: no initializer named `{name}`", graph.display()))?;
    let values = Values::read(tensor, graph)
        .map_err(|e| format!("{}: initializer `{name}`: {e}", graph.display()))?;
    Ok(match values {
        Values::F32(v) => v,
        Values::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
    })
}

/// An initializer's values in their stored precision.
enum Values {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Values {
    /// Decode `t` (of the graph file `graph`, for external data) whatever field holds its data.
    fn read(t: &TensorProto, graph: &Path) -> Result<Values, String> {
        let count = t.dims.iter().try_fold(1usize, |n, &d| {
            usize::try_from(d)
                .ok()
                .and_then(|d| n.checked_mul(d))
                .ok_or_else(|| format!("bad dims {:?}", t.dims))
        })?;
        let data_type = t.data_type.unwrap_or(0);
        let width = match data_type {
            x if x == DataType::Float as i32 => 4,
            x if x == DataType::Float16 as i32 => 2,
            x => {
                return Err(format!(
                    "data_type {x} ({}) is neither f32 (1) nor f16 (10)",
                    dtype_name(x)
                ));
            }
        };
        let external = t.data_location == Some(DataLocation::External as i32);
        let bytes = if external {
            Some(external_bytes(t, graph, count * width)?)
        } else {
            t.raw_data.clone().filter(|r| !r.is_empty() || count == 0)
        };
        let values = match (bytes, width) {
            (Some(b), _) if b.len() != count * width => {
                return Err(format!(
                    "{} data bytes for dims {:?} of {width}-byte values",
                    b.len(),
                    t.dims
                ));
            }
            (Some(b), 4) => Values::F32(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect(),
            ),
            (Some(b), _) => Values::F16(
                b.chunks_exact(2)
                    .map(|c| f16::from_le_bytes(c.try_into().expect("2 bytes")))
                    .collect(),
            ),
            (None, 4) => Values::F32(t.float_data.clone()),
            // ONNX keeps f16 bit patterns in the low 16 bits of int32_data.
            (None, _) => Values::F16(
                t.int32_data
                    .iter()
                    .map(|&x| f16::from_bits(x as u16))
                    .collect(),
            ),
        };
        let len = match &values {
            Values::F32(v) => v.len(),
            Values::F16(v) => v.len(),
        };
        if len != count {
            return Err(format!("{len} values for dims {:?} ({count})", t.dims));
        }
        Ok(values)
    }

    /// Little-endian bytes, as `raw_data` holds them.
    fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Values::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// Alter `t` as `how` says and store it inline in `raw_data`; returns how many values changed.
fn alter(t: &mut TensorProto, graph: &Path, how: Sabotage) -> Result<usize, String> {
    let mut values = Values::read(t, graph)?;
    // The element indices to alter, and the new value of an f32 `x`.
    let (indices, f): (Vec<usize>, Box<dyn Fn(f32) -> f32>) = match how {
        Sabotage::Scale(s) => {
            let n = t.dims.iter().product::<i64>() as usize;
            ((0..n).collect(), Box::new(move |x| x * s))
        }
        Sabotage::ZeroColumn(c) => {
            let &[rows, cols] = t.dims.as_slice() else {
                return Err(format!(
                    "cannot zero column {c} of a weight of dims {:?} (not 2-D)",
                    t.dims
                ));
            };
            if c as i64 >= cols {
                return Err(format!(
                    "cannot zero column {c} of a weight of dims {:?} (columns 0..{cols})",
                    t.dims
                ));
            }
            let (rows, cols) = (rows as usize, cols as usize);
            ((0..rows).map(|r| r * cols + c).collect(), Box::new(|_| 0.0))
        }
    };
    let mut changed = 0;
    match &mut values {
        Values::F32(v) => {
            for i in indices {
                let new = f(v[i]);
                changed += usize::from(new.to_bits() != v[i].to_bits());
                v[i] = new;
            }
        }
        Values::F16(v) => {
            for i in indices {
                let new = f16::from_f32(f(v[i].to_f32()));
                changed += usize::from(new.to_bits() != v[i].to_bits());
                v[i] = new;
            }
        }
    }
    t.raw_data = Some(values.to_le_bytes());
    t.float_data.clear();
    t.int32_data.clear();
    t.external_data.clear();
    t.data_location = None;
    Ok(changed)
}

/// The bytes of an external initializer: `location` (relative to the graph's folder), `offset`
/// (default 0) and `length` (default: the tensor's size, `expected`).
fn external_bytes(t: &TensorProto, graph: &Path, expected: usize) -> Result<Vec<u8>, String> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key.as_deref() == Some(key))
            .and_then(|e| e.value.clone())
    };
    let location = entry("location").ok_or("external data without a `location` entry")?;
    let number = |key: &str, default: usize| -> Result<usize, String> {
        entry(key).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("external data `{key}` is `{v}`, not a number"))
        })
    };
    let offset = number("offset", 0)?;
    let length = number("length", expected)?;
    let file = graph.parent().unwrap_or(Path::new(".")).join(&location);
    let io =
        |e: std::io::Error| format!("{}: bytes {offset}..{offset}+{length}: {e}", file.display());
    let mut f = std::fs::File::open(&file).map_err(io)?;
    f.seek(SeekFrom::Start(offset as u64)).map_err(io)?;
    let mut bytes = vec![0u8; length];
    f.read_exact(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// Copy `src` into `dst` file by file (hard links where the file system allows), sub-folders too.
/// `dst` must not exist or be empty, so that no copy writes through an existing link.
fn copy_folder(src: &Path, dst: &Path) -> Result<(), String> {
    let canonical =
        |p: &Path| std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()));
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if parent.exists() && canonical(parent)?.starts_with(canonical(src)?) {
        return Err(format!(
            "{}: the sabotaged copy cannot be inside the export folder {}",
            dst.display(),
            src.display()
        ));
    }
    if dst.exists() {
        let mut entries = std::fs::read_dir(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
        if entries.next().is_some() {
            return Err(format!(
                "{}: the sabotaged copy's folder must not exist or be empty",
                dst.display()
            ));
        }
    }
    std::fs::create_dir_all(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let entries = std::fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", src.display()))?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        if from.is_dir() {
            copy_folder(&from, &to)?;
        } else if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to)
                .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
        }
    }
    Ok(())
}

/// Decode a graph file.
fn read(path: &Path) -> Result<ModelProto, String> {
    export::write::read_graph(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Write `model` to `path` as a new file: written beside it, then renamed over it, so a hard link
/// at `path` is replaced, never written through.
fn write_replacing(model: &ModelProto, path: &Path) -> Result<(), String> {
    if model.encoded_len() >= export::write::PROTOBUF_LIMIT {
        return Err(format!(
            "{}: the graph with the altered initializer inline is {} bytes, past protobuf's limit",
            path.display(),
            model.encoded_len()
        ));
    }
    let mut temp: PathBuf = path.to_path_buf();
    temp.as_mut_os_string().push(".sabotage-tmp");
    std::fs::write(&temp, model.encode_to_vec()).map_err(|e| format!("{}: {e}", temp.display()))?;
    std::fs::rename(&temp, path).map_err(|e| {
        format!(
            "cannot rename {} to {}: {e}",
            temp.display(),
            path.display()
        )
    })
}

/// `f32`, `f16`, or the ONNX data type's name.
fn dtype_name(data_type: i32) -> &'static str {
    match DataType::try_from(data_type) {
        Ok(DataType::Float) => "f32",
        Ok(DataType::Float16) => "f16",
        Ok(other) => other.as_str_name(),
        Err(_) => "unknown",
    }
}
