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
    if shell == clap_complete::Shell::Bash {
        command.build();
        let record = command.find_subcommand("record").context("record")?;
        let text = String::from_utf8(script).context("the bash completion script")?;
        script = bash_record_branch(&text, record).into_bytes();
    }
    write_out(out, &script).context("writing the completion script")
}

/// The `case` branch of `record` in clap_complete's bash script.
const BASH_RECORD_BRANCH: &str = "        lightswitch__subcmd__record)\n";

/// Mend `record`'s branch of the bash `script`: clap_complete offers a
/// subcommand's options at every word, so `record ls -` was offered
/// record's options, and it lists hidden ones (`--pids`, which record
/// rejects). The branch now leaves the words from the command on (after
/// `--`, or from the first word that is not one of record's options or
/// their values) to the command: its name is completed from `PATH`, its
/// arguments by bash-completion's `_command_offset` when loaded, else by
/// bash's default (file names). `record` is the subcommand's definition.
fn bash_record_branch(script: &str, record: &clap::Command) -> String {
    let Some(at) = script.find(BASH_RECORD_BRANCH) else {
        return script.to_string();
    };
    let body = at + BASH_RECORD_BRANCH.len();
    let Some(opts_end) = script[body..].find('\n').map(|n| body + n + 1) else {
        return script.to_string();
    };
    let names = |arg: &clap::Arg| -> Vec<String> {
        let short = arg.get_short().map(|c| format!("-{c}"));
        let long = arg.get_long().map(|l| format!("--{l}"));
        short.into_iter().chain(long).collect()
    };
    let options: Vec<&clap::Arg> = record
        .get_arguments()
        .filter(|a| !a.is_positional())
        .collect();
    let hidden: Vec<String> = options
        .iter()
        .filter(|a| a.is_hide_set())
        .flat_map(|a| names(a))
        .collect();
    let takes_value: Vec<String> = options
        .iter()
        .filter(|a| a.get_num_args().is_some_and(|n| n.takes_values()))
        .flat_map(|a| names(a))
        .collect();
    let opts_line = script[body..opts_end]
        .split(' ')
        .filter(|word| !hidden.iter().any(|h| word.trim_matches('"') == h))
        .collect::<Vec<_>>()
        .join(" ");
    let command_words = format!(
        r#"            local k w start=0 takes=" {} "
            for (( k=1; k < COMP_CWORD; k++ )); do
                [[ ${{COMP_WORDS[k]}} == record ]] && break
            done
            for (( k++; k <= COMP_CWORD; k++ )); do
                w="${{COMP_WORDS[k]}}"
                if [[ ${{w}} == -- ]] && (( k < COMP_CWORD )); then start=$((k + 1)); break; fi
                if [[ ${{w}} != -* ]]; then start=${{k}}; break; fi
                if [[ ${{takes}} == *" ${{w}} "* ]]; then
                    k=$((k + 1))
                    [[ ${{COMP_WORDS[k]}} == = ]] && k=$((k + 1))
                fi
            done
            if (( start > 0 )); then
                if (( COMP_CWORD == start )); then
                    COMPREPLY=( $(compgen -c -- "${{cur}}") )
                elif declare -F _command_offset >/dev/null; then
                    _command_offset "${{start}}"
                else
                    COMPREPLY=()
                fi
                return 0
            fi
"#,
        takes_value.join(" ")
    );
    format!(
        "{}{opts_line}{command_words}{}",
        &script[..body],
        &script[opts_end..]
    )
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
