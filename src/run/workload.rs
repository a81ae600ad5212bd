//! A command the run starts itself and follows (`lightswitch record`): the
//! run puts its pid in the BPF filter (children followed), lets it start
//! once sampling is attached, and ends when it exits. The process handling
//! lives in [`crate::record`]; this trait is all the run needs of it.

use anyhow::Result;

/// A process started held (not yet exec'd), to be profiled from its first
/// instruction.
pub trait Workload {
    /// Its process id: the first pid of the BPF filter.
    fn pid(&self) -> u32;
    /// Sampling is attached: let it exec. Errors when it could not.
    fn release(&mut self) -> Result<()>;
    /// Whether it has exited (the run then ends).
    fn has_exited(&mut self) -> bool;
    /// A stop was asked for (SIGINT, SIGTERM): pass it on. The run goes on
    /// until the workload exits.
    fn interrupt(&mut self);
}
