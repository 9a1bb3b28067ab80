//! The per-thread scratch folders the folder loaders read: a valid folder written once, then per
//! input one file replaced by the input (and put back before the next input).

use super::Target;
use super::seeds::{Base, base};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

struct Scratch {
    dir: tempfile::TempDir,
    /// The file the last input replaced, to put back.
    replaced: Option<usize>,
}

thread_local! {
    static SCRATCH: RefCell<HashMap<&'static str, Scratch>> = RefCell::new(HashMap::new());
}

pub(super) struct Folder;

impl Folder {
    /// Run `load` on `target`'s valid folder with the file picked by `data[0]` replaced by
    /// `data[1..]`. Empty input: `false`, nothing loaded.
    pub(super) fn with(target: Target, data: &[u8], load: impl FnOnce(&Path) -> bool) -> bool {
        match data.split_first() {
            Some((&pick, content)) => Folder::with_file(target, usize::from(pick), content, load),
            None => false,
        }
    }

    /// Run `load` on `target`'s valid folder with file `pick` (modulo the count) replaced by
    /// `content`.
    pub(super) fn with_file(
        target: Target,
        pick: usize,
        content: &[u8],
        load: impl FnOnce(&Path) -> bool,
    ) -> bool {
        let base: &Base = base(target);
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let s = scratch.entry(target.name()).or_insert_with(|| {
                let dir = tempfile::tempdir().expect("a scratch folder");
                for (name, bytes) in base.files.iter().chain(&base.fixed) {
                    std::fs::write(dir.path().join(name), bytes).expect("write the valid folder");
                }
                Scratch {
                    dir,
                    replaced: None,
                }
            });
            if let Some(i) = s.replaced.take() {
                let (name, bytes) = &base.files[i];
                std::fs::write(s.dir.path().join(name), bytes).expect("restore the valid file");
            }
            let i = pick % base.files.len();
            std::fs::write(s.dir.path().join(&base.files[i].0), content).expect("write the input");
            s.replaced = Some(i);
            load(s.dir.path())
        })
    }
}
