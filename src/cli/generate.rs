//! Files generated from the clap definition of the command line, for
//! packagers and users: shell completion scripts (clap_complete) and the
//! man page (clap_mangen). `lightswitch completions SHELL` and
//! `lightswitch man [SUBCOMMAND]` print them.

use std::io::Write;

use anyhow::{Context, Result};
use clap::CommandFactory;

use super::Cli;

/// Write the completion script of `shell` for the `lightswitch` command to
/// `out` (every subcommand, flag and value name, from [`Cli`]).
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) -> Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "lightswitch", out);
    out.flush().context("writing the completion script")
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
                let known: Vec<&str> = command
                    .get_subcommands()
                    .map(|c| c.get_name())
                    .filter(|n| *n != "help")
                    .collect();
                anyhow::bail!(
                    "no subcommand {name:?}: lightswitch has {}",
                    known.join(", ")
                );
            };
            let page_name = format!("lightswitch-{}", sub.get_name());
            sub.clone().name(page_name)
        }
    };
    clap_mangen::Man::new(page)
        .render(out)
        .context("writing the man page")?;
    out.flush().context("writing the man page")
}
