//! The object opener's costs (`cargo bench --bench opener`): starting a
//! helper process and its first answer (`/proc/self/exe` run again, here
//! this benchmark's executable, which serves as the helper as the
//! lightswitch binary does), and one object opened through a running
//! helper (a request over the socket pair, `open`, `fstat`, `fstatfs`, the
//! ELF identity read, the descriptor back as `SCM_RIGHTS`), for this
//! benchmark's executable on a local file system.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use lightswitch::process::opener::{Opener, Outcome, OPEN_DEADLINE};

fn open_own_exe(opener: &mut Opener) {
    let exe = std::env::current_exe().expect("own executable");
    match opener.open(vec![exe], 0, OPEN_DEADLINE * 20) {
        Outcome::Opened(opened) => {
            black_box(opened);
        }
        other => panic!("not opened: {other:?}"),
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("opener");
    group.bench_function("start_helper_and_first_open", |b| {
        b.iter(|| {
            let mut opener = Opener::default();
            open_own_exe(&mut opener);
        })
    });
    let mut opener = Opener::default();
    opener.start();
    group.bench_function("open_through_helper", |b| {
        b.iter(|| open_own_exe(&mut opener))
    });
    group.finish();
}

fn main() {
    // As the lightswitch binary's `main`: a helper started from here serves.
    lightswitch::process::opener::serve_if_helper();
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    bench(&mut c);
    c.final_summary();
}
