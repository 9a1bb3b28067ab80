//! Hugging Face checkpoint folders: `config.json` plus `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. f32, f16 and bf16 tensors are converted to f32. Mixtral experts
//! are read in transformers 4's per-expert layout or transformers 5's fused one ([`fused_experts`]).

use crate::base::config::{Architecture, ModelConfig};
use crate::base::model::Model;
use crate::base::weight_names::{WeightId, check_tensor_count};
use crate::base::weights::{RawTensor, TensorSource, Weights};
use crate::error::{Error, Result};
use crate::io::{fused_experts, tied_head};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Load a HF checkpoint folder as a [`Model`].
pub fn load_hf_dir(dir: &Path) -> Result<Model> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
    let config = ModelConfig::from_hf_json(&text, &config_path.display().to_string())?;
    let mut source = SafetensorsSource::open_dir(dir)?;
    source.unfuse_experts(&config)?;
    let missing = |id: WeightId| {
        let name = id.hf_name();
        (!source.entries.contains_key(&name)).then_some(name)
    };
    let label = config_path.display().to_string();
    check_tensor_count(&config, source.entries.len(), &label, &missing)?;
    check_all_used(&config, &source, &label)?;
    if let Some(warning) = tied_head::check_tied_head(&config, &source, &label)? {
        eprintln!("{warning}");
    }
    let weights = Weights::load(&config, &source)?;
    Ok(Model::new(config, weights))
}

/// Refuse tensors the config does not call for (more layers than `num_hidden_layers`, biases with
/// `attention_bias` false, ...): the weights were saved for another config, and running without
/// them would be another model than the one saved. A rotary embedding's `inv_freq` buffer (older
/// checkpoints) and `lm_head.weight` beside tied embeddings ([`tied_head`]) are not weights. The
/// message suggests the config's settings that decide which tensors there are.
fn check_all_used(config: &ModelConfig, source: &SafetensorsSource, label: &str) -> Result<()> {
    let used: std::collections::HashSet<String> = WeightId::all(config)
        .iter()
        .map(|id| id.hf_name())
        .collect();
    let not_weights = |name: &str| {
        name.ends_with("rotary_emb.inv_freq")
            || (name == "lm_head.weight" && config.tie_word_embeddings)
    };
    let unused: Vec<String> = source
        .names()
        .into_iter()
        .filter(|n| !used.contains(n) && !not_weights(n))
        .collect();
    match unused.first() {
        None => Ok(()),
        Some(first) => Err(Error::config(
            label,
            format!(
                "the weights hold {} tensor(s) this config does not use, the first `{first}` (in \
                 {}): they were saved for another config ({}?), and leaving them out would run \
                 another model",
                unused.len(),
                source.file_of(first),
                tensor_settings(config)
            ),
        )),
    }
}

/// The config's settings that decide which tensors a checkpoint has, as the config names them:
/// the layer count, the expert count of a MoE config, and the bias switches of llama (the other
/// architectures refuse them, `hf_config`).
fn tensor_settings(config: &ModelConfig) -> String {
    let mut settings = vec![format!("num_hidden_layers = {}", config.num_hidden_layers)];
    if let Some(moe) = &config.moe {
        settings.push(format!("num_local_experts = {}", moe.num_local_experts));
    }
    if config.architecture == Architecture::Llama {
        settings.push(format!("attention_bias = {}", config.o_bias));
        settings.push(format!("mlp_bias = {}", config.mlp_bias));
    }
    settings.join(", ")
}

/// Where one tensor's bytes are.
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the file.
    start: usize,
    end: usize,
    /// The fused tensor this one is a piece of ([`fused_experts`]), for error messages.
    fused: Option<String>,
}

/// The tensors of one or more safetensors files, read whole into memory.
pub struct SafetensorsSource {
    files: Vec<(PathBuf, Vec<u8>)>,
    entries: HashMap<String, Entry>,
}

impl SafetensorsSource {
    /// `model.safetensors`, or else the shards named by `model.safetensors.index.json`: the
    /// order transformers' `from_pretrained` looks in (`save_pretrained` over an earlier sharded
    /// save leaves the old index beside the new single file).
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            shard_files(&index)?
        } else if single.exists() {
            return Err(Error::Invalid(format!(
                "{}: not a safetensors file ({})",
                single.display(),
                if single.is_dir() {
                    "a directory"
                } else {
                    "not a regular file"
                }
            )));
        } else {
            return Err(Error::Invalid(format!(
                "{}: no model.safetensors or model.safetensors.index.json",
                dir.display()
            )));
        };
        Self::open_files(&files)
    }

    /// The given safetensors files; a tensor name may appear in only one of them.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut src = SafetensorsSource {
            files: Vec::new(),
            entries: HashMap::new(),
        };
        for path in paths {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            let label = path.display().to_string();
            // Validates the header and that every tensor lies inside the file.
            SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&label, e.to_string()))?;
            let (header_len, metadata) = SafeTensors::read_metadata(&bytes)
                .map_err(|e| Error::format(&label, e.to_string()))?;
            let data_start = 8 + header_len;
            for (name, info) in metadata.tensors() {
                if src.entries.contains_key(&name) {
                    return Err(Error::format(
                        &label,
                        format!("tensor `{name}` appears in two shards"),
                    ));
                }
                let entry = Entry {
                    file: src.files.len(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + info.data_offsets.0,
                    end: data_start + info.data_offsets.1,
                    fused: None,
                };
                src.entries.insert(name, entry);
            }
            src.files.push((path.clone(), bytes));
        }
        Ok(src)
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.keys().cloned().collect();
        names.sort();
        names
    }

    /// Serve the Mixtral layers saved in transformers 5's fused expert layout under the
    /// per-expert names of transformers 4 ([`fused_experts`]): each expert matrix a byte range of
    /// its fused tensor. The fused tensors are then gone from [`SafetensorsSource::names`], used.
    fn unfuse_experts(&mut self, config: &ModelConfig) -> Result<()> {
        let shape = |name: &str| self.entries.get(name).map(|e| e.shape.clone());
        let pieces =
            fused_experts::pieces(config, &self.names(), shape, |name| self.file_of(name))?;
        for p in &pieces {
            let fused = &self.entries[&p.fused];
            let size = (fused.end - fused.start) / p.count;
            let start = fused.start + p.index * size;
            let entry = Entry {
                file: fused.file,
                dtype: fused.dtype,
                shape: p.id.shape(config),
                start,
                end: start + size,
                fused: Some(p.fused.clone()),
            };
            self.entries.insert(p.id.hf_name(), entry);
        }
        for p in &pieces {
            self.entries.remove(&p.fused);
        }
        Ok(())
    }
}

/// Shard files listed in an index's `weight_map`, in first-mention order.
fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let label = index.display().to_string();
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::format(&label, format!("not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::format(&label, "missing object `weight_map`"))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::format(
                &label,
                format!("weight_map entry of `{tensor}` is not a file name"),
            )
        })?;
        let path = super::file_name::sibling(dir, file)
            .map_err(|e| Error::format(&label, format!("weight_map entry of `{tensor}`: {e}")))?;
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

impl TensorSource for SafetensorsSource {
    fn file_of(&self, name: &str) -> String {
        match self.entries.get(name) {
            Some(Entry {
                file,
                fused: Some(fused),
                ..
            }) => format!("{} (in `{fused}`)", self.files[*file].0.display()),
            Some(e) => self.files[e.file].0.display().to_string(),
            None => match self.files.as_slice() {
                [(only, _)] => only.display().to_string(),
                _ => "checkpoint shards".into(),
            },
        }
    }

    fn read(&self, name: &str) -> Result<Option<RawTensor>> {
        let Some(e) = self.entries.get(name) else {
            return Ok(None);
        };
        let bytes = &self.files[e.file].1[e.start..e.end];
        let data: Vec<f32> = match e.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(Error::UnsupportedDtype {
                    file: self.file_of(name),
                    tensor: name.into(),
                    dtype: format!("{other:?} (supported: F32, F16, BF16)"),
                });
            }
        };
        Ok(Some(RawTensor {
            shape: e.shape.clone(),
            data,
        }))
    }
}

/// Write tensors as an f32 safetensors file (used for fixtures, goldens and tests).
pub fn write_f32_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, data)| data.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), b)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::format(path.display().to_string(), e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    write_safetensors(views, metadata, path)
}

/// `safetensors::serialize_to_file` with its errors named by `path` (a missing folder is said
/// before anything is written: the crate's own message names its temporary file), and the file
/// a plain `File::create` would write: through a symbolic link (`write_target`), with an
/// existing file's mode, else `0666` less the umask.
///
/// safetensors 0.8 writes through a temporary file, which `tempfile` creates with mode `0600`,
/// and renames it into place, so goldens, M2R2 weights and logits would be readable by their
/// writer only. The mode is taken from a placeholder created at `path` with
/// `create_new` (what the umask makes of a new file), or from the file already there.
pub fn write_safetensors<S, V, I>(
    views: I,
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<()>
where
    S: AsRef<str> + Ord + std::fmt::Display,
    V: safetensors::View,
    I: IntoIterator<Item = (S, V)>,
{
    let target = write_target(path)?;
    let path = target.as_path();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        let missing = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("folder {} does not exist", parent.display()),
        );
        return Err(Error::io(path, missing));
    }
    let (mode, placeholder) = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => (file.metadata().map(|m| m.permissions()).ok(), true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            (std::fs::metadata(path).map(|m| m.permissions()).ok(), false)
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    // the crate writes the metadata in its map's order, sorted once written
    let to_sort = metadata.as_ref().filter(|m| m.len() > 1).cloned();
    let written = safetensors::serialize_to_file(views, metadata, path)
        .map_err(|e| match e {
            // a folder, a full disk: an I/O error, not a corrupt file
            safetensors::SafeTensorError::IoError(io) => Error::io(path, io),
            other => Error::format(path.display().to_string(), other.to_string()),
        })
        .and_then(|()| to_sort.map_or(Ok(()), |m| sort_metadata(path, &m)));
    match (written, mode) {
        (Ok(()), Some(mode)) => {
            std::fs::set_permissions(path, mode).map_err(|e| Error::io(path, e))
        }
        (Ok(()), None) => Ok(()),
        (Err(e), _) => {
            if placeholder {
                let _ = std::fs::remove_file(path);
            }
            Err(e)
        }
    }
}

/// The file a write to `path` replaces: `path` itself, or the file a symbolic link there points
/// to (the link stays a link, as `File::create` leaves it). The write goes to a temporary file
/// renamed over the target, which would replace a link, a FIFO or a device with a regular file:
/// a link is followed, and anything but a regular file (or nothing) at the end is refused.
fn write_target(path: &Path) -> Result<PathBuf> {
    let refuse = |what: String| {
        Error::io(
            path,
            std::io::Error::other(format!(
                "{what}: a safetensors file is written whole into a regular file (write it to a \
                 file, then copy it)"
            )),
        )
    };
    let linked = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let target = if linked {
        std::fs::canonicalize(path)
            .map_err(|_| refuse("it is a symbolic link to nothing".to_string()))?
    } else {
        path.to_path_buf()
    };
    match std::fs::metadata(&target) {
        Ok(m) if !m.is_file() => Err(refuse(match (linked, m.is_dir()) {
            (true, _) => format!(
                "it links to {}, which is not a regular file",
                target.display()
            ),
            (false, true) => "it is a directory".to_string(),
            (false, false) => "it is not a regular file (a FIFO or a device)".to_string(),
        })),
        _ => Ok(target),
    }
}

/// Rewrite the header of the safetensors file at `path`, just written with `metadata`, with the
/// metadata's keys in sorted order, so that the same tensors and metadata always give the same
/// bytes (goldens are committed to repositories: a file should change only when its content
/// does). safetensors 0.8 takes the metadata as a `HashMap` and writes it in the map's iteration
/// order, which differs from one map to the next. Its header is `{"__metadata__":{...},...}`, the
/// metadata first; the same entries sorted serialise to as many bytes, so they fill the same span
/// and every tensor offset stays valid. The span must read back as `metadata` before it is
/// overwritten: another layout is an error, never a corrupt file.
fn sort_metadata(path: &Path, metadata: &HashMap<String, String>) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    const PREFIX: &[u8] = b"{\"__metadata__\":";
    let label = || path.display().to_string();
    let io = |e| Error::io(path, e);
    let sorted: std::collections::BTreeMap<_, _> = metadata.iter().collect();
    let sorted = serde_json::to_vec(&sorted).map_err(|e| Error::format(label(), e.to_string()))?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    // 8 bytes of header length, the prefix, then the metadata as written
    let start = 8 + PREFIX.len();
    let mut head = vec![0; start + sorted.len()];
    file.read_exact(&mut head).map_err(io)?;
    let written = serde_json::from_slice::<HashMap<String, String>>(&head[start..]).ok();
    if &head[8..start] != PREFIX || written.as_ref() != Some(metadata) {
        return Err(Error::format(
            label(),
            "the safetensors header is not laid out as expected: cannot sort its metadata",
        ));
    }
    file.seek(SeekFrom::Start(start as u64)).map_err(io)?;
    file.write_all(&sorted).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metadata is written with its keys sorted: the same tensors and metadata give the same bytes
    /// whatever the order of the map they come in, and the file reads back as written.
    #[test]
    fn metadata_is_written_in_sorted_order() {
        let dir = tempfile::tempdir().unwrap();
        // values with characters JSON escapes, and keys whose order a map would shuffle
        let pairs: Vec<(String, String)> = (0..24)
            .map(|i| (format!("key{i}"), format!("\"{i}\"\n\\ é")))
            .collect();
        let write = |name: &str| {
            let path = dir.path().join(name);
            let metadata: HashMap<String, String> = pairs.iter().cloned().collect();
            let tensors = [
                ("y".into(), vec![1], vec![3.0]),
                ("x".into(), vec![2], vec![1.0, 2.0]),
            ];
            write_f32_safetensors(&path, &tensors, Some(metadata)).unwrap();
            std::fs::read(path).unwrap()
        };
        let first = write("a.safetensors");
        for name in ["b.safetensors", "c.safetensors", "d.safetensors"] {
            assert_eq!(write(name), first, "{name}");
        }
        let (_, meta) = SafeTensors::read_metadata(&first).unwrap();
        let want: HashMap<String, String> = pairs.into_iter().collect();
        assert_eq!(meta.metadata().clone().unwrap(), want);
        let st = SafeTensors::deserialize(&first).unwrap();
        assert_eq!(
            st.tensor("x").unwrap().data(),
            &[0, 0, 128, 63, 0, 0, 0, 64]
        );
        let header = String::from_utf8_lossy(&first[8..]);
        let at = |key: &str| header.find(&format!("\"{key}\"")).unwrap();
        assert!(at("key0") < at("key1") && at("key1") < at("key10") && at("key9") < at("y"));
    }

    fn write_one(path: &Path) -> Result<()> {
        write_f32_safetensors(path, &[("x".into(), vec![2], vec![1.0, 2.0])], None)
    }

    /// A new file gets the mode a plain `File::create` gives (not safetensors' temporary 0600),
    /// an existing file keeps its own, and a missing folder is named.
    #[cfg(unix)]
    #[test]
    fn written_files_get_the_mode_of_a_plain_create() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let plain = dir.path().join("plain");
        std::fs::File::create(&plain).unwrap();
        let path = dir.path().join("x.safetensors");
        write_one(&path).unwrap();
        assert_eq!(mode(&path), mode(&plain));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_one(&path).unwrap();
        assert_eq!(mode(&path), 0o640);
        let err = write_one(&dir.path().join("no/x.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("folder") && err.contains("does not exist"),
            "{err}"
        );
    }

    /// A view whose shape holds 3 values over the bytes of 2, which safetensors refuses.
    struct Short;

    impl safetensors::View for Short {
        fn dtype(&self) -> Dtype {
            Dtype::F32
        }
        fn shape(&self) -> &[usize] {
            &[3]
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            std::borrow::Cow::Owned(vec![0; 8])
        }
        fn data_len(&self) -> usize {
            8
        }
    }

    /// A write safetensors refuses leaves neither the file nor its placeholder behind.
    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        let err = write_safetensors([("x", Short)], None, &path).unwrap_err();
        assert!(err.to_string().contains("bad.safetensors"), "{err}");
        assert!(!path.exists());
    }

    /// A write through a symbolic link writes the file it points to and leaves the link; a FIFO, a
    /// folder or a link to one is refused and left as it was (the temporary file renamed over
    /// them would have replaced them with a regular file).
    #[cfg(unix)]
    #[test]
    fn links_are_followed_and_other_nodes_refused() {
        use std::os::unix::fs::{FileTypeExt, symlink};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("target.safetensors");
        std::fs::write(&file, b"old").unwrap();
        let link = dir.path().join("link.safetensors");
        symlink(&file, &link).unwrap();
        write_one(&link).unwrap();
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        let written = std::fs::read(&file).unwrap();
        SafeTensors::deserialize(&written).unwrap();

        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        let to_fifo = dir.path().join("to-fifo");
        symlink(&fifo, &to_fifo).unwrap();
        let dangling = dir.path().join("dangling");
        symlink(dir.path().join("nothing"), &dangling).unwrap();
        for (path, why) in [
            (&fifo, "not a regular file"),
            (&folder, "it is a directory"),
            (&to_fifo, "which is not a regular file"),
            (&dangling, "a symbolic link to nothing"),
        ] {
            let err = write_one(path).unwrap_err().to_string();
            assert!(
                err.contains(why) && err.contains(&*path.to_string_lossy()),
                "{err}"
            );
        }
        assert!(fifo.metadata().unwrap().file_type().is_fifo());
        assert!(folder.is_dir());
        assert!(to_fifo.symlink_metadata().unwrap().file_type().is_symlink());
    }

    /// A folder whose `model.safetensors` is a directory is told so, not that the file is missing.
    #[test]
    fn a_directory_named_model_safetensors_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = |dir: &Path| SafetensorsSource::open_dir(dir).err().unwrap().to_string();
        assert!(
            err(dir.path()).ends_with("no model.safetensors or model.safetensors.index.json"),
            "{}",
            err(dir.path())
        );
        std::fs::create_dir(dir.path().join("model.safetensors")).unwrap();
        let e = err(dir.path());
        assert!(
            e.ends_with("model.safetensors: not a safetensors file (a directory)"),
            "{e}"
        );
    }
}
