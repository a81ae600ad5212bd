//! Files generated from the clap definition of the command line, for
//! packagers and users: shell completion scripts (clap_complete) and the
//! man page (clap_mangen). `lightswitch completions SHELL` and
//! `lightswitch man [SUBCOMMAND]` print them.

use std::io::Write;

use anyhow::{Context, Result};
use clap::CommandFactory;

use super::Cli;

/// Write the completion script of `shell` for the `lightswitch` command to
/// `out` (every subcommand, flag and value name, from [`Cli`]). Errors: a
/// failed write (clap_complete panics on one, so the script is made in
/// memory first); a reader that closed the pipe early (`| head`) is not one.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) -> Result<()> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "lightswitch", &mut script);
    write_out(out, &script).context("writing the completion script")
}

/// Write `bytes` to `out` and flush; a closed pipe is the reader's choice,
/// not an error.
fn write_out(out: &mut dyn Write, bytes: &[u8]) -> std::io::Result<()> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Write a man page (roff, section 1: name, synopsis, every option with its
/// help, the subcommands, the examples) to `out`: lightswitch(1) for
/// `subcommand` `None`, else the subcommand's own page, named
/// `lightswitch-SUBCOMMAND` as lightswitch(1) lists it.
///
/// Errors: a `subcommand` lightswitch does not have (the message lists the
/// ones it has), or a failed write.
pub fn man_page(subcommand: Option<&str>, out: &mut dyn Write) -> Result<()> {
    let mut command = Cli::command();
    command.build();
    let page = match subcommand {
        None => command,
        Some(name) => {
            let Some(sub) = command.find_subcommand(name) else {
                let known: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
                anyhow::bail!(
                    "no subcommand {name:?}: lightswitch has {}",
                    known.join(", ")
                );
            };
            let page_name = format!("lightswitch-{}", sub.get_name());
            sub.clone().name(page_name)
        }
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page).render(&mut roff)?;
    write_out(out, &roff).context("writing the man page")
}
