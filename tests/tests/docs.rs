//! The docs name only what exists. This test reads `README.md`, `python/README.md`, `docs/*.md` and
//! `docs/m2r2/*.md` (not `docs/journal/`: dated records, true on their date) and fails listing every
//! path and code symbol that names nothing in the repository, as `file:line: what: why`.
//!
//! **Paths.** A path is a link target `[x](path)` (not a URL, not an `#anchor`), or a token of path
//! characters with a `/` whose last segment has an extension (`scripts/test.sh`), that ends in `/`
//! (`reference/src/m2r2/`), that starts with `./` or `../`, or that is a whole code span
//! (`` `src/cli` ``); or a bare file name ending in `.rs`, `.py`, `.sh` or `.md`. Then:
//! - a link target resolves from the Markdown file's folder, as a renderer resolves it;
//! - another path resolves from the repository root, the Markdown file's folder, or a crate root
//!   (`reference/src`, `export/src`, `onnx-runner/src`, `train/src`, `src`, `tests/src` and the
//!   crates' `tests/` folders: the docs' shorthand `base/layer.rs`, `golden/m2r2/tests.rs`);
//!   a bare file name is found anywhere in the repository, and an entry of a fenced block that
//!   draws a folder tree (`├── matmul/`) may be the end of any path of the repository;
//! - a path that leaves the repository from the file's folder or from the root (`../shared/...`)
//!   is an error unless it resolves: a reader of the repository cannot open it;
//! - skipped: globs and placeholders (`*`, `{a,b}` is expanded, `<id>`, `$VAR`, an upper-case
//!   segment such as `DIR`, `OUT`, `TARGET`), absolute and home paths (`/tmp/x`, `~/.cache/m2r2`),
//!   paths under a folder `.gitignore` names (`target/`, `fuzz/work/`), string values in code
//!   (`"../model.onnx"`: a file's content, not a reference), and paths whose first segment is the
//!   name of nothing in the repository: those are what a command writes or a user supplies
//!   (`out/smollm2/model.onnx`, `goldens/`, `trained-arla/`). A path whose first segment names a
//!   file or folder of the repository is a claim about the repository and must resolve.
//!
//! **Code symbols**, in code spans and fenced blocks: `a::b::c`, `file.rs::item` and
//! `Type::member`.
//! - `reference::`, `export::`, `onnx_runner::`, `train::`, `m2r2_tests::` and `crate::` start at
//!   the crate root; another lower-case first segment is a module named from anywhere in the
//!   workspace (`matmul::linear`, `decode::speculative::speculative_generate`), and must exist
//!   (`m2r2::` is the reference's module: the `m2r2` binary is no library).
//!   The path walks down module files (`a/b.rs`, `a/b/mod.rs`); the first segment after the last
//!   module must be defined in that file (fn, struct, enum, trait, const, static, type, mod, or a
//!   `use` that re-exports it), then any further segment too (inline `mod tests`), or as a member.
//! - `Type::member`, where `Type` is a struct, enum, trait or type alias of the workspace: `member`
//!   is a fn, const or type in a file that defines or implements `Type`, or a field or variant in
//!   the body of its definition. A type the workspace does not define is another crate's
//!   (`ThreadPool::install`) and is skipped.
//! - Skipped: `std`, `core`, `alloc`, the external crates of `Cargo.lock`, primitive types
//!   (`usize::MAX`), `Self`/`self`/`super`, and single identifiers.

use regex::Regex;
use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

/// The Markdown files checked, relative to the repository root (folders: their `*.md`).
const DOCS: [&str; 4] = ["README.md", "python/README.md", "docs", "docs/m2r2"];

/// Crate source roots and test folders, for the docs' shorthand paths (`base/layer.rs`).
const CRATE_ROOTS: [&str; 12] = [
    "reference/src",
    "reference/tests",
    "export/src",
    "export/tests",
    "onnx-runner/src",
    "onnx-runner/tests",
    "train/src",
    "train/tests",
    "src",
    "tests",
    "tests/src",
    "tests/tests",
];

/// Workspace library crates as code names them, and their root files. (`m2r2::` in the docs is
/// the reference's `m2r2` module: the `m2r2` binary is no library.)
const CRATES: [(&str, &str); 5] = [
    ("reference", "reference/src/lib.rs"),
    ("export", "export/src/lib.rs"),
    ("onnx_runner", "onnx-runner/src/lib.rs"),
    ("train", "train/src/lib.rs"),
    ("m2r2_tests", "tests/src/lib.rs"),
];

/// This file: its test strings define no item of the workspace.
const THIS_FILE: &str = "tests/tests/docs.rs";

const PRIMITIVES: [&str; 19] = [
    "bool", "char", "str", "f16", "f32", "f64", "i8", "i16", "i32", "i64", "i128", "isize", "u8",
    "u16", "u32", "u64", "u128", "usize", "String",
];

const LANGUAGE: [&str; 6] = ["std", "core", "alloc", "Self", "self", "super"];

/// Bare file names with these extensions are checked.
const BARE_EXTENSIONS: [&str; 4] = ["rs", "py", "sh", "md"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `a/./b/../c` -> `a/c`; `None` when it climbs above the start.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// What the repository holds: files and folders (relative, `/`-separated), without what git
/// ignores.
struct Repo {
    root: PathBuf,
    /// Every file and folder, relative to the root.
    entries: BTreeSet<String>,
    /// The names (last segments) of every file and folder.
    names: BTreeSet<String>,
    /// Folders a `.gitignore` names (relative), and names ignored at any depth.
    ignored: Vec<String>,
    /// External crates (`Cargo.lock`), as code names them.
    external: BTreeSet<String>,
    /// The text of every Rust file of the crate roots.
    rust: HashMap<String, String>,
}

impl Repo {
    fn load() -> Repo {
        let root = repo_root();
        let mut ignored = vec![".git".to_string()];
        for dir in ["", "fuzz", "python"] {
            let Ok(text) = std::fs::read_to_string(root.join(dir).join(".gitignore")) else {
                continue;
            };
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') || line.contains('*') {
                    continue;
                }
                let name = line.trim_matches('/');
                ignored.push(if dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{dir}/{name}")
                });
            }
        }
        let mut repo = Repo {
            root,
            entries: BTreeSet::new(),
            names: BTreeSet::new(),
            ignored,
            external: BTreeSet::new(),
            rust: HashMap::new(),
        };
        repo.walk("");
        let lock = std::fs::read_to_string(repo.root.join("Cargo.lock")).unwrap();
        let ours: BTreeSet<String> = CRATES.iter().map(|(c, _)| c.to_string()).collect();
        for line in lock.lines() {
            if let Some(name) = line.strip_prefix("name = \"") {
                let name = name.trim_end_matches('"').replace('-', "_");
                if !ours.contains(&name) && !name.starts_with("m2r2") {
                    repo.external.insert(name);
                }
            }
        }
        let rs: Vec<String> = repo
            .entries
            .iter()
            .filter(|e| e.ends_with(".rs") && CRATE_ROOTS.iter().any(|r| in_folder(e, r)))
            .filter(|e| *e != THIS_FILE)
            .cloned()
            .collect();
        for path in rs {
            let text = std::fs::read_to_string(repo.root.join(&path)).unwrap();
            repo.rust.insert(path, text);
        }
        repo
    }

    fn walk(&mut self, rel: &str) {
        for entry in std::fs::read_dir(self.root.join(rel)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().to_string();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if self.is_ignored(&path) {
                continue;
            }
            self.entries.insert(path.clone());
            self.names.insert(name);
            if entry.file_type().unwrap().is_dir() {
                self.walk(&path);
            }
        }
    }

    /// Under a folder a `.gitignore` names (`target`, `fuzz/work`), or a `__pycache__`.
    fn is_ignored(&self, rel: &str) -> bool {
        self.ignored.iter().any(|i| in_folder(rel, i))
            || rel.split('/').any(|s| s == "__pycache__" || s == "target")
    }

    /// Some entry is `path` or ends with `/path` (a tree drawing's entry below its folder).
    fn has_suffix(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        let tail = format!("/{path}");
        self.entries.iter().any(|e| e == path || e.ends_with(&tail))
    }

    /// `rel` (relative to the root, maybe with `..`) as an entry, if it exists.
    fn entry(&self, base: &str, rel: &str) -> Option<String> {
        let joined = normalize(&Path::new(base).join(rel))?;
        let text = joined.to_string_lossy().trim_end_matches('/').to_string();
        (text.is_empty() || self.entries.contains(&text)).then_some(text)
    }
}

/// `path` is `folder` or inside it.
fn in_folder(path: &str, folder: &str) -> bool {
    path == folder
        || path
            .strip_prefix(folder)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// One Markdown file, line by line: `(line number, prose parts, code parts, in a fenced block)`.
struct Line {
    number: usize,
    text: String,
    /// The code spans of the line (the whole line in a fenced block).
    code: Vec<String>,
    /// The line with code spans blanked (empty in a fenced block).
    prose: String,
    fenced: bool,
    /// In a fenced block that draws a folder tree (`├──`, `└──`).
    tree: bool,
}

fn lines_of(text: &str) -> Vec<Line> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut fenced = false;
    let mut tree = false;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            if fenced {
                let block = lines[i + 1..]
                    .iter()
                    .take_while(|l| !l.trim_start().starts_with("```"));
                tree = block
                    .clone()
                    .any(|l| l.contains("├──") || l.contains("└──"));
            }
            continue;
        }
        if fenced {
            out.push(Line {
                number: i + 1,
                text: line.to_string(),
                code: vec![line.to_string()],
                prose: String::new(),
                fenced: true,
                tree,
            });
            continue;
        }
        let mut code = Vec::new();
        let mut prose = String::new();
        let mut rest: &str = line;
        while let Some(start) = rest.find('`') {
            let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
            let fence = "`".repeat(ticks);
            let after = &rest[start + ticks..];
            let Some(end) = after.find(&fence) else { break };
            prose.push_str(&rest[..start]);
            prose.push(' ');
            code.push(after[..end].trim().to_string());
            rest = &after[end + ticks..];
        }
        prose.push_str(rest);
        out.push(Line {
            number: i + 1,
            text: line.to_string(),
            code,
            prose,
            fenced: false,
            tree: false,
        });
    }
    out
}

struct Checker {
    repo: Repo,
    url: Regex,
    link: Regex,
    quoted: Regex,
    token: Regex,
    file_symbol: Regex,
    symbol: Regex,
    group: Regex,
    failures: Vec<String>,
}

impl Checker {
    fn new() -> Checker {
        Checker {
            repo: Repo::load(),
            url: Regex::new(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s)>\]`]*").unwrap(),
            link: Regex::new(r#"\]\(([^)\s]+)(?:\s+"[^"]*")?\)"#).unwrap(),
            quoted: Regex::new(r#""[^"]*""#).unwrap(),
            token: Regex::new(r"(?:[A-Za-z0-9_./~*<>$+-]|\{[^}\s]*\})+").unwrap(),
            file_symbol: Regex::new(
                r"((?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_-]+\.rs)((?:::[A-Za-z_][A-Za-z0-9_]*)+)",
            )
            .unwrap(),
            symbol: Regex::new(
                r"(?:^|[^A-Za-z0-9_:.])([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+)",
            )
            .unwrap(),
            group: Regex::new(r"\b[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*::\{")
                .unwrap(),
            failures: Vec::new(),
        }
    }

    fn fail(&mut self, doc: &str, line: usize, what: &str, why: String) {
        self.failures.push(format!("{doc}:{line}: `{what}`: {why}"));
    }

    fn check_doc(&mut self, doc: &str) {
        let text = std::fs::read_to_string(self.repo.root.join(doc)).unwrap();
        let folder = Path::new(doc)
            .parent()
            .unwrap()
            .to_string_lossy()
            .to_string();
        for line in lines_of(&text) {
            // Links: resolved from the file's folder.
            if !line.fenced {
                let targets: Vec<String> = self
                    .link
                    .captures_iter(&line.text)
                    .map(|c| c[1].to_string())
                    .collect();
                for target in targets {
                    self.check_link(doc, &folder, line.number, &target);
                }
            }
            // Paths, in prose and in code.
            let prose = self.link.replace_all(&line.prose, "]");
            let prose = self.url.replace_all(&prose, " ").to_string();
            for token in self.tokens(&prose) {
                self.check_path(doc, &folder, line.number, &token, false, false);
            }
            for span in &line.code {
                let span = self.url.replace_all(span, " ");
                let span = self.quoted.replace_all(&span, " ").to_string();
                let whole = span.trim().to_string();
                for token in self.tokens(&span) {
                    let is_whole = token == whole && !line.fenced;
                    self.check_path(doc, &folder, line.number, &token, is_whole, line.tree);
                }
                self.check_symbols(doc, line.number, &span);
            }
        }
    }

    /// Path-character tokens of `text`, trailing punctuation stripped.
    fn tokens(&self, text: &str) -> Vec<String> {
        self.token
            .find_iter(text)
            .map(|m| m.as_str().trim_end_matches(['.', ',']).to_string())
            .filter(|t| !t.is_empty())
            .collect()
    }

    fn check_link(&mut self, doc: &str, folder: &str, line: usize, target: &str) {
        if target.starts_with('#') || target.contains(':') {
            return;
        }
        let path = target.split('#').next().unwrap();
        if self.repo.entry(folder, path).is_none() {
            let why = match normalize(&Path::new(folder).join(path)) {
                None => "outside the repository: a reader of it cannot open this".to_string(),
                Some(_) => format!("link target not found from {folder}/"),
            };
            self.fail(doc, line, target, why);
        }
    }

    /// `token` if it is a path (see the module doc); `whole`: it is a whole code span; `tree`: it
    /// is in a tree drawing.
    fn check_path(
        &mut self,
        doc: &str,
        folder: &str,
        line: usize,
        token: &str,
        whole: bool,
        tree: bool,
    ) {
        let relative = token.starts_with("./") || token.starts_with("../");
        if !token.contains('/') {
            let bare = token
                .rsplit_once('.')
                .is_some_and(|(stem, ext)| !stem.is_empty() && BARE_EXTENSIONS.contains(&ext));
            if bare
                && !token.contains(['*', '<', '>', '$', '{'])
                && !self.repo.names.contains(token)
            {
                self.fail(doc, line, token, "no file of this name".to_string());
            }
            return;
        }
        if token.contains("//") || token.starts_with('/') || token.starts_with('~') {
            return;
        }
        let last = token.trim_end_matches('/').rsplit('/').next().unwrap();
        let has_extension = last.rsplit_once('.').is_some_and(|(stem, ext)| {
            !stem.is_empty() && ext.starts_with(|c: char| c.is_ascii_alphabetic())
        });
        if !(has_extension || token.ends_with('/') || relative || whole) {
            return;
        }
        for path in expand_braces(token) {
            if tree && !path.starts_with('.') && self.repo.has_suffix(&path) {
                continue;
            }
            self.check_one_path(doc, folder, line, &path);
        }
    }

    fn check_one_path(&mut self, doc: &str, folder: &str, line: usize, path: &str) {
        if path.contains(['*', '<', '>', '$'])
            || path.split('/').any(|s| {
                s.starts_with(|c: char| c.is_ascii_uppercase())
                    && s.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
        {
            return;
        }
        let mut bases: Vec<&str> = vec!["", folder];
        if !path.starts_with('.') {
            bases.extend(CRATE_ROOTS);
        }
        if bases.iter().any(|b| self.repo.entry(b, path).is_some()) {
            return;
        }
        // Leaves the repository, from the file's folder or from the root.
        if path.starts_with("../")
            && [folder, ""]
                .iter()
                .any(|b| normalize(&Path::new(b).join(path)).is_none())
        {
            let why = "outside the repository: a reader of it cannot open this".to_string();
            self.fail(doc, line, path, why);
            return;
        }
        let resolved: Vec<String> = [folder, ""]
            .iter()
            .filter_map(|b| normalize(&Path::new(b).join(path)))
            .map(|p| p.to_string_lossy().to_string())
            .collect();
        if resolved.iter().any(|r| self.repo.is_ignored(r)) {
            return;
        }
        let first = path
            .trim_start_matches("./")
            .split('/')
            .find(|s| *s != "..")
            .unwrap_or("");
        if !self.repo.names.contains(first) {
            return; // written by a command or supplied by the user
        }
        let why = format!(
            "not found from the root, {folder}/ or a crate root ({})",
            CRATE_ROOTS.join(", ")
        );
        self.fail(doc, line, path, why);
    }

    fn check_symbols(&mut self, doc: &str, line: usize, span: &str) {
        let mut rest = span.to_string();
        let files: Vec<(String, String)> = self
            .file_symbol
            .captures_iter(span)
            .map(|c| (c[1].to_string(), c[2].to_string()))
            .collect();
        for (file, items) in files {
            rest = rest.replace(&format!("{file}{items}"), " ");
            let segs: Vec<&str> = items.trim_start_matches("::").split("::").collect();
            let candidates = self.files_named(&file);
            if candidates.is_empty() {
                continue; // the path check reports the file
            }
            let what = format!("{file}{items}");
            self.check_in_files(doc, line, &what, &candidates, &segs);
        }
        let mut paths = Vec::new();
        while let Some(m) = self.group.find(&rest) {
            let (start, open) = (m.start(), m.end() - 1);
            let close = matching_brace(&rest, open);
            paths.extend(expand_group(&rest[start..close]));
            rest.replace_range(start..close, " ");
        }
        paths.extend(self.symbol.captures_iter(&rest).map(|c| c[1].to_string()));
        for path in paths {
            self.check_symbol(doc, line, &path);
        }
    }

    /// Rust files for `file` (`a/b.rs`, maybe shorthand from a crate root, or a bare name).
    fn files_named(&self, file: &str) -> Vec<String> {
        let mut out = Vec::new();
        for base in std::iter::once("").chain(CRATE_ROOTS) {
            if let Some(e) = self.repo.entry(base, file) {
                out.push(e);
            }
        }
        if !file.contains('/') {
            out.extend(
                self.repo
                    .rust
                    .keys()
                    .filter(|k| k.rsplit('/').next() == Some(file))
                    .cloned(),
            );
        }
        out
    }

    fn check_symbol(&mut self, doc: &str, line: usize, path: &str) {
        let segs: Vec<&str> = path.split("::").collect();
        let first = segs[0];
        if LANGUAGE.contains(&first)
            || PRIMITIVES.contains(&first)
            || self.repo.external.contains(first)
        {
            return;
        }
        if first.starts_with(|c: char| c.is_ascii_uppercase()) {
            if let Err(why) = self.has_member(first, segs[1]) {
                self.fail(doc, line, path, why);
            }
            return;
        }
        // Module files to start from.
        let starts: Vec<(String, usize)> = if first == "crate" {
            let roots = CRATES.iter().map(|(_, f)| *f).chain(["src/main.rs"]);
            roots.map(|f| (f.to_string(), 1)).collect()
        } else if let Some((_, f)) = CRATES.iter().find(|(c, _)| *c == first) {
            vec![(f.to_string(), 1)]
        } else {
            self.modules_named(first)
                .into_iter()
                .map(|f| (f, 1))
                .collect()
        };
        if starts.is_empty() {
            self.fail(
                doc,
                line,
                path,
                format!("no module `{first}` in the workspace"),
            );
            return;
        }
        // Walk down module files.
        let mut ends = Vec::new();
        for (file, mut i) in starts {
            let mut file = file;
            while i < segs.len() {
                match self.submodule(&file, segs[i]) {
                    Some(next) => {
                        file = next;
                        i += 1;
                    }
                    None => break,
                }
            }
            ends.push((file, i));
        }
        if ends.iter().any(|(_, i)| *i == segs.len()) {
            return; // a module
        }
        let mut errors = Vec::new();
        for (file, i) in &ends {
            match self.items_in_file(file, &segs[*i..]) {
                Ok(()) => return,
                Err(e) => errors.push(e),
            }
        }
        self.fail(doc, line, path, errors.join("; "));
    }

    fn check_in_files(
        &mut self,
        doc: &str,
        line: usize,
        what: &str,
        files: &[String],
        segs: &[&str],
    ) {
        let mut errors = Vec::new();
        for file in files {
            match self.items_in_file(file, segs) {
                Ok(()) => return,
                Err(e) => errors.push(e),
            }
        }
        self.fail(doc, line, what, errors.join("; "));
    }

    /// `segs[0]` is an item of `file`; a type's next segment is its member; further segments
    /// (inside an inline `mod`) are defined in the file.
    fn items_in_file(&self, file: &str, segs: &[&str]) -> Result<(), String> {
        let text = &self.repo.rust[file];
        if !defines_item(text, segs[0]) {
            return Err(format!("`{}` is not defined in {file}", segs[0]));
        }
        if segs.len() == 1 {
            return Ok(());
        }
        if segs[0].starts_with(|c: char| c.is_ascii_uppercase()) {
            return self.has_member(segs[0], segs[1]);
        }
        for seg in &segs[1..] {
            if !defines_item(text, seg) && !defines_member(text, seg) {
                return Err(format!("`{seg}` is not defined in {file}"));
            }
        }
        Ok(())
    }

    /// Ok when `ty` is not the workspace's, or a file defining or implementing it has `member`.
    fn has_member(&self, ty: &str, member: &str) -> Result<(), String> {
        let def = Regex::new(&format!(r"\b(struct|enum|trait|type|union)\s+{ty}\b")).unwrap();
        let imp = Regex::new(&format!(r"(?m)^\s*(unsafe\s+)?impl\b[^{{;]*\b{ty}\b")).unwrap();
        let mut defining: Vec<&String> = self
            .repo
            .rust
            .iter()
            .filter(|(_, t)| def.is_match(t))
            .map(|(p, _)| p)
            .collect();
        if defining.is_empty() {
            return Ok(());
        }
        defining.extend(
            self.repo
                .rust
                .iter()
                .filter(|(_, t)| imp.is_match(t))
                .map(|(p, _)| p),
        );
        defining.sort();
        defining.dedup();
        let body = Regex::new(&format!(r"\b(struct|enum|union)\s+{ty}\b[^;{{]*\{{")).unwrap();
        let found = defining.iter().any(|f| {
            let text = &self.repo.rust[*f];
            defines_fn(text, member)
                || body
                    .find_iter(text)
                    .any(|m| defines_member(braced(&text[m.end()..]), member))
        });
        if found {
            return Ok(());
        }
        let files: Vec<&str> = defining.iter().map(|f| f.as_str()).collect();
        Err(format!(
            "no `{member}` on `{ty}` (defined or implemented in {})",
            files.join(", ")
        ))
    }

    /// Module files named `name` anywhere in the crate roots (`name.rs`, `name/mod.rs`).
    fn modules_named(&self, name: &str) -> Vec<String> {
        let file = format!("{name}.rs");
        let module = format!("{name}/mod.rs");
        self.repo
            .rust
            .keys()
            .filter(|k| k.ends_with(&format!("/{file}")) || k.ends_with(&format!("/{module}")))
            .cloned()
            .collect()
    }

    /// The file of module `name` inside the module of `file`.
    fn submodule(&self, file: &str, name: &str) -> Option<String> {
        let dir = match file.rsplit_once('/') {
            Some((dir, f)) if f == "mod.rs" || f == "lib.rs" || f == "main.rs" => dir.to_string(),
            _ => file.trim_end_matches(".rs").to_string(),
        };
        [format!("{dir}/{name}.rs"), format!("{dir}/{name}/mod.rs")]
            .into_iter()
            .find(|f| self.repo.rust.contains_key(f))
    }
}

/// An item named `name` is defined in `text`, or re-exported by a `use`.
fn defines_item(text: &str, name: &str) -> bool {
    let def = Regex::new(&format!(
        r"\b(fn|struct|enum|trait|const|static|type|mod|union)\s+{name}\b|macro_rules!\s*{name}\b"
    ))
    .unwrap();
    let reexport = Regex::new(&format!(r"\buse\s[^;]*\b{name}\b[^;]*;")).unwrap();
    def.is_match(text) || reexport.is_match(text)
}

/// `name` is a fn, const or type, or a field or variant (a line starting with it).
fn defines_member(text: &str, name: &str) -> bool {
    let re = Regex::new(&format!(
        r"(?m)^\s*(pub(\([^)]*\))?\s+)?{name}\s*([:,({{=]|$)"
    ))
    .unwrap();
    defines_fn(text, name) || re.is_match(text)
}

/// `name` is a fn, const, type or static.
fn defines_fn(text: &str, name: &str) -> bool {
    Regex::new(&format!(r"\b(fn|const|type|static)\s+{name}\b"))
        .unwrap()
        .is_match(text)
}

/// `text` up to the brace that closes the one just before it (a struct's or enum's body).
fn braced(text: &str) -> &str {
    let mut depth = 1;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[..i];
                }
            }
            _ => {}
        }
    }
    text
}

/// `a/{b,c}.rs` -> `a/b.rs`, `a/c.rs`.
fn expand_braces(token: &str) -> Vec<String> {
    match (token.find('{'), token.find('}')) {
        (Some(open), Some(close)) if open < close => {
            let (head, tail) = (&token[..open], &token[close + 1..]);
            token[open + 1..close]
                .split(',')
                .flat_map(|alt| expand_braces(&format!("{head}{}{tail}", alt.trim())))
                .collect()
        }
        _ => vec![token.to_string()],
    }
}

/// `a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e` (`self` dropped).
fn expand_group(path: &str) -> Vec<String> {
    let Some(i) = path.find("::{") else {
        return vec![path.trim().to_string()];
    };
    let (head, inner) = (&path[..i], &path[i + 3..matching_brace(path, i + 2) - 1]);
    let mut items = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (j, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[from..j]);
                from = j + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[from..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != "self" && *p != "..")
        .flat_map(|p| expand_group(&format!("{head}::{p}")))
        .filter(|p| {
            p.split("::").all(|s| {
                s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        .collect()
}

/// The end (one past) of the brace group opening at `open` (or the end of `text`).
fn matching_brace(text: &str, open: usize) -> usize {
    let mut depth = 0;
    for (j, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + j + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The Markdown files checked.
fn docs(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for doc in DOCS {
        if doc.ends_with(".md") {
            out.push(doc.to_string());
            continue;
        }
        let mut files: Vec<String> = std::fs::read_dir(root.join(doc))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".md"))
            .map(|n| format!("{doc}/{n}"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

#[test]
fn docs_name_only_what_exists() {
    let mut checker = Checker::new();
    let docs = docs(&checker.repo.root);
    for doc in &docs {
        checker.check_doc(doc);
    }
    assert!(
        checker.failures.is_empty(),
        "{} names in the docs that the repository does not have:\n{}",
        checker.failures.len(),
        checker.failures.join("\n")
    );
}

#[test]
fn the_rules_on_hand_written_lines() {
    assert_eq!(
        expand_braces("golden/{report,compare}.rs"),
        ["golden/report.rs", "golden/compare.rs"]
    );
    assert_eq!(
        expand_group("decode::mode::{greedy_run, speculative_run}"),
        ["decode::mode::greedy_run", "decode::mode::speculative_run"]
    );
    assert_eq!(
        expand_group("onnx_runner::{ep::EpConfig, session::{Input, OnnxSession}}"),
        [
            "onnx_runner::ep::EpConfig",
            "onnx_runner::session::Input",
            "onnx_runner::session::OnnxSession"
        ]
    );
    assert_eq!(
        normalize(Path::new("docs/../README.md")),
        Some("README.md".into())
    );
    assert_eq!(normalize(Path::new("../shared/x.md")), None);
    let text = "pub struct Model {\n    pub config: Config,\n}\nimpl Model {\n    pub fn forward() {}\n}\n";
    assert!(defines_item(text, "Model"));
    assert!(defines_member(text, "forward") && defines_member(text, "config"));
    assert!(!defines_member(text, "logits"));
    let lines = lines_of("see `a/b.rs` and c/d.md\n```sh\nm2r2 run\n```\n");
    assert_eq!(lines[0].code, ["a/b.rs"]);
    assert!(lines[0].prose.contains("c/d.md") && !lines[0].prose.contains("a/b.rs"));
    assert!(lines[1].fenced && lines[1].number == 3);
}
