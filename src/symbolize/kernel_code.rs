//! Kernel code outside the kernel image's text: loadable modules,
//! JIT-compiled BPF programs (`[bpf]`), ftrace and kprobe trampolines.
//!
//! `/proc/kallsyms` lists the image's symbols first, then these, but it
//! gives no sizes: a name is "the nearest symbol at or below the address".
//! For an address past the image's text (`_etext`) that rule, applied to
//! the whole list, names it after the image's last data symbol (on x86-64
//! `__stop_runtime_ptr_USER_PTR_MAX`) whenever the code it is in is no
//! longer listed, which is what happens to the profiler's own BPF programs:
//! a one-shot profile is symbolized after they are unloaded. So addresses
//! past `_etext` are named here, only from text symbols that are
//! themselves past `_etext`, plus the BPF programs remembered while they
//! were loaded ([`remember_bpf_programs`]); an address below all of them is
//! left unnamed (`[kernel.kallsyms]+0xADDR`) rather than named wrongly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Most BPF program symbols [`remember_bpf_programs`] keeps: the
/// profiler's own programs and subprograms number about 40 per load.
const REMEMBERED_MAX: usize = 4096;

/// `(address, name)` of BPF programs seen in `/proc/kallsyms` by
/// [`remember_bpf_programs`], so that samples taken inside them can be
/// named after they are unloaded.
static REMEMBERED: Mutex<BTreeMap<u64, Arc<str>>> = Mutex::new(BTreeMap::new());

/// Read `/proc/kallsyms` now and remember the JIT-compiled BPF programs it
/// lists (`bpf_prog_TAG_NAME [bpf]`, listed while `net.core.bpf_jit_kallsyms`
/// is 1, the default without JIT hardening). Called once the profiler's own
/// programs are loaded. A read error (no `/proc`) remembers nothing.
pub fn remember_bpf_programs() {
    let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
        return;
    };
    let mut remembered = REMEMBERED.lock().unwrap_or_else(|e| e.into_inner());
    for (address, kind, name, module) in kallsyms_lines(&text) {
        if module == Some("bpf") && is_text(kind) && remembered.len() < REMEMBERED_MAX {
            remembered.insert(address, Arc::from(name));
        }
    }
}

/// The text symbols of `/proc/kallsyms` past the kernel image's text.
#[derive(Debug, Default)]
pub(super) struct OutsideText {
    /// Address of `_etext`, the end of the image's text; `None` when the
    /// list has no such symbol (then nothing is named here).
    etext: Option<u64>,
    /// Text symbols past `etext`, by address.
    symbols: BTreeMap<u64, Arc<str>>,
}

impl OutsideText {
    /// Parse the text of `/proc/kallsyms` (`ADDR TYPE NAME [MODULE]` lines)
    /// and add the remembered BPF programs ([`remember_bpf_programs`]).
    pub(super) fn parse(kallsyms: &str) -> Self {
        let mut outside = Self::from_lines(kallsyms);
        if let Some(etext) = outside.etext {
            let remembered = REMEMBERED.lock().unwrap_or_else(|e| e.into_inner());
            for (&address, name) in remembered.range(etext..) {
                outside
                    .symbols
                    .entry(address)
                    .or_insert_with(|| name.clone());
            }
        }
        outside
    }

    fn from_lines(kallsyms: &str) -> Self {
        let etext = kallsyms_lines(kallsyms)
            .find(|&(_, _, name, module)| name == "_etext" && module.is_none())
            .map(|(address, ..)| address);
        let Some(etext) = etext else {
            return Self::default();
        };
        let symbols = kallsyms_lines(kallsyms)
            .filter(|&(address, kind, ..)| address > etext && is_text(kind))
            .map(|(address, _, name, _)| (address, Arc::from(name)))
            .collect();
        OutsideText {
            etext: Some(etext),
            symbols,
        }
    }

    /// Whether `address` is past the image's text, so that only
    /// [`Self::name`] may name it.
    pub(super) fn covers(&self, address: u64) -> bool {
        self.etext.is_some_and(|etext| address >= etext)
    }

    /// The nearest text symbol at or below `address` among those past the
    /// image's text; `None` when there is none.
    pub(super) fn name(&self, address: u64) -> Option<&str> {
        self.symbols
            .range(..=address)
            .next_back()
            .map(|(_, name)| name.as_ref())
    }
}

/// Whether a kallsyms type letter marks code (`t`/`T`, and weak `w`/`W`).
fn is_text(kind: char) -> bool {
    matches!(kind, 't' | 'T' | 'w' | 'W')
}

/// `(address, type, name, module)` of each well-formed line of a
/// `/proc/kallsyms` text; `module` is the bracketed last field
/// (`[bpf]`, `[ext4]`) without its brackets. Lines with address 0 (read
/// without the privilege to see addresses) are skipped.
fn kallsyms_lines(text: &str) -> impl Iterator<Item = (u64, char, &str, Option<&str>)> {
    text.lines().filter_map(|line| {
        let mut fields = line.split_ascii_whitespace();
        let address = u64::from_str_radix(fields.next()?, 16).ok()?;
        let kind = fields.next()?.chars().next()?;
        let name = fields.next()?;
        let module = fields
            .next()
            .and_then(|m| m.strip_prefix('[')?.strip_suffix(']'));
        (address != 0).then_some((address, kind, name, module))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 T do_syscall_64
ffffffff822784c8 T _etext
ffffffff83b28974 R __stop_runtime_ptr_USER_PTR_MAX
ffffffffc0027f50 t bpf_prog_dfd62677faf2bb0f_unwind_step\t[bpf]
ffffffffc0029000 d some_module_data\t[ext4]
ffffffffc0030000 t ext4_fill_super\t[ext4]
ffffffffc0201000 t ftrace_trampoline\t[__builtin__ftrace]
";

    #[test]
    fn names_code_past_the_image_only_from_code_past_the_image() {
        let outside = OutsideText::from_lines(KALLSYMS);
        assert!(!outside.covers(0xffffffff81001010));
        assert!(outside.covers(0xffffffff822784c8));
        // Between the image's end and the first listed code: nobody's.
        assert_eq!(outside.name(0xffffffffc0000100), None);
        assert_eq!(
            outside.name(0xffffffffc0027f80),
            Some("bpf_prog_dfd62677faf2bb0f_unwind_step")
        );
        // Module data is never the name of code.
        assert_eq!(
            outside.name(0xffffffffc0029010),
            Some("bpf_prog_dfd62677faf2bb0f_unwind_step")
        );
        assert_eq!(outside.name(0xffffffffc0030010), Some("ext4_fill_super"));
        assert_eq!(outside.name(0xffffffffc0201008), Some("ftrace_trampoline"));
    }

    #[test]
    fn without_etext_nothing_is_covered() {
        let outside = OutsideText::from_lines("ffffffff81001000 T do_syscall_64\n");
        assert!(!outside.covers(u64::MAX));
    }

    #[test]
    fn parses_module_fields_and_skips_hidden_addresses() {
        let lines: Vec<_> = kallsyms_lines(
            "0000000000000000 T hidden\nffffffffc0030000 t ext4_fill_super\t[ext4]\nbad\n",
        )
        .collect();
        assert_eq!(
            lines,
            vec![(0xffffffffc0030000, 't', "ext4_fill_super", Some("ext4"))]
        );
    }
}
