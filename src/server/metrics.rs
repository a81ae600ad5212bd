//! Counters the agent exports at `GET /metrics`, in the Prometheus text
//! exposition format (version 0.0.4). The sampling loop updates them (atomics
//! and short-held locks); the HTTP server renders them on each scrape.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::heap::HeapStats;
use crate::httpd::serve::ConnectionStats;
use crate::sample::UnwindStatus;
use crate::sampler::off_cpu::OffCpuCounts;
use crate::sender::queue::Queue;
use crate::sender::worker::WindowCounters;
use crate::symbolize::debuginfod::DebuginfodStats;
use crate::symbolize::minidebuginfo::MiniDebugInfoStats;
use crate::unwind::deferred::DeferredStats;

/// The agent's metrics, shared between the sampling loop and the server.
#[derive(Default)]
pub struct Metrics {
    samples: AtomicU64,
    lost: AtomicU64,
    unwind: Mutex<HashMap<UnwindStatus, u64>>,
    unwind_table_bytes: AtomicU64,
    unwind_tables_loaded: AtomicU64,
    unwind_tables_evicted: AtomicU64,
    sampling_freq_hz: AtomicU64,
    bpf_variant: OnceLock<&'static str>,
    tracker: [AtomicU64; 3],
    windows_closed: AtomicU64,
    windows_dropped: AtomicU64,
    windows_written: AtomicU64,
    windows_failed: AtomicU64,
    windows_panicked: AtomicU64,
    samples_missing_mapping: AtomicU64,
    deferred: Mutex<DeferredStats>,
    off_cpu: Mutex<Option<OffCpuCounts>>,
    profile_requests: Mutex<HashMap<&'static str, u64>>,
    profile_requests_active: AtomicU64,
    delivery: OnceLock<Arc<Queue>>,
    connections: Arc<ConnectionStats>,
}

/// What was refused or cut reading files profiled processes control
/// ([`crate::process::untrusted::counters`]).
fn render_jit_files(out: &mut String) {
    let c = crate::process::untrusted::counters();
    family(
        out,
        "lightswitch_jit_files_total",
        "counter",
        "Perf maps and jitdump files, which profiled processes control: files refused (not a regular \
         file, a symlink, another user's), reads past their deadline or not started (every reader \
         busy), names cut to 4 KiB, entries dropped for a full budget, oversized jitdump records \
         skipped.",
        &[
            ("kind=\"files_refused\"", c.files_refused),
            ("kind=\"reads_timed_out\"", c.reads_timed_out),
            ("kind=\"reads_refused\"", c.reads_refused),
            ("kind=\"names_cut\"", c.names_cut),
            ("kind=\"entries_dropped\"", c.entries_dropped),
            ("kind=\"records_skipped\"", c.records_skipped),
        ],
    );
    family(
        out,
        "lightswitch_jit_file_bytes_unread_total",
        "counter",
        "Bytes of perf maps and jitdump files past their per-file read budget, left unread.",
        &[("", c.bytes_unread)],
    );
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counters stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// A sample read from the ring buffer, with how its user-stack walk ended.
    pub fn sample(&self, status: UnwindStatus) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        *lock(&self.unwind).entry(status).or_default() += 1;
    }

    /// Samples read from the ring buffer so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Samples read so far per unwind result (`complete`, `no_table`, ...).
    pub fn unwind_counts(&self) -> std::collections::BTreeMap<String, u64> {
        lock(&self.unwind)
            .iter()
            .map(|(status, n)| (status.name(), *n))
            .collect()
    }

    /// Samples lost so far (ring buffer full, or records that did not parse).
    pub fn set_lost(&self, lost: u64) {
        self.lost.store(lost, Ordering::Relaxed);
    }

    /// The unwind tables now in BPF maps: bytes of rows (8 per row), tables
    /// loaded and evicted since the start.
    pub fn set_unwind_tables(&self, bytes: u64, loaded: u64, evicted: u64) {
        self.unwind_table_bytes.store(bytes, Ordering::Relaxed);
        self.unwind_tables_loaded.store(loaded, Ordering::Relaxed);
        self.unwind_tables_evicted.store(evicted, Ordering::Relaxed);
    }

    /// What the process tracker holds now: processes, executable mappings
    /// and objects (each object with an open file descriptor).
    pub fn set_tracker(&self, processes: u64, mappings: u64, objects: u64) {
        for (gauge, value) in self.tracker.iter().zip([processes, mappings, objects]) {
            gauge.store(value, Ordering::Relaxed);
        }
    }

    /// How the walks held for their stack copies went so far
    /// ([`crate::unwind::deferred::DeferredWalks::stats`]).
    pub fn set_deferred(&self, stats: DeferredStats) {
        *lock(&self.deferred) = stats;
    }

    /// What `--off-cpu` recorded and left out so far (the BPF counters).
    pub fn set_off_cpu(&self, counts: OffCpuCounts) {
        *lock(&self.off_cpu) = Some(counts);
    }

    /// The frequency perf events sample at now, Hz (0: not sampling).
    pub fn set_sampling_freq(&self, hz: u64) {
        self.sampling_freq_hz.store(hz, Ordering::Relaxed);
    }

    /// The build of the BPF programs loaded (`bpf_loop`, `compat`:
    /// [`crate::sampler::variant`]); set once.
    pub fn set_bpf_variant(&self, name: &'static str) {
        let _ = self.bpf_variant.set(name);
    }

    /// Continuous mode: a window closed (counted before it is handed on,
    /// so that a scrape never sees more windows written than closed).
    pub fn window_closed(&self) {
        self.windows_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Continuous mode: a closed window was dropped because symbolization
    /// fell behind.
    pub fn window_dropped(&self) {
        self.windows_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Continuous mode: a window was symbolized and handed to the sender
    /// (written, for the disk sender).
    pub fn window_written(&self) {
        self.windows_written.fetch_add(1, Ordering::Relaxed);
    }

    /// Continuous mode: the sender failed on a window (encoding or writing).
    pub fn window_failed(&self) {
        self.windows_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// A window or on-demand profile was dropped because processing it panicked.
    pub fn window_panicked(&self) {
        self.windows_panicked.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` more samples had a user frame whose mapping had been retired
    /// before their window was handed over (the frame is left unsymbolized).
    pub fn add_samples_missing_mapping(&self, n: u64) {
        self.samples_missing_mapping.fetch_add(n, Ordering::Relaxed);
    }

    /// The network sender's queue, whose delivery counters are exported.
    pub fn set_delivery_queue(&self, queue: Arc<Queue>) {
        let _ = self.delivery.set(queue);
    }

    /// An on-demand profile request ended with `outcome` (`served`,
    /// `rejected`, `failed`, ...).
    pub fn profile_request(&self, outcome: &'static str) {
        *lock(&self.profile_requests).entry(outcome).or_default() += 1;
    }

    /// On-demand profile requests in progress, and the change of that count.
    pub fn profile_requests_active(&self) -> &AtomicU64 {
        &self.profile_requests_active
    }

    /// The `--listen` server's connection counters (its accept loop adds to them).
    pub fn connections(&self) -> Arc<ConnectionStats> {
        self.connections.clone()
    }

    /// The metrics in Prometheus text format; `rss_bytes` is the process's
    /// resident memory and `heap` jemalloc's counters ([`crate::heap::stats`]),
    /// both read by the caller.
    pub fn render(&self, rss_bytes: Option<u64>, heap: Option<HeapStats>) -> String {
        let mut out = String::new();
        self.render_sampling(&mut out);
        self.render_windows(&mut out);
        self.render_serving(&mut out);
        render_jit_files(&mut out);
        render_debuginfod(&mut out, crate::symbolize::debuginfod::stats());
        render_minidebuginfo(&mut out, crate::symbolize::minidebuginfo::stats());
        if let Some(rss) = rss_bytes {
            family(
                &mut out,
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size of the profiler, bytes.",
                &[("", rss)],
            );
        }
        if let Some(heap) = heap {
            family(
                &mut out,
                "lightswitch_heap_bytes",
                "gauge",
                "The profiler's heap as jemalloc counts it, bytes: live allocations, the pages they sit in, \
                 jemalloc's metadata, all its resident pages, address space retained unmapped.",
                &[
                    ("kind=\"allocated\"", heap.allocated),
                    ("kind=\"active\"", heap.active),
                    ("kind=\"metadata\"", heap.metadata),
                    ("kind=\"resident\"", heap.resident),
                    ("kind=\"retained\"", heap.retained),
                ],
            );
        }
        out
    }

    /// Samples, lost samples, unwind results and tables, sampling
    /// frequency, the BPF programs' variant.
    fn render_sampling(&self, out: &mut String) {
        if let Some(variant) = self.bpf_variant.get() {
            family(
                out,
                "lightswitch_bpf_program_variant",
                "gauge",
                "The build of the BPF programs loaded (1 for the one chosen from the kernel's \
                 features: bpf_loop, or compat for kernels before 5.17).",
                &[(&format!("variant=\"{variant}\""), 1)],
            );
        }
        family(
            out,
            "lightswitch_samples_total",
            "counter",
            "Samples read from the BPF ring buffer.",
            &[("", get(&self.samples))],
        );
        family(
            out,
            "lightswitch_samples_lost_total",
            "counter",
            "Samples lost: the ring buffer was full, or a record did not parse.",
            &[("", get(&self.lost))],
        );
        let mut unwind: Vec<(String, u64)> = lock(&self.unwind)
            .iter()
            .map(|(status, n)| (format!("result=\"{}\"", status.name()), *n))
            .collect();
        unwind.sort();
        let unwind: Vec<(&str, u64)> = unwind.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        family(
            out,
            "lightswitch_unwind_results_total",
            "counter",
            "Samples by how their user-stack walk ended.",
            &unwind,
        );
        if let Some(o) = *lock(&self.off_cpu) {
            family(
                out,
                "lightswitch_off_cpu_waits_total",
                "counter",
                "Off-CPU waits of profiled threads (--off-cpu): recorded, left out for being \
                 shorter than --off-cpu-min, left out untracked (no task storage, or the map of waits \
                 waiting for their system call's return full).",
                &[
                    ("outcome=\"recorded\"", o.waits),
                    ("outcome=\"shorter_than_min\"", o.short),
                    ("outcome=\"untracked\"", o.untracked),
                ],
            );
            family(
                out,
                "lightswitch_off_cpu_left_out_nanoseconds_total",
                "counter",
                "Total length of the off-CPU waits left out for being shorter than --off-cpu-min, ns.",
                &[("", o.short_ns)],
            );
        }
        let d = *lock(&self.deferred);
        family(
            out,
            "lightswitch_stack_copy_walks_total",
            "counter",
            "Samples whose BPF walk stopped for want of a table or mapping and came with a copy \
             of the stack, by what user space made of it: walked on to the end, walked until the \
             copy ended, left as sent (a pc in no mapping, no rows in time), not held (no room); \
             and not_sent: such samples that came without a copy (their ring too full, the stack \
             unreadable).",
            &[
                ("outcome=\"walked_on\"", d.finished),
                ("outcome=\"deeper_than_copy\"", d.copy_ended),
                ("outcome=\"no_mapping\"", d.no_mapping),
                ("outcome=\"no_rows_in_time\"", d.expired),
                ("outcome=\"not_held\"", d.no_room),
                ("outcome=\"not_sent\"", d.not_sent),
            ],
        );
        family(
            out,
            "lightswitch_unwind_table_bytes",
            "gauge",
            "Memory of the unwind-table rows loaded in BPF maps, bytes.",
            &[("", get(&self.unwind_table_bytes))],
        );
        family(
            out,
            "lightswitch_unwind_tables_loaded_total",
            "counter",
            "Unwind tables built or read from the cache and loaded.",
            &[("", get(&self.unwind_tables_loaded))],
        );
        family(
            out,
            "lightswitch_unwind_tables_evicted_total",
            "counter",
            "Unwind tables evicted to stay within the memory budget.",
            &[("", get(&self.unwind_tables_evicted))],
        );
        let kinds = [
            "kind=\"processes\"",
            "kind=\"mappings\"",
            "kind=\"objects\"",
        ];
        let tracker: Vec<(&str, u64)> = kinds
            .into_iter()
            .zip(self.tracker.iter().map(get))
            .collect();
        family(
            out,
            "lightswitch_tracker_entries",
            "gauge",
            "What the process tracker holds: processes, executable mappings, objects (open files).",
            &tracker,
        );
        family(
            out,
            "lightswitch_sampling_frequency_hertz",
            "gauge",
            "Frequency the perf events sample at, per CPU (0 while idle).",
            &[("", get(&self.sampling_freq_hz))],
        );
    }

    /// Continuous mode's windows and the samples whose mapping retired early.
    fn render_windows(&self, out: &mut String) {
        family(
            out,
            "lightswitch_windows_total",
            "counter",
            "Windows closed, dropped because symbolization fell behind, written (handed to the \
             sender), failed in the sender, and dropped because processing them panicked \
             (panicked also counts on-demand profiles).",
            &[
                ("outcome=\"closed\"", get(&self.windows_closed)),
                ("outcome=\"dropped\"", get(&self.windows_dropped)),
                ("outcome=\"written\"", get(&self.windows_written)),
                ("outcome=\"failed\"", get(&self.windows_failed)),
                ("outcome=\"panicked\"", get(&self.windows_panicked)),
            ],
        );
        family(
            out,
            "lightswitch_samples_missing_mapping_total",
            "counter",
            "Samples with a user frame whose mapping had been retired before its window was \
             handed over (the frame is left unsymbolized).",
            &[("", get(&self.samples_missing_mapping))],
        );
    }

    /// HTTP connections, the network sender's deliveries, on-demand requests.
    fn render_serving(&self, out: &mut String) {
        let c = &self.connections;
        family(
            out,
            "lightswitch_http_connections_total",
            "counter",
            "HTTP API: connections served, closed because --listen-max-connections \
             were open, and failed accept() calls (e.g. out of file descriptors).",
            &[
                ("outcome=\"accepted\"", get(&c.accepted)),
                ("outcome=\"refused\"", get(&c.refused)),
                ("outcome=\"accept_error\"", get(&c.accept_errors)),
            ],
        );
        if let Some(queue) = self.delivery.get() {
            let d = queue.stats();
            family(
                out,
                "lightswitch_sender_profiles_total",
                "counter",
                "Network sender: profiles by what happened to them.",
                &[
                    ("outcome=\"queued\"", d.queued),
                    ("outcome=\"sent\"", d.sent),
                    ("outcome=\"dropped\"", d.dropped),
                    ("outcome=\"rejected\"", d.rejected),
                    ("outcome=\"partial\"", d.partial),
                ],
            );
            family(
                out,
                "lightswitch_sender_retries_total",
                "counter",
                "Network sender: attempts that failed transiently.",
                &[("", d.retried)],
            );
            family(
                out,
                "lightswitch_sender_sent_bytes_total",
                "counter",
                "Network sender: body bytes of the profiles the server accepted.",
                &[("", d.bytes)],
            );
        }
        let mut requests: Vec<(String, u64)> = lock(&self.profile_requests)
            .iter()
            .map(|(outcome, n)| (format!("outcome=\"{outcome}\""), *n))
            .collect();
        requests.sort();
        let requests: Vec<(&str, u64)> = requests.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        family(
            out,
            "lightswitch_profile_requests_total",
            "counter",
            "On-demand profile requests by outcome.",
            &requests,
        );
        family(
            out,
            "lightswitch_profile_requests_in_progress",
            "gauge",
            "On-demand profile requests in progress.",
            &[("", get(&self.profile_requests_active))],
        );
    }
}

/// A counter's current value.
fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// One metric family: `# HELP`, `# TYPE` and a line per label set (`""`
/// for none; labels are written `key="value"` without braces).
fn family(out: &mut String, name: &str, kind: &str, help: &str, series: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in series {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// The debuginfod client's counts (`stats`: none when no server is set,
/// and then no family): what it fetched, found cached, could not get, and
/// what its limits cut (`DEBUGINFOD_TIMEOUT`, `DEBUGINFOD_MAXSIZE`, the
/// window's debuginfod budget).
fn render_debuginfod(out: &mut String, stats: Option<DebuginfodStats>) {
    let Some(d) = stats else {
        return;
    };
    family(
        out,
        "lightswitch_debuginfod_total",
        "counter",
        "Debuginfod: debug files fetched, found in the cache, build IDs no server could serve, \
         requests ended by their deadline, requests refused or cut over the size cap, build IDs \
         left for a later window because the window's debuginfod budget was spent.",
        &[
            ("outcome=\"fetched\"", d.fetched),
            ("outcome=\"cached\"", d.cached),
            ("outcome=\"failed\"", d.failed),
            ("outcome=\"timed_out\"", d.timed_out),
            ("outcome=\"too_large\"", d.too_large),
            ("outcome=\"skipped\"", d.skipped),
        ],
    );
}

/// MiniDebugInfo sections (`.gnu_debugdata`) read, and skipped as corrupt
/// or too large.
fn render_minidebuginfo(out: &mut String, m: MiniDebugInfoStats) {
    family(
        out,
        "lightswitch_minidebuginfo_total",
        "counter",
        "MiniDebugInfo (.gnu_debugdata) sections decompressed and read, skipped as corrupt, \
         skipped because their index announced more than the size read.",
        &[
            ("outcome=\"read\"", m.read),
            ("outcome=\"corrupt\"", m.corrupt),
            ("outcome=\"too_large\"", m.too_large),
        ],
    );
}

/// The window worker counts into `/metrics`.
impl WindowCounters for Metrics {
    fn window_closed(&self) {
        Metrics::window_closed(self);
    }

    fn window_dropped(&self) {
        Metrics::window_dropped(self);
    }

    fn window_written(&self) {
        Metrics::window_written(self);
    }

    fn window_failed(&self) {
        Metrics::window_failed(self);
    }

    fn window_panicked(&self) {
        Metrics::window_panicked(self);
    }

    fn add_samples_missing_mapping(&self, n: u64) {
        Metrics::add_samples_missing_mapping(self, n);
    }
}

/// The process's resident memory, bytes, from `/proc/self/statm` (second
/// field, in pages); `None` if it cannot be read.
pub fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page_size).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_help_type_and_values() {
        let m = Metrics::default();
        m.sample(UnwindStatus::Complete);
        m.sample(UnwindStatus::Complete);
        m.sample(UnwindStatus::NoTable);
        m.set_lost(4);
        m.set_tracker(3, 40, 7);
        m.set_bpf_variant("compat");
        m.profile_request("served");
        m.set_deferred(DeferredStats {
            held: 3,
            finished: 2,
            no_room: 1,
            ..DeferredStats::default()
        });
        let heap = HeapStats {
            allocated: 10,
            active: 20,
            metadata: 3,
            resident: 30,
            retained: 40,
        };
        let text = m.render(Some(4096), Some(heap));
        assert!(text.contains("lightswitch_heap_bytes{kind=\"allocated\"} 10\n"));
        assert!(text.contains("lightswitch_heap_bytes{kind=\"resident\"} 30\n"));
        assert!(text
            .contains("# TYPE lightswitch_samples_total counter\nlightswitch_samples_total 3\n"));
        assert!(text.contains("lightswitch_samples_lost_total 4\n"));
        assert!(text.contains("lightswitch_bpf_program_variant{variant=\"compat\"} 1\n"));
        assert!(text.contains("lightswitch_tracker_entries{kind=\"mappings\"} 40\n"));
        assert!(text.contains("lightswitch_tracker_entries{kind=\"objects\"} 7\n"));
        assert!(text.contains("lightswitch_unwind_results_total{result=\"complete\"} 2\n"));
        assert!(text.contains("lightswitch_unwind_results_total{result=\"no_table\"} 1\n"));
        assert!(text.contains("lightswitch_profile_requests_total{outcome=\"served\"} 1\n"));
        assert!(text.contains("lightswitch_stack_copy_walks_total{outcome=\"walked_on\"} 2\n"));
        assert!(text.contains("lightswitch_stack_copy_walks_total{outcome=\"not_held\"} 1\n"));
        assert!(text.contains("process_resident_memory_bytes 4096\n"));
        assert!(text.contains("# TYPE lightswitch_jit_files_total counter\n"));
        assert!(text.contains("lightswitch_jit_files_total{kind=\"records_skipped\"} "));
        assert!(text.contains("lightswitch_jit_file_bytes_unread_total "));
        assert!(!text.contains("lightswitch_sender_"));
        assert!(resident_memory_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn renders_debuginfod_counts_only_when_a_server_is_set() {
        let mut text = String::new();
        render_debuginfod(&mut text, None);
        assert_eq!(text, "");
        let stats = DebuginfodStats {
            fetched: 1,
            timed_out: 2,
            too_large: 3,
            skipped: 4,
            ..DebuginfodStats::default()
        };
        render_debuginfod(&mut text, Some(stats));
        assert!(text.contains("# TYPE lightswitch_debuginfod_total counter\n"));
        assert!(text.contains("lightswitch_debuginfod_total{outcome=\"fetched\"} 1\n"));
        assert!(text.contains("lightswitch_debuginfod_total{outcome=\"timed_out\"} 2\n"));
        assert!(text.contains("lightswitch_debuginfod_total{outcome=\"too_large\"} 3\n"));
        assert!(text.contains("lightswitch_debuginfod_total{outcome=\"skipped\"} 4\n"));
        assert!(text.contains("lightswitch_debuginfod_total{outcome=\"failed\"} 0\n"));
    }
}
