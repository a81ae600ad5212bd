//! One agent of the churn soak: a lightswitch in continuous mode with
//! `--listen`, started, read every tick (memory, CPU, `/metrics`), and
//! stopped with SIGINT within [`STOP_DEADLINE`] or killed.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::hostile::Tally;
use crate::measure::{self, CpuTime};
use crate::profiler::{self, Kind, Running, Tools};
use crate::readings::{mib, Reading};
use crate::verdict::AgentOutcome;

/// How long an agent has to exit after SIGINT before it is killed.
pub const STOP_DEADLINE: Duration = Duration::from_secs(60);
/// VmRSS above which a hostile soak's agent is killed, KiB (the machine is
/// shared: an agent growing without bound is stopped well before it hurts).
const RSS_KILL_KIB: u64 = 1 << 20;

/// One agent under test.
pub struct Agent {
    /// Its window length, s.
    pub window_s: f64,
    /// The port its `--listen` server is on.
    pub port: u16,
    /// The process, until it exited or was stopped.
    pub running: Option<Running>,
    /// Its CPU time at the last reading.
    pub cpu: Option<CpuTime>,
    /// Every reading so far.
    pub readings: Vec<Reading>,
    /// How it ended, if it exited before the end (a crash).
    pub crash: Option<String>,
    /// Its exit at the end: `exit 0`, or what went wrong.
    pub exit: Option<String>,
    /// Its `windows: closed=...` summary line, once it exited 0.
    pub summary: Option<String>,
    /// Where it writes its windows.
    pub out_dir: PathBuf,
    /// Hostile soaks: the bystander's samples in its folded files.
    pub tally: Option<Tally>,
}

/// A TCP port free on 127.0.0.1 now.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `GET /metrics` of the agent listening on `port`, parsed into series.
pub fn scrape(client: &reqwest::blocking::Client, port: u16) -> HashMap<String, f64> {
    let Ok(text) = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .and_then(|r| r.text())
    else {
        return HashMap::new();
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// `/metrics` series the soak reads.
pub const SAMPLES: &str = "lightswitch_samples_total";
pub const LOST: &str = "lightswitch_samples_lost_total";
pub const WRITTEN: &str = "lightswitch_windows_total{outcome=\"written\"}";
pub const PANICKED: &str = "lightswitch_windows_total{outcome=\"panicked\"}";
pub const MISSING: &str = "lightswitch_samples_missing_mapping_total";

impl Agent {
    /// Start an agent with windows of `window_s` s at `freq` Hz, read
    /// every `every_s` s; `hostile`: it also writes folded stacks (the
    /// bystander is counted in them).
    pub fn start(
        tools: &Tools,
        freq: u64,
        every_s: f64,
        hostile: bool,
        window_s: f64,
    ) -> Result<Self> {
        let port = free_port()?;
        // Hostile soaks also write folded stacks (the bystander is counted
        // in them), and keep every file for 3 readings (at least 30 s).
        let (formats, keep) = if hostile {
            (
                "pprof,folded",
                (3.0 * every_s.max(10.0) / window_s).ceil() as usize + 3,
            )
        } else {
            ("pprof", 3)
        };
        let extra: Vec<String> = [
            "--profile-interval",
            &window_s.to_string(),
            "--max-profiles",
            &keep.to_string(),
            "--profile-format",
            formats,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ]
        .map(String::from)
        .to_vec();
        let name = format!("churn-{window_s}s");
        let running = profiler::start(tools, Kind::Lightswitch, freq, &name, &extra)?;
        Ok(Agent {
            window_s,
            port,
            running: Some(running),
            cpu: None,
            readings: Vec::new(),
            crash: None,
            exit: None,
            summary: None,
            out_dir: tools.scratch.join(&name),
            tally: hostile.then(Tally::default),
        })
    }

    /// Take one reading (or notice that the agent has crashed).
    pub fn read(&mut self, client: &reqwest::blocking::Client, t_s: f64, every_s: f64) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        if let Err(err) = running.check_alive() {
            let text = format!("{err:#}");
            let panic = text.lines().find(|l| l.contains("panicked")).unwrap_or("");
            self.crash = Some(format!("at {t_s:.0} s: {}", first_line(&text, panic)));
            eprintln!(
                "churn: agent with {} s windows crashed: {text}",
                self.window_s
            );
            self.running = None;
            return;
        }
        let pid = running.pid();
        let cpu = measure::cpu_time(pid).ok();
        let cpu_pct = match (&self.cpu, &cpu) {
            (Some(a), Some(b)) => Some(measure::cpu_between(a, b) as f64 / 1e9 / every_s * 100.0),
            _ => None,
        };
        self.cpu = cpu;
        let peak_kib = measure::status_kib(pid, "VmHWM").unwrap_or(0);
        if let Err(err) = measure::reset_peak_rss(pid) {
            eprintln!("churn: {err:#}");
        }
        let vm_rss_kib = measure::status_kib(pid, "VmRSS").unwrap_or(0);
        self.readings.push(Reading {
            t_s,
            peak_kib,
            vm_rss_kib,
            rss_anon_kib: measure::status_kib(pid, "RssAnon").unwrap_or(0),
            cpu_pct,
            metrics: scrape(client, self.port),
        });
        if let Some(tally) = self.tally.as_mut() {
            tally.scan(&self.out_dir);
            if vm_rss_kib > RSS_KILL_KIB {
                // Dropping it kills it (SIGKILL).
                self.running = None;
                self.crash = Some(format!(
                    "at {t_s:.0} s: killed by the harness, VmRSS {:.0} MiB > {:.0} MiB",
                    mib(vm_rss_kib),
                    mib(RSS_KILL_KIB)
                ));
                eprintln!(
                    "churn: agent with {} s windows {}",
                    self.window_s,
                    self.crash.as_deref().unwrap_or("")
                );
            }
        }
    }

    /// Wait until `deadline` for it to exit (after SIGINT), kill it
    /// (SIGKILL) if it has not, and record how it ended.
    pub fn finish(&mut self, tools: &Tools, deadline: Instant) {
        let Some(running) = self.running.take() else {
            return;
        };
        while running.alive() && Instant::now() < deadline {
            sleep(Duration::from_millis(100));
        }
        if running.alive() {
            let mut waiting = measure::waiting_in(running.pid());
            if waiting.is_empty() {
                waiting = "nothing but futex and epoll waits (busy, not blocked)".to_string();
            }
            // Dropping it kills it (SIGKILL) and reaps it.
            drop(running);
            self.exit = Some(format!(
                "no exit within {} s of SIGINT: killed (SIGKILL); its threads were waiting in {waiting}",
                STOP_DEADLINE.as_secs()
            ));
            return;
        }
        self.exit = Some(match running.wait(tools.perf.as_deref()) {
            Ok(finished) => {
                self.summary = finished
                    .stdout
                    .lines()
                    .find(|l| l.starts_with("windows: "))
                    .map(str::to_string);
                "exit 0".to_string()
            }
            Err(err) => format!("failed: {}", first_line(&format!("{err:#}"), "")),
        });
        if let Some(tally) = self.tally.as_mut() {
            tally.scan(&self.out_dir);
        }
    }

    /// What the hostile verdict needs of it; `expected` bystander samples.
    pub fn outcome(&self, every_s: f64, expected: f64) -> Option<AgentOutcome<'_>> {
        Some(AgentOutcome {
            label: self.label(),
            window_s: self.window_s,
            exit: self
                .crash
                .as_deref()
                .or(self.exit.as_deref())
                .unwrap_or("running"),
            summary: self.summary.as_deref(),
            written: self
                .readings
                .iter()
                .map(|r| (r.t_s, r.metric(WRITTEN)))
                .collect(),
            every_s,
            max_vm_rss_kib: self
                .readings
                .iter()
                .map(|r| r.vm_rss_kib)
                .max()
                .unwrap_or(0),
            tally: self.tally.as_ref()?,
            expected,
        })
    }

    pub fn label(&self) -> String {
        format!("{} s", self.window_s)
    }
}

fn first_line<'a>(text: &'a str, preferred: &'a str) -> &'a str {
    if preferred.is_empty() {
        text.lines().next().unwrap_or("")
    } else {
        preferred
    }
}
