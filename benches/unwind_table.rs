//! Unwind-table build time (`cargo bench --bench unwind_table`): libc and the
//! largest shared objects on a Rust machine, the toolchain's
//! `librustc_driver-*.so` and `libLLVM*.so*`. Before measuring, prints each
//! table's size: CFI bytes, FDEs, rows, pages, BPF map bytes, most rows in a
//! page, unsupported rules, and one build's time per row and per MB of CFI.
//! `cache_load`: reading the same tables back from the disk cache
//! (`cache::load`: read, checksum, decode, validate), what a warm start
//! costs per object. `early_page`: from the start of a build to the moment
//! the rows of one page a sample waits on (the middle page) are sent ahead
//! of the table (`build_table_early`), what a cold start waits before BPF
//! can walk through that page.

use std::cell::Cell;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lightswitch::unwind::early::EarlySink;
use lightswitch::unwind::{build_table, build_table_early, cache, ObjectKey, UnwindTable};
use object::{Object, ObjectSection};

/// (name, path) of the objects to measure that exist on this machine.
fn objects() -> Vec<(&'static str, PathBuf)> {
    let mut found = Vec::new();
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    found.extend(libc.map(|p| ("libc", p)));
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok());
    if let Some(sysroot) = sysroot {
        let lib = PathBuf::from(sysroot.trim()).join("lib");
        let find = |wanted: fn(&str) -> bool| {
            std::fs::read_dir(&lib)
                .into_iter()
                .flatten()
                .flatten()
                .find(|e| wanted(&e.file_name().to_string_lossy()))
                .map(|e| e.path())
        };
        let driver = find(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"));
        found.extend(driver.map(|p| ("librustc_driver", p)));
        // The real library, not the small linker script next to it.
        let llvm = find(|n| n.starts_with("libLLVM") && n.contains(".so."));
        found.extend(llvm.map(|p| ("libLLVM", p)));
    }
    found
}

/// Size of the object's CFI section (`.eh_frame`, else `.debug_frame`).
fn cfi_bytes(bytes: &[u8]) -> u64 {
    let Ok(file) = object::File::parse(bytes) else {
        return 0;
    };
    [".eh_frame", ".debug_frame"]
        .iter()
        .find_map(|name| file.section_by_name(name).map(|s| s.size()))
        .unwrap_or(0)
}

fn build(c: &mut Criterion) {
    let mut group = c.benchmark_group("build_table");
    group.sample_size(10);
    for (name, path) in objects() {
        let Ok(bytes) = std::fs::read(&path) else {
            eprintln!("{name}: cannot read {}", path.display());
            continue;
        };
        let started = Instant::now();
        let table = match build_table(&bytes) {
            Ok(table) => table,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        let elapsed = started.elapsed();
        let s = table.stats();
        let cfi = cfi_bytes(&bytes);
        println!(
            "{name} ({}): file {} MB, {} {cfi} bytes, {} FDEs -> {} rows, {} pages, {} bytes \
             (max {} rows in a page), unsupported {:?}; one build {:.1} ms = {:.0} ns/row, \
             {:.1} ms per MB of CFI",
            path.display(),
            bytes.len() / 1_000_000,
            s.source,
            s.fdes,
            s.rows,
            s.pages,
            s.bytes,
            s.max_page_rows,
            s.unsupported,
            elapsed.as_secs_f64() * 1e3,
            elapsed.as_nanos() as f64 / s.rows.max(1) as f64,
            elapsed.as_secs_f64() * 1e3 / (cfi.max(1) as f64 / 1e6),
        );
        // Per-row rates: criterion reports rows per second (its inverse is ns per row).
        group.throughput(Throughput::Elements(s.rows as u64));
        group.bench_function(name, |b| b.iter(|| build_table(black_box(&bytes))));
    }
    group.finish();
}

fn cache_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("cache_load");
    group.sample_size(10);
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, path) in objects() {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(table) = build_table(&bytes) else {
            continue;
        };
        let key = ObjectKey::for_object(&bytes);
        cache::store(dir.path(), &key, &table).expect("storing the table");
        group.throughput(Throughput::Elements(table.stats().rows));
        group.bench_function(name, |b| {
            b.iter(|| cache::load(dir.path(), black_box(&key)).expect("cached"))
        });
    }
    group.finish();
}

/// Asks for one page once; notes when its rows arrive.
struct FirstPage {
    page: Cell<Option<u32>>,
    started: Instant,
    arrived: Cell<Option<Duration>>,
}

impl EarlySink for FirstPage {
    fn wanted(&self) -> Vec<u32> {
        self.page.take().into_iter().collect()
    }

    fn publish(&self, _pages: UnwindTable) {
        self.arrived.set(Some(self.started.elapsed()));
    }
}

fn early_page(c: &mut Criterion) {
    let mut group = c.benchmark_group("early_page");
    group.sample_size(10);
    for (name, path) in objects() {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(table) = build_table(&bytes) else {
            continue;
        };
        let middle = table.pages()[table.pages().len() / 2].page;
        group.bench_function(name, |b| {
            b.iter_custom(|iterations| {
                (0..iterations)
                    .map(|_| {
                        let sink = FirstPage {
                            page: Cell::new(Some(middle)),
                            started: Instant::now(),
                            arrived: Cell::new(None),
                        };
                        build_table_early(None, black_box(&bytes), &sink, &[]).expect("table");
                        sink.arrived.get().expect("the page was sent ahead")
                    })
                    .sum()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, build, cache_load, early_page);
criterion_main!(benches);
