//! `GET /v1/timeline` from profiles held in memory (the agent's recordings,
//! [`crate::agent::api::recordings`]), and the query parameters it shares with
//! `GET /v1/profiles/merged` there: a time range, a bucket width and the
//! sample filters.
//!
//! The answer (JSON, one line):
//!
//! ```text
//! {"from":"NS","to":"NS","step":"NS","buckets":N,
//!  "hosts":[{"host":"h","total":n,"counts":[[i,c],...],
//!    "processes":[{"pid":1,"comm":"x","total":n,"counts":[[i,c],...],
//!      "threads":[{"tid":1,"name":"t","total":n,"counts":[[i,c],...]}]}]}]}
//! ```
//!
//! Times are decimal strings of ns since the Unix epoch (they pass 2^53);
//! `counts` are sparse `[bucket, samples]` pairs in bucket order; bucket `i`
//! covers `[from + i*step, from + (i+1)*step)`. A range of more than
//! [`MAX_BUCKETS`] steps is refused (413, the page then takes a larger
//! step), so the answer's size is bounded by the buckets times the rows.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::profile::{Profile, Sample};
use crate::util::timefmt;

/// Most buckets one timeline query may ask for, on both servers (413
/// beyond, naming the largest range).
pub const MAX_BUCKETS: u64 = 20_000;

/// Which samples a query covers beyond its time range: each filter that is
/// set must match (host name, process id, thread id, process name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleFilter {
    /// Host name, exactly.
    pub host: Option<String>,
    /// Process id.
    pub pid: Option<u32>,
    /// Thread id.
    pub tid: Option<u32>,
    /// Process name, exactly.
    pub comm: Option<String>,
}

impl SampleFilter {
    /// Whether `sample`, taken on `host`, passes.
    pub fn matches(&self, host: &str, sample: &Sample) -> bool {
        self.host.as_deref().is_none_or(|h| h == host)
            && self.pid.is_none_or(|p| p == sample.pid)
            && self.tid.is_none_or(|t| t == sample.tid)
            && self
                .comm
                .as_deref()
                .is_none_or(|c| c == &*sample.process_comm)
    }

    /// The filters of a query's `host`, `pid`, `tid`, `comm` (empty values
    /// are absent); errors are the 400 message.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self, String> {
        let id = |key: &str| -> Result<Option<u32>, String> {
            value(pairs, key)
                .map(|v| {
                    v.parse()
                        .map_err(|_| format!("{key}={v:?} is not a number"))
                })
                .transpose()
        };
        Ok(SampleFilter {
            host: value(pairs, "host").map(str::to_string),
            pid: id("pid")?,
            tid: id("tid")?,
            comm: value(pairs, "comm").map(str::to_string),
        })
    }
}

/// The last non-empty value of `key` in a query's pairs.
pub fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// A required time parameter (ns since the Unix epoch or RFC 3339); errors
/// are the 400 message.
pub fn time(pairs: &[(String, String)], key: &str) -> Result<u64, String> {
    let text = value(pairs, key).ok_or_else(|| format!("{key}= is missing"))?;
    timefmt::parse(text).ok_or_else(|| {
        format!("{key}={text:?} is not a time (ns since the Unix epoch, or RFC 3339)")
    })
}

/// A range `[FROM_KEY, TO_KEY)` whose ends may be left out: from the
/// start of time (0) and to its end (`u64::MAX`), as both servers' merged
/// profiles take it; errors are the 400 message.
pub fn range_or_all(
    pairs: &[(String, String)],
    from: &str,
    to: &str,
) -> Result<(u64, u64), String> {
    let end = |key: &str, absent: u64| match value(pairs, key) {
        Some(_) => time(pairs, key),
        None => Ok(absent),
    };
    let (a, b) = (end(from, 0)?, end(to, u64::MAX)?);
    if b <= a {
        return Err(format!("{to}= must be after {from}="));
    }
    Ok((a, b))
}

/// A required range `[FROM_KEY, TO_KEY)`; errors are the 400 message.
pub fn range(pairs: &[(String, String)], from: &str, to: &str) -> Result<(u64, u64), String> {
    let (a, b) = (time(pairs, from)?, time(pairs, to)?);
    if b <= a {
        return Err(format!("{to}= must be after {from}="));
    }
    Ok((a, b))
}

/// A validated timeline query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineQuery {
    /// Start, ns since the Unix epoch.
    pub from: u64,
    /// End (exclusive), ns since the Unix epoch.
    pub to: u64,
    /// Bucket width, ns.
    pub step: u64,
    /// Which samples count.
    pub filter: SampleFilter,
}

/// Why a timeline query is refused: a bad parameter (400) or too many
/// buckets for the step (413); the text says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// 400.
    Bad(String),
    /// 413.
    TooLarge(String),
}

impl TimelineQuery {
    /// `from`, `to`, `step` (ns) and the filters of a query.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, QueryError> {
        let (from, to) = range(pairs, "from", "to").map_err(QueryError::Bad)?;
        let step = match value(pairs, "step") {
            None => return Err(QueryError::Bad("step= is missing".into())),
            Some(s) => s
                .parse::<u64>()
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| QueryError::Bad(format!("step={s:?} is not a number of ns")))?,
        };
        let buckets = (to - from).div_ceil(step);
        if buckets > MAX_BUCKETS {
            return Err(QueryError::TooLarge(format!(
                "{buckets} buckets of {step} ns in the range, more than {MAX_BUCKETS}: \
                 take a step of at least {} ns",
                (to - from).div_ceil(MAX_BUCKETS)
            )));
        }
        Ok(TimelineQuery {
            from,
            to,
            step,
            filter: SampleFilter::from_pairs(pairs).map_err(QueryError::Bad)?,
        })
    }

    /// Number of buckets.
    pub fn buckets(&self) -> u64 {
        (self.to - self.from).div_ceil(self.step)
    }
}

/// One series: total and sparse `[bucket, count]` pairs, ascending.
#[derive(Debug, Serialize)]
pub struct ThreadSeries {
    /// Thread id (0: the folded `other`).
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Samples in the range.
    pub total: u64,
    /// `[bucket index, count]` pairs, ascending index, only non-zero counts.
    pub counts: Vec<(u32, u64)>,
}

/// A process's series and its threads'.
#[derive(Debug, Serialize)]
pub struct ProcessSeries {
    /// Process id (0: the folded `other`).
    pub pid: u32,
    /// Process name.
    pub comm: String,
    /// Samples in the range.
    pub total: u64,
    /// `[bucket index, count]` pairs, ascending index, only non-zero counts.
    pub counts: Vec<(u32, u64)>,
    /// Its threads, busiest first.
    pub threads: Vec<ThreadSeries>,
}

/// A host's series and its processes'.
#[derive(Debug, Serialize)]
pub struct HostSeries {
    /// Host name.
    pub host: String,
    /// Samples in the range.
    pub total: u64,
    /// `[bucket index, count]` pairs, ascending index, only non-zero counts.
    pub counts: Vec<(u32, u64)>,
    /// Its processes, busiest first.
    pub processes: Vec<ProcessSeries>,
}

/// The answer of `GET /v1/timeline` on both servers (see the module's
/// documentation; times as decimal strings of ns since the Unix epoch).
#[derive(Debug, Serialize)]
pub struct Timeline {
    /// Start of the range, ns since the Unix epoch.
    pub from: String,
    /// End of the range (exclusive).
    pub to: String,
    /// Bucket width, ns.
    pub step: String,
    /// Number of buckets.
    pub buckets: u64,
    /// Hosts, by name.
    pub hosts: Vec<HostSeries>,
}

/// Samples per bucket while counting: sparse, in bucket order.
type Counts = BTreeMap<u64, u64>;

/// Per thread: its name and counts; per process: its name and threads.
type Threads = BTreeMap<u32, (String, Counts)>;
type Processes = BTreeMap<u32, (String, Threads)>;

/// Count the samples of `profiles` (each with its timeline: samples
/// without one have no time and are not counted) into `query`'s buckets.
/// A profile without a host counts under `unknown`.
pub fn build<'a>(
    profiles: impl IntoIterator<Item = &'a Profile>,
    query: &TimelineQuery,
) -> Timeline {
    let mut hosts: BTreeMap<String, Processes> = BTreeMap::new();
    for profile in profiles {
        let host = profile.host.as_deref().unwrap_or("unknown");
        for timed in &profile.timeline {
            let Some(sample) = profile.samples.get(timed.sample as usize) else {
                continue;
            };
            let at = profile.start_unix_ns.saturating_add_signed(timed.offset_ns);
            if !(query.from..query.to).contains(&at) || !query.filter.matches(host, sample) {
                continue;
            }
            let bucket = (at - query.from) / query.step;
            let process = hosts
                .entry(host.to_string())
                .or_default()
                .entry(sample.pid)
                .or_insert_with(|| (sample.process_comm.to_string(), BTreeMap::new()));
            let thread = process
                .1
                .entry(sample.tid)
                .or_insert_with(|| (sample.thread_comm.to_string(), BTreeMap::new()));
            *thread.1.entry(bucket).or_default() += 1;
        }
    }
    Timeline {
        from: query.from.to_string(),
        to: query.to.to_string(),
        step: query.step.to_string(),
        buckets: query.buckets(),
        hosts: hosts.into_iter().map(|(h, p)| host_row(h, p)).collect(),
    }
}

fn add_into(into: &mut Counts, counts: &Counts) {
    for (i, c) in counts {
        *into.entry(*i).or_default() += c;
    }
}

/// `counts` as `[bucket, count]` pairs (bucket indices are below
/// [`MAX_BUCKETS`], which the query checked).
fn sparse(counts: Counts) -> Vec<(u32, u64)> {
    counts.into_iter().map(|(i, c)| (i as u32, c)).collect()
}

fn host_row(host: String, processes: Processes) -> HostSeries {
    let mut counts = Counts::new();
    let processes: Vec<ProcessSeries> = processes
        .into_iter()
        .map(|(pid, (comm, threads))| {
            let mut process_counts = Counts::new();
            let threads: Vec<ThreadSeries> = threads
                .into_iter()
                .map(|(tid, (name, counts))| {
                    add_into(&mut process_counts, &counts);
                    ThreadSeries {
                        tid,
                        name,
                        total: counts.values().sum(),
                        counts: sparse(counts),
                    }
                })
                .collect();
            add_into(&mut counts, &process_counts);
            ProcessSeries {
                pid,
                comm,
                total: process_counts.values().sum(),
                counts: sparse(process_counts),
                threads,
            }
        })
        .collect();
    HostSeries {
        host,
        total: counts.values().sum(),
        counts: sparse(counts),
        processes,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::TimedSample;
    use crate::sampling::records::UnwindStatus;

    fn query(text: &str) -> Result<TimelineQuery, QueryError> {
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(text.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        TimelineQuery::parse(&pairs)
    }

    fn sample(pid: u32, tid: u32, count: u64) -> Sample {
        Sample {
            pid,
            tid,
            process_comm: Arc::from("app"),
            thread_comm: Arc::from(format!("t{tid}")),
            frames: vec![],
            unwind_status: UnwindStatus::Complete,
            count,
            off_cpu_ns: 0,
        }
    }

    #[test]
    fn samples_fall_into_their_buckets_per_host_process_and_thread() {
        let profile = Profile {
            start_unix_ns: 1_000,
            host: Some(Arc::from("h")),
            samples: vec![sample(7, 7, 2), sample(7, 8, 2)],
            // At 1000+{0, 99, 100, 250}: buckets of 100 from 1000.
            timeline: [(0, 0), (99, 1), (100, 0), (250, 1)]
                .map(|(offset_ns, sample)| TimedSample { offset_ns, sample })
                .to_vec(),
            ..Default::default()
        };
        let q = query("from=1000&to=1300&step=100").unwrap();
        let json = serde_json::to_string(&build([&profile], &q)).unwrap();
        assert_eq!(
            json,
            r#"{"from":"1000","to":"1300","step":"100","buckets":3,"hosts":[{"host":"h","total":4,"counts":[[0,2],[1,1],[2,1]],"processes":[{"pid":7,"comm":"app","total":4,"counts":[[0,2],[1,1],[2,1]],"threads":[{"tid":7,"name":"t7","total":2,"counts":[[0,1],[1,1]]},{"tid":8,"name":"t8","total":2,"counts":[[0,1],[2,1]]}]}]}]}"#
        );
        // [1099, 1250): the sample at 1099 in, the one at 1250 out.
        let q = query("from=1099&to=1250&step=1000&tid=8").unwrap();
        let json = serde_json::to_string(&build([&profile], &q)).unwrap();
        assert!(json.contains(r#""total":1,"counts":[[0,1]]"#), "{json}");
        assert!(!json.contains(r#""tid":7"#), "{json}");
    }

    #[test]
    fn too_many_buckets_is_413_and_bad_values_400() {
        assert!(
            matches!(query("from=0&to=1000000&step=1"), Err(QueryError::TooLarge(m)) if m.contains("at least 50 ns"))
        );
        assert!(matches!(
            query("from=5&to=5&step=1"),
            Err(QueryError::Bad(_))
        ));
        assert!(matches!(
            query("from=0&to=10&step=0"),
            Err(QueryError::Bad(_))
        ));
        assert!(matches!(
            query("from=0&to=10&step=1&pid=x"),
            Err(QueryError::Bad(_))
        ));
        assert_eq!(query("from=0&to=10&step=3").unwrap().buckets(), 4);
    }
}
