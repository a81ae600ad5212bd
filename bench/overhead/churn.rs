//! Churn soak (issues 7 and 18): lightswitch in continuous mode for a long
//! time while shell loops start short-lived processes. One agent runs per
//! window length (`--windows 10,1`: two agents at once, under the same churn
//! load). Every tick the harness reads, per agent: `VmRSS` and `RssAnon`
//! (`/proc/PID/status`), CPU time (`/proc/PID/task/*/schedstat`), and its own
//! counters from `GET /metrics` (samples, lost, windows written, windows
//! dropped after a panic, samples whose mapping had been retired). An agent
//! that exits before the end is a crash: its exit status and the panic
//! message in its stderr are recorded, and the others go on.
//!
//! The report block is rewritten after every tick, so a soak stopped early
//! (or still running) leaves its numbers so far; `--churn-log` also appends
//! one tab-separated line per agent and tick.
//!
//! With `--hostile N` ([`crate::hostile`]), hostile neighbours and a root
//! bystander run beside the churn, and the run ends with their verdict.
//! Agents are stopped with SIGINT and get [`STOP_DEADLINE`] to exit; one
//! still running then is killed (SIGKILL) and counted as failed, so the
//! harness itself never waits for a hung agent.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::ValueEnum;

use crate::hostile::{self, HostileConfig, Neighbours, Tally};
use crate::measure::{self, CpuTime};
use crate::profiler::{self, Kind, Running, Tools};
use crate::readings::{memory_summary, mib, Reading};
use crate::report::{self, num};
use crate::verdict::{self, AgentOutcome};

/// Which processes the churn loops start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChurnLoad {
    /// `workload 0.02; /bin/true; ls /; sleep 0.05` (issue 7's loop).
    Shell,
    /// `workload 0.02; sh -c "exec workload 0.01"; python3 -c ...` back to
    /// back, and a second loop of `workload 0.03` (issue 18's reproducers:
    /// no-frame-pointer programs, shells that exec them, Python).
    Mixed,
}

/// Settings of one churn soak.
pub struct ChurnConfig {
    /// Length of the run, s.
    pub seconds: f64,
    /// Window length of each agent, s (one agent per entry).
    pub windows_s: Vec<f64>,
    /// Sampling frequency of every agent, Hz.
    pub freq: u64,
    /// What the churn loops run.
    pub load: ChurnLoad,
    /// Copies of the churn loop.
    pub loops: usize,
    /// Time between two readings, s.
    pub every_s: f64,
    /// File to append one tab-separated line per agent and reading to.
    pub log: Option<PathBuf>,
    /// The markdown file whose `churn` block is rewritten.
    pub doc: PathBuf,
    /// CPUs of the machine (for the report's first line).
    pub cpus: usize,
    /// Hostile neighbours beside the churn (`--hostile N`).
    pub hostile: Option<HostileConfig>,
}

/// How long an agent has to exit after SIGINT before it is killed.
const STOP_DEADLINE: Duration = Duration::from_secs(60);
/// VmRSS above which a hostile soak's agent is killed, KiB (the machine is
/// shared: an agent growing without bound is stopped well before it hurts).
const RSS_KILL_KIB: u64 = 1 << 20;

/// One agent under test.
struct Agent {
    window_s: f64,
    port: u16,
    running: Option<Running>,
    cpu: Option<CpuTime>,
    readings: Vec<Reading>,
    /// How it ended, if it exited before the end (a crash).
    crash: Option<String>,
    /// Its exit at the end: `exit 0`, or what went wrong.
    exit: Option<String>,
    /// Its `windows: closed=...` summary line, once it exited 0.
    summary: Option<String>,
    /// Where it writes its windows.
    out_dir: PathBuf,
    /// Hostile soaks: the bystander's samples in its folded files.
    tally: Option<Tally>,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `GET /metrics` of the agent listening on `port`, parsed into series.
fn scrape(client: &reqwest::blocking::Client, port: u16) -> HashMap<String, f64> {
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

fn churn_script(load: ChurnLoad, workload: &Path) -> Vec<String> {
    let w = crate::shell_quote(workload);
    match load {
        ChurnLoad::Shell => vec![format!(
            "while :; do {w} 0.02 >/dev/null; /bin/true; ls / >/dev/null; sleep 0.05; done"
        )],
        ChurnLoad::Mixed => vec![
            format!(
                "while :; do {w} 0.02; sh -c \"exec {w} 0.01\"; python3 -c 'sum(range(5000))'; done"
            ),
            format!("while :; do {w} 0.03; done"),
        ],
    }
}

/// The churn loops: each a process group of its own, killed on drop.
struct Churn(Vec<Child>);

impl Churn {
    fn start(config: &ChurnConfig, workload: &Path) -> Result<Self> {
        let mut loops = Vec::new();
        for _ in 0..config.loops.max(1) {
            for script in churn_script(config.load, workload) {
                loops.push(
                    Command::new("sh")
                        .args(["-c", &script])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .process_group(0)
                        .spawn()
                        .context("starting a churn loop")?,
                );
            }
        }
        Ok(Churn(loops))
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // SAFETY: kill has no memory-safety preconditions; the group is the loop's own.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

impl Agent {
    fn start(tools: &Tools, config: &ChurnConfig, window_s: f64) -> Result<Self> {
        let port = free_port()?;
        // Hostile soaks also write folded stacks (the bystander is counted
        // in them), and keep every file for 3 readings (at least 30 s).
        let (formats, keep) = match config.hostile {
            None => ("pprof", 3),
            Some(_) => (
                "pprof,folded",
                (3.0 * config.every_s.max(10.0) / window_s).ceil() as usize + 3,
            ),
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
        let running = profiler::start(tools, Kind::Lightswitch, config.freq, &name, &extra)?;
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
            tally: config.hostile.as_ref().map(|_| Tally::default()),
        })
    }

    /// Take one reading (or notice that the agent has crashed).
    fn read(&mut self, client: &reqwest::blocking::Client, t_s: f64, every_s: f64) {
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
    fn finish(&mut self, tools: &Tools, deadline: Instant) {
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
    fn outcome(&self, every_s: f64, expected: f64) -> Option<AgentOutcome<'_>> {
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

    fn label(&self) -> String {
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

/// Run the soak; the report goes to `config.doc`'s `churn` block (rewritten
/// after every reading). Errors if an agent crashed or did not exit 0.
pub fn churn(tools: &Tools, workload: &Path, config: &ChurnConfig) -> Result<()> {
    eprintln!(
        "churn: {} s, windows {:?} s, {} Hz, {:?} load x{}, a reading every {} s",
        config.seconds, config.windows_s, config.freq, config.load, config.loops, config.every_s
    );
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut agents = config
        .windows_s
        .iter()
        .map(|&w| Agent::start(tools, config, w))
        .collect::<Result<Vec<_>>>()?;
    // The time and load average of the start, not of each rewrite.
    let machine = report::machine_line(config.cpus, "{conditions}");
    let mut neighbours = match &config.hostile {
        Some(h) => {
            let ports: Vec<u16> = agents.iter().map(|a| a.port).collect();
            Some(hostile::start(h, || {
                ports
                    .iter()
                    .all(|&p| scrape(&client, p).get(SAMPLES).is_some_and(|&n| n > 0.0))
            })?)
        }
        None => None,
    };
    let churn = Churn::start(config, workload)?;
    let forks_before = measure::forks()?;
    let started = Instant::now();
    let mut log = match &config.log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => None,
    };
    let ticks = (config.seconds / config.every_s).ceil().max(1.0) as usize;
    for i in 1..=ticks {
        let due = started + Duration::from_secs_f64(config.every_s * i as f64);
        sleep(due.saturating_duration_since(Instant::now()));
        let t_s = started.elapsed().as_secs_f64();
        for agent in &mut agents {
            agent.read(&client, t_s, config.every_s);
            if let (Some(log), Some(r)) = (log.as_mut(), agent.readings.last()) {
                let _ = writeln!(log, "{}", log_line(agent, r));
            }
        }
        let forks = measure::forks()?.saturating_sub(forks_before);
        let body = render(config, &machine, &agents, forks, t_s);
        report::write_block(&config.doc, "churn", &body)?;
        if agents.iter().all(|a| a.running.is_none()) {
            break;
        }
    }
    drop(churn);
    // Stopped first, so that every sample of it is in a window the agents
    // write when they stop.
    let bystander_cpu_s = neighbours
        .as_mut()
        .map(Neighbours::stop_bystander)
        .transpose()?;
    for agent in &agents {
        if let Some(running) = &agent.running {
            running.interrupt();
        }
    }
    let deadline = Instant::now() + STOP_DEADLINE;
    for agent in &mut agents {
        agent.finish(tools, deadline);
    }
    // The agents first: a hung one meets the neighbours until it is killed.
    drop(neighbours);
    let forks = measure::forks()?.saturating_sub(forks_before);
    let mut body = render(
        config,
        &machine,
        &agents,
        forks,
        started.elapsed().as_secs_f64(),
    );
    let mut verdict_failed = false;
    if let Some(cpu_s) = bystander_cpu_s {
        let expected = cpu_s * config.freq as f64;
        let outcomes: Vec<AgentOutcome> = agents
            .iter()
            .filter_map(|a| a.outcome(config.every_s, expected))
            .collect();
        let (text, ok) = verdict::verdict(&outcomes);
        body.push('\n');
        body.push_str(&text);
        verdict_failed = !ok;
    }
    println!("{body}");
    report::write_block(&config.doc, "churn", &body)?;
    let mut failed: Vec<String> = agents
        .iter()
        .filter_map(|a| {
            let exit = a.exit.as_deref().unwrap_or("");
            (a.crash.is_some() || exit != "exit 0" || panicked_windows(a) > 0.0).then(|| {
                format!(
                    "{} windows: {}",
                    a.label(),
                    a.crash.clone().unwrap_or(exit.to_string())
                )
            })
        })
        .collect();
    if verdict_failed {
        failed.push("the hostile-neighbour verdict failed (see above)".to_string());
    }
    if !failed.is_empty() {
        anyhow::bail!("churn soak failed: {}", failed.join("; "));
    }
    Ok(())
}

fn panicked_windows(agent: &Agent) -> f64 {
    agent
        .readings
        .last()
        .and_then(|r| r.metric(PANICKED))
        .unwrap_or(0.0)
}

const SAMPLES: &str = "lightswitch_samples_total";
const LOST: &str = "lightswitch_samples_lost_total";
const WRITTEN: &str = "lightswitch_windows_total{outcome=\"written\"}";
const PANICKED: &str = "lightswitch_windows_total{outcome=\"panicked\"}";
const MISSING: &str = "lightswitch_samples_missing_mapping_total";

fn log_line(agent: &Agent, r: &Reading) -> String {
    let m = |s| r.metric(s).map_or("-".to_string(), |v| format!("{v:.0}"));
    format!(
        "{}\t{:.0}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        agent.window_s,
        r.t_s,
        r.peak_kib,
        r.vm_rss_kib,
        r.rss_anon_kib,
        num(r.cpu_pct, 1),
        m(SAMPLES),
        m(LOST),
        m(WRITTEN),
        m(PANICKED),
        m(MISSING)
    )
}

/// The report; `machine` is [`report::machine_line`] as of the start, with
/// `{conditions}` where the run's conditions go.
fn render(
    config: &ChurnConfig,
    machine: &str,
    agents: &[Agent],
    forks: u64,
    elapsed_s: f64,
) -> String {
    let conditions = format!(
        "lightswitch at {} Hz in continuous mode (pprof to disk, 3 kept), one agent per window length \
         ({} s), all at once, for {} s ({:.0} s so far) under the `{:?}` churn load x{}; {} processes started \
         ({:.1}/s, whole machine)",
        config.freq,
        config
            .windows_s
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(" s and "),
        config.seconds,
        elapsed_s,
        config.load,
        config.loops,
        forks,
        forks as f64 / elapsed_s.max(1.0)
    );
    let mut conditions = conditions;
    if let Some(h) = &config.hostile {
        let _ = write!(
            conditions,
            "; hostile neighbours (user nobody): {}; a root bystander ({}) spinning from the agents' first samples to their stop",
            h.describe(),
            hostile::BYSTANDER_CHAIN
        );
    }
    let mut out = machine.replace("{conditions}", &conditions);
    out.push_str("\n\n");
    for agent in agents {
        let state = match (&agent.crash, &agent.exit) {
            (Some(crash), _) => format!("**crashed** {crash}"),
            (None, Some(exit)) => exit.clone(),
            (None, None) => "running".to_string(),
        };
        let _ = writeln!(
            out,
            "- {} windows: {state}; {}",
            agent.label(),
            memory_summary(&agent.readings, config.seconds)
        );
    }
    let header = [
        "s",
        "window",
        "peak VmRSS MiB",
        "VmRSS MiB",
        "RssAnon MiB",
        "CPU %",
        "samples",
        "lost",
        "windows written",
        "windows panicked",
        "samples missing a mapping",
    ];
    // About 20 rows per agent, whatever the length of the run.
    let step = agents
        .iter()
        .map(|a| a.readings.len())
        .max()
        .unwrap_or(0)
        .div_ceil(20)
        .max(1);
    let mut rows = Vec::new();
    for agent in agents {
        let n = agent.readings.len();
        for (i, r) in agent.readings.iter().enumerate() {
            if (i + 1) % step != 0 && i + 1 != n {
                continue;
            }
            let m = |s| num(r.metric(s), 0);
            rows.push(vec![
                format!("{:.0}", r.t_s),
                agent.label(),
                format!("{:.1}", mib(r.peak_kib)),
                format!("{:.1}", mib(r.vm_rss_kib)),
                format!("{:.1}", mib(r.rss_anon_kib)),
                num(r.cpu_pct, 1),
                m(SAMPLES),
                m(LOST),
                m(WRITTEN),
                m(PANICKED),
                m(MISSING),
            ]);
        }
    }
    out.push('\n');
    out.push_str(&report::table(&header, &rows));
    out.push_str(
        "\nCPU %: the agent's user + system time between two readings, % of one CPU. samples, lost, \
         windows and samples missing a mapping: the agent's own counters (`/metrics`) since its start. \
         peak VmRSS: the highest VmRSS since the previous reading (`VmHWM`, reset after each reading).\n",
    );
    out
}
