use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let t: usize = args[1].parse().unwrap();
    let iters: usize = args[2].parse().unwrap();
    let loaded = reference::io::load::load_model("smollm2").unwrap();
    let model = &loaded.model;
    let mut cache = model.new_cache(256).unwrap();
    let prompt: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 11) % 49152).collect();
    model.forward(&prompt, &mut cache).unwrap();
    let chunk: Vec<u32> = (0..t as u32).map(|i| 100 + i).collect();
    let mut times = vec![];
    for _ in 0..iters {
        let s = Instant::now();
        model.forward(&chunk, &mut cache).unwrap();
        times.push(s.elapsed().as_secs_f64() * 1e3);
        cache.truncate(64);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "T={t} median {:.2} ms min {:.2}",
        times[times.len() / 2],
        times[0]
    );
}
