//! From flags to plans: the profiling options ([`ProfileArgs`]) become a
//! [`RunPlan`] with its stages' configs (the sender's), and `record`'s a
//! [`RecordPlan`], once, here; the run never sees clap's types. Conflicts
//! between flags are found here and reported as usage errors by `main`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};

use super::{Command, DiffArgs, ProfileArgs, RecordArgs, ReportArgs, SenderKind};
use crate::agent::run::{Continuous, ListenPlan, RunPlan};
use crate::collector::sample_store::retention::Retention;
use crate::collector::CollectorPlan;
use crate::commands::compare::command::{DiffPlan, ReportPlan};
use crate::commands::record::RecordPlan;
use crate::output::sender::{
    otlp::OtlpSettings, remote::HttpSettings, spool::SpoolSettings, SenderConfig,
};
use crate::profile::format::ProfileFormat;
use crate::symbolize::settings::SymbolSettings;

/// Window length of continuous mode when only a network sender asks for
/// it (no `--profile-interval`), seconds.
const DEFAULT_INTERVAL_S: f64 = 10.0;

impl ProfileArgs {
    /// The run these options ask for. `record`: they are `lightswitch
    /// record`'s, which has no `--pids`. Errors name the flags at fault
    /// (flags that conflict, and what [`RunPlan::check`] refuses); nothing
    /// on the running system is looked at.
    pub fn plan(&self, record: bool) -> Result<RunPlan> {
        self.check_flags(record)?;
        let outputs = self.outputs()?;
        let continuous = self.is_continuous().then(|| -> Result<Continuous> {
            Ok(Continuous {
                interval: Duration::from_secs_f64(
                    self.profile_interval.unwrap_or(DEFAULT_INTERVAL_S),
                ),
                sender: self.sender_config(&outputs),
                flush_timeout: Duration::from_secs_f64(self.flush_timeout),
            })
        });
        let plan = RunPlan {
            sample_freq_hz: self.sample_freq,
            pids: self.pids.clone(),
            exclude_self: self.exclude_self,
            off_cpu_min: self
                .off_cpu
                .then(|| Duration::from_secs_f64(self.off_cpu_min.max(0.0))),
            max_unwind_info_mb: self.max_unwind_info_mb,
            libbpf_debug: self.libbpf_debug,
            duration: self.duration.map(Duration::from_secs_f64),
            outputs,
            output_dir: self.profile_path.clone(),
            compression: self.pprof_compression,
            file_mode: self.profile_mode,
            continuous: continuous.transpose()?,
            listen: self.listen.as_ref().map(|address| ListenPlan {
                address: address.clone(),
                token: self.listen_token.clone(),
                max_seconds: self.listen_max_seconds,
                max_requests: self.listen_max_requests,
                max_connections: self.listen_max_connections,
            }),
            unwind_cache_dir: (self.unwind_cache_dir != "none")
                .then(|| PathBuf::from(&self.unwind_cache_dir)),
            symbols: SymbolSettings {
                debug_dirs: self.debug_dirs.clone(),
                debuginfod_urls: self.debuginfod_urls.clone(),
                debuginfod_cache: self.debuginfod_cache.clone(),
            },
        };
        plan.check()?;
        Ok(plan)
    }

    /// Flags that conflict with each other or do not apply. Errors name them.
    fn check_flags(&self, record: bool) -> Result<()> {
        if record && !self.pids.is_empty() {
            bail!("record profiles its command and what it starts: --pids does not apply");
        }
        if let Some(name) = self.profile_name.as_deref() {
            if name.trim().is_empty() {
                bail!(
                    "--profile-name {name:?} names no file: give a file name (written into \
                     --profile-path), or - for standard output; leave --profile-name out for \
                     the format's default name"
                );
            }
        }
        if self.sender == SenderKind::Disk && self.server_url.is_some() {
            bail!("--server-url is for --sender remote, pyroscope or otlp");
        }
        if self.sender != SenderKind::Otlp && !self.otlp_headers.is_empty() {
            bail!("--otlp-header is for --sender otlp");
        }
        if self.spool_dir.is_some() && self.sender == SenderKind::Disk {
            bail!("--spool-dir is for --sender remote, pyroscope or otlp");
        }
        if self.max_profiles.is_some() && !(self.is_continuous() && self.sender == SenderKind::Disk)
        {
            bail!("--max-profiles applies to continuous mode with the disk sender (give --profile-interval)");
        }
        Ok(())
    }

    /// Windows are sent as they close: `--profile-interval` or a network sender.
    fn is_continuous(&self) -> bool {
        self.profile_interval.is_some() || self.sender != SenderKind::Disk
    }

    /// Each output format (duplicates removed, in the given order) with the
    /// file it is written to: `--profile-path` joined with `--profile-name`
    /// or the format's default file name; `--profile-name -` is
    /// `/dev/stdout`, as for most Unix tools. With `--off-cpu`, each
    /// one-value-per-stack format's off-CPU twin follows under its own
    /// name. Errors when `--profile-name` is given with several formats.
    fn outputs(&self) -> Result<Vec<(ProfileFormat, PathBuf)>> {
        let formats = self.formats();
        if formats.len() > 1 && self.profile_name.is_some() {
            bail!("--profile-name names one file: with several --profile-format values each gets its default name");
        }
        let mut outputs: Vec<(ProfileFormat, PathBuf)> = formats
            .iter()
            .map(|&f| {
                let path = match self.profile_name.as_deref() {
                    Some("-") => PathBuf::from("/dev/stdout"),
                    Some(name) => self.profile_path.join(name),
                    None => self.profile_path.join(f.default_file_name()),
                };
                (f, path)
            })
            .collect();
        if self.off_cpu {
            for twin in formats
                .iter()
                .filter_map(|&f| crate::profile::format::off_cpu::twin(f))
            {
                if !formats.contains(&twin) {
                    outputs.push((twin, self.profile_path.join(twin.default_file_name())));
                }
            }
        }
        Ok(outputs)
    }

    /// The formats asked for (duplicates removed, in the given order), or
    /// without `--profile-format` the sender's default: flame-graph for
    /// `disk`, else the one format the sender sends.
    fn formats(&self) -> Vec<ProfileFormat> {
        let mut formats: Vec<ProfileFormat> = Vec::new();
        for format in &self.profile_format {
            if !formats.contains(format) {
                formats.push(*format);
            }
        }
        if formats.is_empty() {
            let default = crate::output::sender::formats_of(self.sender.into())
                .and_then(|takes| takes.first().copied());
            formats.push(default.unwrap_or(ProfileFormat::FlameGraph));
        }
        formats
    }

    /// The continuous-mode sender these options ask for, writing `outputs`
    /// when it is the disk sender.
    fn sender_config(&self, outputs: &[(ProfileFormat, PathBuf)]) -> SenderConfig {
        let http = HttpSettings {
            token: self.token.clone(),
            send_timeout_s: self.send_timeout,
            send_queue_bytes: self.send_queue_bytes,
            spool: self.spool_dir.clone().map(|dir| SpoolSettings {
                dir,
                max_bytes: self.spool_max_bytes,
                max_age: Duration::try_from_secs_f64(self.spool_max_age).unwrap_or(Duration::MAX),
                host: String::new(),
            }),
        };
        match self.sender {
            SenderKind::Disk => SenderConfig::Disk {
                outputs: outputs.to_vec(),
                compression: self.pprof_compression,
                max_profiles: self.max_profiles,
                mode: self.profile_mode,
            },
            SenderKind::Remote => SenderConfig::Remote {
                url: self.server_url.clone(),
                http,
            },
            SenderKind::Pyroscope => SenderConfig::Pyroscope {
                url: self.server_url.clone(),
                http,
                app_name: self.pyroscope_app_name.clone(),
                labels: self.labels.clone(),
                tenant_id: self.pyroscope_tenant_id.clone(),
            },
            SenderKind::Otlp => SenderConfig::Otlp {
                otlp: OtlpSettings {
                    base_url: self.server_url.clone(),
                    headers: self.otlp_headers.clone(),
                },
                http,
            },
        }
    }
}

impl RecordArgs {
    /// What `record` does: its command, and the run's plan
    /// ([`ProfileArgs::plan`]). Errors name the flags at fault.
    pub fn plan(&self) -> Result<RecordPlan> {
        Ok(RecordPlan {
            run: self.profile.plan(true)?,
            command: self.command.clone(),
            as_root: self.as_root,
        })
    }
}

impl ReportArgs {
    /// The plan of `report` these flags ask for.
    pub fn plan(&self) -> ReportPlan {
        ReportPlan {
            file: self.file.clone(),
            from: self.from,
            to: self.to,
            top: self.top,
            off_cpu: self.off_cpu,
            threads: self.threads,
            format: self.format,
            output: self.output.clone(),
            pprof_compression: self.pprof_compression,
            max_input_mb: self.max_input_mb,
        }
    }
}

impl DiffArgs {
    /// The plan of `diff` these flags ask for.
    pub fn plan(&self) -> DiffPlan {
        DiffPlan {
            base: self.base.clone(),
            new: self.new.clone(),
            output: self.output,
            top: self.top,
            flame_graph: self.flame_graph.clone(),
            fail_above: self.fail_above,
            warn_above: self.warn_above,
            annotations: self.annotations,
            junit: self.junit.clone(),
            off_cpu: self.off_cpu,
            max_input_mb: self.max_input_mb,
        }
    }
}

impl Command {
    /// The plan of `collector` these flags ask for; `None` for any other
    /// command.
    pub fn collector_plan(&self) -> Option<CollectorPlan> {
        let Command::Collector {
            listen,
            storage,
            token,
            profile_mode,
            max_body_bytes,
            max_decoded_bytes,
            max_concurrent_ingests,
            max_merge_profiles,
            max_connections,
            max_timeline_samples,
            retention,
            max_storage,
            ..
        } = self
        else {
            return None;
        };
        Some(CollectorPlan {
            listen: listen.clone(),
            storage: storage.clone(),
            token: token.clone(),
            profile_mode: *profile_mode,
            max_body_bytes: *max_body_bytes,
            max_decoded_bytes: *max_decoded_bytes,
            max_concurrent_ingests: *max_concurrent_ingests,
            max_merge_profiles: *max_merge_profiles,
            max_connections: *max_connections,
            max_timeline_samples: *max_timeline_samples,
            retention: Retention {
                max_age_ns: *retention,
                max_bytes: *max_storage,
            },
        })
    }
}
