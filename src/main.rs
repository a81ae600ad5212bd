//! The `lightswitch` binary: parses the command line and hands over to [`lightswitch::agent::run`].

use clap::Parser;
use lightswitch::agent::run::RunPlan;
use lightswitch::commands::cli::{Cli, Command, LogLevel};
use lightswitch::commands::record::RecordPlan;

/// Every allocation of the profiler goes through jemalloc, so that its own
/// heap can be profiled (`lightswitch::agent::heap`, `GET /debug/pprof/heap`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its compiled-in configuration from this symbol at start
/// ([`lightswitch::agent::heap::DEFAULT_MALLOC_CONF`]; `_RJEM_MALLOC_CONF` overrides it).
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = lightswitch::agent::heap::DEFAULT_MALLOC_CONF;

fn main() {
    // Started as the object opener's helper process, it serves and exits
    // here; otherwise helpers are this executable run again.
    lightswitch::process::opener::serve_if_helper();
    let cli = Cli::parse();
    if generate(&cli) {
        return;
    }
    let plan = plan_or_usage_error(&cli);
    init_logging(&cli);
    let plan = match plan {
        Plan::Profile(plan) => plan,
        Plan::Record(plan) => record(&plan),
        Plan::Tool => {
            run_tool(&cli);
            return;
        }
    };
    // Started through sudo, the files the run writes are given to the user
    // who ran sudo (as `record` does); an unreadable SUDO_UID is an error
    // before sampling, not a surprise after it.
    let invoker = match lightswitch::output::sudo::Identity::from_sudo() {
        Ok(invoker) => invoker,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(1);
        }
    };
    let created = invoker
        .as_ref()
        .map(|_| plan.directories_to_create())
        .unwrap_or_default();
    match lightswitch::agent::run::run(&plan) {
        Ok(summary) => {
            if let Some(id) = &invoker {
                lightswitch::output::sudo::give_outputs_to(id, &summary.outputs, &created);
            }
            // With the profile itself on stdout (`--profile-name
            // /dev/stdout`), the summary goes to stderr.
            let profile_on_stdout = plan
                .outputs
                .iter()
                .any(|(_, path)| lightswitch::util::files::is_stdout(path));
            if profile_on_stdout {
                eprintln!("{summary}");
            } else {
                println!("{summary}");
            }
            // Continuous mode: a run that lost windows or deliveries says
            // so in its exit status too.
            if let Some(failure) = summary.continuous.and_then(|c| c.report.failure()) {
                eprintln!("error: {failure}");
                std::process::exit(1);
            }
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(1);
        }
    }
}

/// What the command line asks for: a profiling run, `record`, or one of
/// the other tools.
enum Plan {
    /// Profile (no subcommand).
    Profile(RunPlan),
    /// `record`.
    Record(RecordPlan),
    /// Any other subcommand ([`run_tool`]).
    Tool,
}

/// The plan of a profiling run or of `record`, built from the flags once.
/// Exits with a usage error (status 2, clap's format) when the flags
/// conflict with each other: mistakes in the command line itself, told
/// apart from a run that failed (1, or `record`'s
/// [`lightswitch::commands::record::OWN_FAILURE_STATUS`]).
fn plan_or_usage_error(cli: &Cli) -> Plan {
    let (plan, subcommand) = match &cli.command {
        None => (cli.profile.plan(false).map(Plan::Profile), None),
        Some(Command::Record(args)) => (args.plan().map(Plan::Record), Some("record")),
        _ => (Ok(Plan::Tool), None),
    };
    match plan {
        Ok(plan) => plan,
        Err(conflict) => usage_error(&conflict, subcommand),
    }
}

/// Exit with `conflict` as a usage error of `subcommand` (or of
/// lightswitch itself).
fn usage_error(conflict: &anyhow::Error, subcommand: Option<&str>) -> ! {
    let mut command = <Cli as clap::CommandFactory>::command();
    command.build();
    // The usage line shown is the subcommand's own.
    let mut command = match subcommand.and_then(|name| command.find_subcommand(name)) {
        Some(sub) => sub.clone(),
        None => command,
    };
    command
        .error(
            clap::error::ErrorKind::ArgumentConflict,
            format!("{conflict:#}"),
        )
        .exit()
}

/// Run `record` as `plan` says and exit with its status.
fn record(plan: &RecordPlan) -> ! {
    match lightswitch::commands::record::record(plan) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            // As a shell says of a command it cannot find (127) or
            // run (126); anything else is record's own failure.
            let status = err
                .chain()
                .find_map(|e| e.downcast_ref::<lightswitch::commands::record::launch::CannotRun>())
                .map_or(
                    lightswitch::commands::record::OWN_FAILURE_STATUS,
                    |cannot| cannot.status,
                );
            std::process::exit(status);
        }
    }
}

/// Print what is generated from the command line's definition (shell
/// completions, the man page), if that is the command: nothing else to set
/// up. Whether it was; exits 1 when writing fails.
fn generate(cli: &Cli) -> bool {
    let generated = match &cli.command {
        Some(Command::Completions { shell }) => {
            Some(lightswitch::commands::cli::generate::completions(
                *shell,
                &mut std::io::stdout().lock(),
            ))
        }
        Some(Command::Man { subcommand }) => Some(lightswitch::commands::cli::generate::man_page(
            subcommand.as_deref(),
            &mut std::io::stdout().lock(),
        )),
        _ => None,
    };
    match generated {
        Some(Err(err)) => {
            eprintln!("error: {err:#}");
            std::process::exit(1);
        }
        Some(Ok(())) => true,
        None => false,
    }
}

/// The profiler's own messages go to stderr at the level `--logging` asks for.
fn init_logging(cli: &Cli) {
    let level = match cli.log_level() {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(format!(
            "lightswitch={level}"
        )))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Run the command if it is one of the tools (`show-unwind`, `diff`,
/// `report`, `collector`). A tool that fails, or has an exit status of its
/// own, exits here.
fn run_tool(cli: &Cli) {
    match &cli.command {
        Some(Command::ShowUnwind { path, debug_dirs }) => {
            match lightswitch::unwind::show::show_unwind(path, debug_dirs) {
                Ok(text) => {
                    // A closed pipe (`| head`) is not an error worth reporting.
                    let _ =
                        std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
                }
                Err(err) => {
                    eprintln!("error: {err:#}");
                    std::process::exit(1);
                }
            }
        }
        Some(Command::Diff(args)) => {
            match lightswitch::commands::compare::command::diff(&args.plan()) {
                Ok(code) => std::process::exit(code),
                Err(err) => {
                    eprintln!("error: {err:#}");
                    std::process::exit(lightswitch::commands::compare::diff::BAD_INPUT_EXIT_STATUS);
                }
            }
        }
        Some(Command::Report(args)) => {
            if let Err(err) = lightswitch::commands::compare::command::report(&args.plan()) {
                eprintln!("error: {err:#}");
                // As `diff` does: 2 when the input (or the output) fails.
                std::process::exit(lightswitch::commands::compare::diff::BAD_INPUT_EXIT_STATUS);
            }
        }
        Some(command @ Command::Collector { .. }) => {
            let Some(config) = command.collector_plan() else {
                return;
            };
            if let Err(err) = lightswitch::collector::run(&config) {
                eprintln!("error: {err:#}");
                std::process::exit(1);
            }
        }
        _ => {}
    }
}
