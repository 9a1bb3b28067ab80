//! The three kinds of folder a user hands to `m2r2`, told apart by the file each one holds: a
//! Hugging Face checkpoint (`--model DIR`), M2R2 weights (`--m2r2 DIR`) and an ONNX export
//! (`run --onnx DIR`). A folder given in the wrong place is refused with what it is and where it
//! goes, not with "file not found".

use std::path::Path;

/// The config of a Hugging Face checkpoint folder.
pub const HF_CONFIG_FILE: &str = "config.json";
/// The M2R2 settings of an M2R2 weights folder (`m2r2::config`).
pub const M2R2_CONFIG_FILE: &str = "m2r2_config.json";
/// The manifest of a finished ONNX export (`export`, `onnx_runner::manifest`).
pub const EXPORT_MANIFEST_FILE: &str = "m2r2_export.json";

/// What kind of folder `dir` is and which flag takes it, or `None` when it holds none of the three
/// files.
pub fn describe(dir: &Path) -> Option<String> {
    let shown = dir.display();
    if dir.join(EXPORT_MANIFEST_FILE).is_file() {
        Some(format!(
            "{shown} is an m2r2 ONNX export ({EXPORT_MANIFEST_FILE}): decode it with `m2r2 run --onnx {shown}`"
        ))
    } else if dir.join(M2R2_CONFIG_FILE).is_file() {
        Some(format!(
            "{shown} is an M2R2 weights folder ({M2R2_CONFIG_FILE}): pass it as `--m2r2 {shown}`"
        ))
    } else if dir.join(HF_CONFIG_FILE).is_file() {
        Some(format!(
            "{shown} is a model checkpoint folder ({HF_CONFIG_FILE}): pass it as `--model {shown}`"
        ))
    } else {
        None
    }
}

/// `None` when folder `dir` holds `file`; else the error text for it, given where `wanted` (e.g.
/// "an M2R2 weights folder") was expected: the file it lacks and what it is instead.
pub fn lacking(dir: &Path, file: &str, wanted: &str) -> Option<String> {
    if dir.join(file).is_file() {
        return None;
    }
    let shown = dir.display();
    Some(match describe(dir) {
        Some(kind) => format!("{shown}: not {wanted} (it has no {file}); {kind}"),
        None => format!("{shown}: not {wanted} (it has no {file})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder_with(file: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file), "{}").unwrap();
        dir
    }

    #[test]
    fn each_kind_is_named_with_its_flag() {
        let export = folder_with(EXPORT_MANIFEST_FILE);
        std::fs::write(export.path().join(HF_CONFIG_FILE), "{}").unwrap();
        let text = describe(export.path()).unwrap();
        assert!(
            text.contains("ONNX export") && text.contains("run --onnx"),
            "{text}"
        );
        let weights = describe(folder_with(M2R2_CONFIG_FILE).path()).unwrap();
        assert!(weights.contains("--m2r2"), "{weights}");
        let model_dir = folder_with(HF_CONFIG_FILE);
        let model = describe(model_dir.path()).unwrap();
        assert!(model.contains("--model"), "{model}");
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(describe(empty.path()), None);
        assert_eq!(lacking(model_dir.path(), HF_CONFIG_FILE, "X"), None);
        assert_eq!(
            lacking(empty.path(), HF_CONFIG_FILE, "X"),
            Some(format!(
                "{}: not X (it has no config.json)",
                empty.path().display()
            ))
        );
    }
}
