//! Counters the agent exports at `GET /metrics`, in the Prometheus text
//! exposition format (version 0.0.4). The sampling loop updates them (atomics
//! and short-held locks); the HTTP server renders them on each scrape.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

mod families;
use families::{
    family, render_debuginfod, render_jit_files, render_minidebuginfo, render_objects_given_up,
    render_process, render_python, render_symbol_tables,
};

use crate::agent::heap::HeapStats;
use crate::agent::http::serve::ConnectionStats;
use crate::output::sender::queue::Queue;
use crate::output::sender::worker::WindowCounters;
use crate::sampling::records::UnwindStatus;
use crate::sampling::sampler::off_cpu::OffCpuCounts;
use crate::symbolize::debuginfod::Debuginfod;
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
    windows_merged: AtomicU64,
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
    debuginfod: OnceLock<Option<Arc<Debuginfod>>>,
    connections: Arc<ConnectionStats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counters stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// An on-CPU sample read from the ring buffer, with how its user-stack
    /// walk ended (off-CPU waits are counted by [`Self::set_off_cpu`]).
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
    /// [`crate::sampling::sampler::variant`]); set once.
    pub fn set_bpf_variant(&self, name: &'static str) {
        let _ = self.bpf_variant.set(name);
    }

    /// Continuous mode: a window closed (counted before it is handed on,
    /// so that a scrape never sees more windows written than closed).
    pub fn window_closed(&self) {
        self.windows_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Continuous mode: a closed window was merged into an earlier held one
    /// because symbolization was behind (its samples are in that window's profile).
    pub fn window_merged(&self) {
        self.windows_merged.fetch_add(1, Ordering::Relaxed);
    }

    /// Continuous mode: a closed window was dropped because the window
    /// worker had stopped.
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

    /// The run's debuginfod client (`None`: no servers), whose counters
    /// are exported.
    pub fn set_debuginfod(&self, client: Option<Arc<Debuginfod>>) {
        let _ = self.debuginfod.set(client);
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
    /// resident memory and `heap` jemalloc's counters ([`crate::agent::heap::stats`]),
    /// both read by the caller.
    pub fn render(&self, rss_bytes: Option<u64>, heap: Option<HeapStats>) -> String {
        let mut out = String::new();
        self.render_sampling(&mut out);
        self.render_unwinding(&mut out);
        self.render_windows(&mut out);
        self.render_serving(&mut out);
        render_jit_files(&mut out);
        render_objects_given_up(&mut out);
        render_python(&mut out);
        let debuginfod = self.debuginfod.get().and_then(Option::as_ref);
        render_debuginfod(&mut out, debuginfod.map(|d| d.stats()));
        render_minidebuginfo(&mut out, crate::symbolize::minidebuginfo::stats());
        render_symbol_tables(&mut out, crate::symbolize::object_tables::builds());
        render_process(&mut out, rss_bytes, heap);
        out
    }

    /// The BPF programs' variant, samples, lost samples, unwind results,
    /// off-CPU waits.
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
            "On-CPU samples read from the BPF ring buffer (off-CPU waits: \
             lightswitch_off_cpu_waits_total).",
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
    }

    /// The walks from stack copies, the unwind tables, the process
    /// tracker's entries and the sampling frequency.
    fn render_unwinding(&self, out: &mut String) {
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
            "Windows closed, merged into an earlier held window because symbolization was \
             behind (their samples are in its profile), dropped because the window worker had \
             stopped, written (handed to the sender), failed in the sender, and dropped because \
             processing them panicked (panicked also counts on-demand profiles).",
            &[
                ("outcome=\"closed\"", get(&self.windows_closed)),
                ("outcome=\"merged\"", get(&self.windows_merged)),
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
            if let Some(spool) = &d.spool {
                family(
                    out,
                    "lightswitch_sender_spool_total",
                    "counter",
                    "Network sender with --spool-dir: profiles by what the spool did with them.",
                    &[
                        ("outcome=\"kept\"", spool.kept),
                        ("outcome=\"resent\"", spool.resent),
                        ("outcome=\"skipped\"", spool.skipped),
                        ("outcome=\"failed\"", spool.failed),
                        ("outcome=\"evicted\"", spool.evicted),
                    ],
                );
            }
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

/// The window worker counts into `/metrics`.
impl WindowCounters for Metrics {
    fn window_closed(&self) {
        Metrics::window_closed(self);
    }

    fn window_merged(&self) {
        Metrics::window_merged(self);
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
mod tests;
