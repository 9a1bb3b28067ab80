//! File names that a file inside a folder gives for its siblings (a sharded checkpoint's
//! `weight_map`, an export manifest's `graphs` and `draft_head_file`): each must be one plain name
//! in that folder. `../x`, `/etc/x`, `sub/x` or an empty name would make a loader read outside the
//! folder the user pointed at (or a directory), so they are refused, naming the field.

use std::path::{Component, Path, PathBuf};

/// `dir/name` when `name` is a single normal path component; otherwise why it is not.
pub fn sibling(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let mut components = Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(only)), None) if only == name => Ok(dir.join(name)),
        _ => Err(format!(
            "`{name}` is not a file name in the folder (no directories, `..`, or absolute paths)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_in_the_folder() {
        let dir = Path::new("/models/m");
        assert_eq!(
            sibling(dir, "model-00001-of-00002.safetensors").unwrap(),
            dir.join("model-00001-of-00002.safetensors")
        );
        assert_eq!(sibling(dir, "draft.onnx").unwrap(), dir.join("draft.onnx"));
        for bad in [
            "",
            ".",
            "..",
            "../x.onnx",
            "/etc/passwd",
            "sub/x.onnx",
            "x/..",
            "./x.onnx",
            "x.onnx/",
        ] {
            let err = sibling(dir, bad).unwrap_err();
            assert!(err.contains("not a file name"), "{bad:?}: {err}");
        }
    }
}
