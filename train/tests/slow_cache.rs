//! The slow-stream cache (`train --slow-cache`) on the built-in `tiny` model: a read gives bit for
//! bit the pass it replaces (and the same training: `training.rs`), its key follows the data, gates
//! and model but not the adapters' settings, and a damaged file is an error naming it.

use ndarray::Array2;
use reference::Model;
use reference::io::builtin::builtin;
use reference::m2r2::config::M2r2Config;
use train::data::DistillSample;
use train::slow_cache::{CacheUse, SlowKey, SlowPass, read};
use train::slow_stream::SlowSample;

fn data(n: usize) -> Vec<DistillSample> {
    (0..n)
        .map(|i| DistillSample {
            prompt_id: format!("p{i}"),
            sample: 0,
            prompt_len: 3 + i % 2,
            tokens: (0..9 + i)
                .map(|k| ((i * 37 + k * 11) % 250) as u32 + 1)
                .collect(),
        })
        .collect()
}

fn key<'a>(
    model: &'a Model,
    config: &'a M2r2Config,
    data: &'a [DistillSample],
    intervals: &'a [usize],
    keep_aligned: bool,
) -> SlowKey<'a> {
    SlowKey {
        model,
        config,
        data,
        intervals,
        keep_aligned,
    }
}

/// A pass through the cache folder `dir`.
fn cached(dir: &std::path::Path) -> SlowPass<'_> {
    SlowPass {
        cache: Some(dir),
        ..SlowPass::default()
    }
}

/// Every array of every sample, in a fixed order (`None` entries as markers).
fn arrays(samples: &[SlowSample<f32>]) -> Vec<Option<Array2<f32>>> {
    let mut out = Vec::new();
    for s in samples {
        out.extend(s.starts.iter().cloned());
        for kv in &s.kv {
            out.push(kv.as_ref().map(|(k, _)| k.clone()));
            out.push(kv.as_ref().map(|(_, v)| v.clone()));
        }
        out.push(Some(s.last.clone()));
        for a in &s.aligned {
            match a {
                Some(list) => out.extend(list.iter().cloned().map(Some)),
                None => out.push(None),
            }
        }
    }
    out
}

fn bits(a: &[Option<Array2<f32>>]) -> Vec<Option<Vec<u32>>> {
    a.iter()
        .map(|x| x.as_ref().map(|x| x.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn a_read_is_the_pass_bit_for_bit() {
    let model = builtin("tiny").unwrap();
    let config = M2r2Config::default_for(&model.config);
    let data = data(5);
    let dir = tempfile::tempdir().unwrap();
    for (intervals, aligned) in [(vec![0], false), (vec![0, 2], true)] {
        let k = key(&model, &config, &data, &intervals, aligned);
        let computed = SlowPass::default().run(&k).unwrap();
        let mut first = cached(dir.path());
        let written = first.run(&k).unwrap();
        let file = match first.used.as_slice() {
            [CacheUse::Written(file, bytes)] => {
                assert_eq!(*bytes, train::slow_cache::data_bytes(&computed));
                file.clone()
            }
            other => panic!("expected a written cache, got {other:?}"),
        };
        let mut second = cached(dir.path());
        let read_back = second.run(&k).unwrap();
        assert!(matches!(second.used.as_slice(), [CacheUse::Read(f)] if *f == file));
        assert_eq!(bits(&arrays(&written)), bits(&arrays(&computed)));
        assert_eq!(bits(&arrays(&read_back)), bits(&arrays(&computed)));
        for (r, c) in read_back.iter().zip(&computed) {
            assert_eq!((&r.tokens, r.first_row), (&c.tokens, c.first_row));
        }
    }
}

/// A set of two folders (parts of 2 and 3 samples) is cached as two files, which the same set, a
/// set of one of the folders and a set whose first two folders make up the first part read; a
/// file for the whole set is read before the parts. Samples are reported to `on_sample` by their
/// index in the whole set.
#[test]
fn each_part_has_its_own_file() {
    let model = builtin("tiny").unwrap();
    let config = M2r2Config::default_for(&model.config);
    let data = data(5);
    let k = key(&model, &config, &data, &[0], false);
    let computed = SlowPass::default().run(&k).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    let mut on_sample = |i: usize| seen.push(i);
    let mut pass = SlowPass::new(Some(dir.path()), &mut on_sample);
    pass.parts = vec![2, 3];
    let written = pass.run(&k).unwrap();
    let files: Vec<_> = match pass.used.as_slice() {
        [CacheUse::Written(a, _), CacheUse::Written(b, _)] => vec![a.clone(), b.clone()],
        other => panic!("expected two written files, got {other:?}"),
    };
    assert!(pass.parts.is_empty(), "the run takes the parts");
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    assert_eq!(bits(&arrays(&written)), bits(&arrays(&computed)));
    let mut again = cached(dir.path());
    again.parts = vec![2, 3];
    let read_back = again.run(&k).unwrap();
    assert!(
        matches!(again.used.as_slice(), [CacheUse::Read(a), CacheUse::Read(b)] if [a, b] == [&files[0], &files[1]])
    );
    assert_eq!(bits(&arrays(&read_back)), bits(&arrays(&computed)));
    let second = key(&model, &config, &data[2..], &[0], false);
    let mut alone = cached(dir.path());
    let part = alone.run(&second).unwrap();
    assert!(matches!(alone.used.as_slice(), [CacheUse::Read(f)] if *f == files[1]));
    assert_eq!(bits(&arrays(&part)), bits(&arrays(&computed[2..])));
    // Folders of 1, 1 and 3 samples: the first two together are the first file.
    let mut regrouped = cached(dir.path());
    regrouped.parts = vec![1, 1, 3];
    let read_back = regrouped.run(&k).unwrap();
    assert!(
        matches!(regrouped.used.as_slice(), [CacheUse::Read(a), CacheUse::Read(b)] if [a, b] == [&files[0], &files[1]])
    );
    assert_eq!(bits(&arrays(&read_back)), bits(&arrays(&computed)));
    // A whole-set file (written without parts) is read, parts or not.
    let whole_dir = tempfile::tempdir().unwrap();
    cached(whole_dir.path()).run(&k).unwrap();
    let mut whole = cached(whole_dir.path());
    whole.parts = vec![2, 3];
    whole.run(&k).unwrap();
    assert!(
        matches!(whole.used.as_slice(), [CacheUse::Read(f)] if *f == whole_dir.path().join(k.file_name()))
    );
}

#[test]
fn the_key_follows_what_the_pass_depends_on() {
    let model = builtin("tiny").unwrap();
    let config = M2r2Config::default_for(&model.config);
    let data = data(3);
    let name = |c: &M2r2Config, d: &[DistillSample], i: &[usize], a: bool| {
        key(&model, c, d, i, a).file_name()
    };
    let base = name(&config, &data, &[0], false);
    assert!(base.starts_with("slow-") && base.ends_with(".safetensors"));
    // the adapters' settings do not change the slow stream
    let mut other_rank = config.clone();
    other_rank.rank *= 2;
    other_rank.alpha *= 3.0;
    assert_eq!(name(&other_rank, &data, &[0], false), base);
    // data, trained intervals, intermediate targets and gates do
    let mut changed = data.clone();
    changed[1].tokens[4] += 1;
    assert_ne!(name(&config, &changed, &[0], false), base);
    let mut prompt = data.clone();
    prompt[2].prompt_len += 1;
    assert_ne!(name(&config, &prompt, &[0], false), base);
    assert_ne!(name(&config, &data, &[1], false), base);
    assert_ne!(name(&config, &data, &[0], true), base);
    let mut gates = config.clone();
    gates.gates[0] += 1;
    assert_ne!(name(&gates, &data, &[0], false), base);
    // and so does any base weight
    let mut nudged = builtin("tiny").unwrap();
    let last = nudged.weights.layers.len() - 1;
    nudged.weights.layers[last].mlp_norm[0] += 1e-3;
    assert_ne!(key(&nudged, &config, &data, &[0], false).file_name(), base);
}

#[test]
fn a_damaged_cache_is_an_error_naming_it() {
    let model = builtin("tiny").unwrap();
    let config = M2r2Config::default_for(&model.config);
    let data = data(3);
    let dir = tempfile::tempdir().unwrap();
    let k = key(&model, &config, &data, &[0], false);
    let mut pass = cached(dir.path());
    pass.run(&k).unwrap();
    let file = dir.path().join(k.file_name());
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let err = cached(dir.path()).run(&k).unwrap_err().to_string();
    assert!(
        err.contains(&file.display().to_string()) && err.contains("delete it"),
        "{err}"
    );
    // a well-formed file of other samples: the missing tensor is named
    let fewer = &data[..2];
    let mut small = cached(dir.path());
    small
        .run(&key(&model, &config, fewer, &[0], false))
        .unwrap();
    let small_file = dir
        .path()
        .join(key(&model, &config, fewer, &[0], false).file_name());
    let err = read(&small_file, &k).unwrap_err().to_string();
    assert!(err.contains("tensor `2.start.0`"), "{err}");
    // longer samples than the file's: the shape is named
    let mut longer = data.clone();
    longer[0].tokens.push(7);
    let err = read(
        &small_file,
        &key(&model, &config, &longer[..2], &[0], false),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("tensor `0.start.0`") && err.contains("expected F32"),
        "{err}"
    );
}
