//! `GET /metrics` of the collector: its sample store's counters and size,
//! failed writes and free space, in the Prometheus text format (version
//! 0.0.4).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::sample_store::health;
use super::state::AppState;
use crate::agent::http::blocking;

/// The metrics text for `state` (counters, then gauges).
pub fn text(state: &AppState) -> String {
    let store = &state.store;
    let s = &store.stats;
    let mut out = String::new();
    let counters = [
        (
            "samples_stored_total",
            "On-CPU samples stored.",
            &s.samples_stored,
        ),
        (
            "off_cpu_waits_stored_total",
            "Off-CPU waits stored (--off-cpu).",
            &s.waits_stored,
        ),
        ("blocks_written_total", "Blocks written.", &s.blocks_written),
        (
            "blocks_skipped_total",
            "Blocks a query found damaged or unreadable and skipped.",
            &s.blocks_skipped,
        ),
        (
            "retention_deleted_by_age_total",
            "Blocks and archived pprof files deleted by --retention.",
            &s.deleted_by_age,
        ),
        (
            "retention_deleted_by_size_total",
            "Blocks and archived pprof files deleted to fit --max-storage.",
            &s.deleted_by_size,
        ),
        (
            "retention_deleted_bytes_total",
            "Bytes deleted by retention.",
            &s.deleted_bytes,
        ),
        (
            "duplicate_windows_total",
            "Requests whose window was stored before (sent again): answered, not stored twice.",
            &s.duplicates,
        ),
        (
            "incomplete_blocks_removed_total",
            "Blocks of requests found incomplete at start-up (never acknowledged) and removed.",
            &s.incomplete_removed,
        ),
        (
            "failed_writes_total",
            "Requests whose storing failed (nothing of them kept).",
            &store.health.failed_writes,
        ),
        (
            "unavailable_total",
            "Of the failed writes, those that may pass (full disk, quota, I/O error): answered 503.",
            &store.health.unavailable,
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP lightswitch_collector_{name} {help}");
        let _ = writeln!(out, "# TYPE lightswitch_collector_{name} counter");
        let _ = writeln!(
            out,
            "lightswitch_collector_{name} {}",
            value.load(Ordering::Relaxed)
        );
    }
    let gauges = [
        (
            "store_bytes",
            "Bytes of the sample store on disk (blocks and stack table).",
            store.disk_bytes(),
        ),
        (
            "store_blocks",
            "Blocks in the sample store.",
            store.block_count() as u64,
        ),
        (
            "storage_free_bytes",
            "Bytes free on the storage's file system (statvfs f_bavail).",
            health::free_bytes(store.root()).unwrap_or(0),
        ),
        (
            "storage_failing",
            "1 while storing fails (the last write failed), else 0.",
            u64::from(store.health.is_failing()),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP lightswitch_collector_{name} {help}");
        let _ = writeln!(out, "# TYPE lightswitch_collector_{name} gauge");
        let _ = writeln!(out, "lightswitch_collector_{name} {value}");
    }
    out
}

/// `GET /metrics`.
pub async fn render(State(state): State<AppState>) -> Response {
    blocking(move || {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            text(&state),
        )
            .into_response()
    })
    .await
}
