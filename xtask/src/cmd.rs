//! Running processes: [`run`] to the end (failing if the process does), [`output`] for what one
//! prints, [`pip_run`] for pip with a message on what to do without network. A command's
//! output goes to the console, or to the log of the job the calling thread runs (`jobs.rs`
//! points a thread at its job's log with [`log_to`]).

use anyhow::{bail, Context, Result};
use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::Command;

thread_local! {
    /// The log of the job this thread runs, if it runs one.
    static LOG: RefCell<Option<File>> = const { RefCell::new(None) };
}

/// Sends the output of the commands this thread runs from now on to `log`.
pub fn log_to(log: File) {
    LOG.with(|l| *l.borrow_mut() = Some(log));
}

/// Points `cmd`'s output at the log of the job this thread runs (with a line saying what it
/// runs), or says on the console what it runs.
fn direct_output(cmd: &mut Command) -> Result<()> {
    LOG.with(|log| {
        match log.borrow().as_ref() {
            Some(f) => {
                writeln!(&*f, "xtask: running {cmd:?}")?;
                cmd.stdout(f.try_clone()?).stderr(f.try_clone()?);
            }
            None => eprintln!("xtask: running {cmd:?}"),
        }
        Ok(())
    })
}

/// Runs `cmd` to its end, its output on the console or in the log of the job this thread runs;
/// fails if it does.
pub fn run(cmd: &mut Command) -> Result<()> {
    direct_output(cmd)?;
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Runs pip, and says what could not be fetched and how to provide it when it fails.
pub fn pip_run(cmd: &mut Command, what: &str, into: &Path) -> Result<()> {
    run(cmd).with_context(|| {
        format!(
            "could not install {what} into {} from PyPI (is https://pypi.org reachable? pip's own message is above). \
             Without network: point pip at a folder of wheels (PIP_FIND_LINKS=/path/to/wheels PIP_NO_INDEX=1) or a mirror \
             (PIP_INDEX_URL=…), then run again",
            into.display()
        )
    })
}

/// Stdout of a command, or `None` if it cannot run or fails.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_command_fails_and_output_is_trimmed() {
        assert!(run(Command::new("sh").args(["-c", "exit 3"])).unwrap_err().to_string().contains("failed with"));
        assert_eq!(output(Command::new("sh").args(["-c", "echo '  hi  '"])).as_deref(), Some("hi"));
        assert_eq!(output(Command::new("sh").args(["-c", "echo hi; exit 1"])), None);
        assert_eq!(output(&mut Command::new("/no/such/program")), None);
    }
}
