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

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::ValueEnum;

mod agent;

use crate::hostile::{self, HostileConfig, Neighbours};
use crate::measure;
use crate::profiler::Tools;
use crate::readings::{memory_summary, mib, Reading};
use crate::report::{self, num};
use crate::verdict::{self, AgentOutcome};
use agent::{scrape, Agent, LOST, MISSING, PANICKED, SAMPLES, STOP_DEADLINE, WRITTEN};

/// Which processes the churn loops start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChurnLoad {
    /// `workload 0.02; /bin/true; ls /; sleep 0.05` (the first churn loop).
    Shell,
    /// `workload 0.02; sh -c "exec workload 0.01"; python3 -c ...` back to
    /// back, and a second loop of `workload 0.03` (decision 0007's reproducers:
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

fn churn_script(load: ChurnLoad, workload: &Path) -> Vec<String> {
    let w = shell_quote(workload);
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
        .map(|&w| {
            Agent::start(
                tools,
                config.freq,
                config.every_s,
                config.hostile.is_some(),
                w,
            )
        })
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
    let mut log = config.log.as_deref().map(open_log).transpose()?;
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
    check_agents(&agents, verdict_failed)
}

/// `--churn-log`'s file, opened for appending (created if missing).
fn open_log(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// The soak's result: an error naming each agent that crashed, did not
/// exit 0 or dropped windows after a panic, and a failed hostile verdict.
fn check_agents(agents: &[Agent], verdict_failed: bool) -> Result<()> {
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

/// `path` quoted for a POSIX shell.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}
