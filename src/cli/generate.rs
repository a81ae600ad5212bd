//! Files generated from the clap definition of the command line, for
//! packagers and users: shell completion scripts (clap_complete) and the
//! man page (clap_mangen). `lightswitch completions SHELL` and
//! `lightswitch man` print them.

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

/// Write lightswitch's man page (roff, section 1: name, synopsis, every
/// option with its help, the subcommands, the examples) to `out`.
pub fn man_page(out: &mut dyn Write) -> Result<()> {
    clap_mangen::Man::new(Cli::command())
        .render(out)
        .context("writing the man page")?;
    out.flush().context("writing the man page")
}
