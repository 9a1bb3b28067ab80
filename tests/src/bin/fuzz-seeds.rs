//! Write every fuzz target's seed corpus (`m2r2_tests::hostile::seeds`) under `DIR/TARGET/`,
//! replacing what is there: `cargo run -p m2r2-tests --bin fuzz-seeds -- fuzz/seeds`
//! (`scripts/fuzz.sh --seeds` runs it).

use m2r2_tests::hostile::{Target, seeds};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(root) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz-seeds DIR");
        return ExitCode::from(2);
    };
    for target in Target::ALL {
        let dir = root.join(target.name());
        let written = std::fs::remove_dir_all(&dir)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| std::fs::create_dir_all(&dir))
            .and_then(|()| {
                let seeds = seeds(target);
                for (name, bytes) in &seeds {
                    std::fs::write(dir.join(name), bytes)?;
                }
                Ok(seeds.len())
            });
        match written {
            Ok(n) => eprintln!("{}: {n} seeds in {}", target.name(), dir.display()),
            Err(e) => {
                eprintln!("error: cannot write {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
