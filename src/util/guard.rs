//! Containment of panics in one unit of work (one window, one on-demand
//! profile): a bug in processing one window costs that window, not the agent.
//! The default panic hook still prints the panic (with its location) to
//! stderr; [`contain`] adds one log line naming what was dropped.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tracing::error;

/// The message a panic carried (`panic!("...")` payloads are `&str` or `String`).
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Run `work`; if it panics, log one error naming `what` (and that it was
/// dropped) and return `None`. The caller must not rely on state `work`
/// was changing when it panicked (drop or rebuild it).
pub fn contain<T>(what: impl FnOnce() -> String, work: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(value) => Some(value),
        Err(payload) => {
            error!(
                "{}: processing panicked ({}); dropped",
                what(),
                panic_message(payload.as_ref())
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_contained_and_its_message_kept() {
        assert_eq!(contain(|| "unit".into(), || 7), Some(7));
        let none: Option<u32> = contain(|| "window 3".into(), || panic!("boom {}", 1));
        assert_eq!(none, None);
        let payload = catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "plain");
    }
}
