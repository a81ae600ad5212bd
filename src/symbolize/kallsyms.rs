//! `/proc/kallsyms` as a compact index of the kernel's code symbols, and the
//! profiler's own BPF programs remembered while they were loaded.
//!
//! kallsyms gives no sizes: a kernel address is named after the nearest
//! code symbol at or below it. Two rules keep that honest:
//!
//! - Only code symbols (`t`/`T`, weak `w`/`W`) name an address. A kernel
//!   stack holds code addresses; the nearest data symbol below one is never
//!   its function.
//! - Addresses past the kernel image's text (`_etext`: loadable modules,
//!   JIT-compiled BPF programs `[bpf]`, ftrace and kprobe trampolines) are
//!   named only from code symbols that are themselves past `_etext`, plus
//!   the BPF programs remembered while they were loaded
//!   ([`remember_bpf_programs`]). Otherwise code no longer listed (the
//!   profiler's own programs, unloaded before a one-shot profile is
//!   symbolized) took the name of the image's last symbol (on x86-64
//!   `__stop_runtime_ptr_USER_PTR_MAX`). An address below every symbol past
//!   `_etext` is left unnamed (`[kernel.kallsyms]+0xADDR`).
//!
//! The index is ours rather than blazesym's kallsyms source for memory
//! (decision 0008): blazesym held the parsed list as one allocation per symbol,
//! about 7.5 MiB for this machine's 122,000 lines, and about 20 MiB more
//! while it read and sorted them, at the first window's close, which is
//! when the agent's memory peaks. Here the file is read line by line into
//! one string of names and one array of `(address, name range)`: about
//! 5 MiB for 120,000 code symbols, and only the code symbols are kept.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};

/// The file read.
const KALLSYMS_PATH: &str = "/proc/kallsyms";

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
/// programs are loaded, before any perf event is attached (50-200 ms: the
/// kernel formats every line). A read error (no `/proc`) remembers nothing.
pub fn remember_bpf_programs() {
    let Ok(file) = File::open(KALLSYMS_PATH) else {
        return;
    };
    let mut programs = Vec::new();
    for_each_line(BufReader::new(file), |address, kind, name, module| {
        if module == Some("bpf") && is_code(kind) {
            programs.push((address, Arc::<str>::from(name)));
        }
    });
    let mut remembered = REMEMBERED.lock().unwrap_or_else(|e| e.into_inner());
    for (address, name) in programs {
        if remembered.len() >= REMEMBERED_MAX {
            break;
        }
        remembered.insert(address, name);
    }
}

/// The code symbols of one reading of `/proc/kallsyms`, with the
/// remembered BPF programs, for naming kernel addresses ([`Self::name`]).
#[derive(Debug, Default)]
pub(super) struct KernelSymbols {
    /// `(address, start, end)` of each code symbol by address: its name is
    /// `names[start..end]`. One symbol per address (the first listed).
    symbols: Vec<(u64, u32, u32)>,
    /// The names, one after the other.
    names: String,
    /// Address of `_etext`, the end of the image's text; `None` when the
    /// list has no such symbol (then every address is named from every
    /// code symbol).
    etext: Option<u64>,
}

impl KernelSymbols {
    /// Read `/proc/kallsyms` (an empty index when it cannot be opened: no
    /// address is named) and add the remembered BPF programs.
    pub(super) fn read() -> Self {
        let remembered = REMEMBERED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match File::open(KALLSYMS_PATH) {
            Ok(file) => Self::parse(BufReader::new(file), &remembered),
            Err(_) => Self::default(),
        }
    }

    /// Index the code symbols of a `/proc/kallsyms` text (`ADDR TYPE NAME
    /// [MODULE]` lines), and the `remembered` programs at addresses no
    /// listed code symbol starts at.
    fn parse(reader: impl BufRead, remembered: &BTreeMap<u64, Arc<str>>) -> Self {
        let mut index = KernelSymbols::default();
        for_each_line(reader, |address, kind, name, module| {
            if name == "_etext" && module.is_none() {
                // The end of the image's text marks a boundary, not code.
                index.etext = Some(address);
            } else if is_code(kind) {
                index.push(address, name);
            }
        });
        for (&address, name) in remembered {
            index.push(address, name);
        }
        // Stable: at one address, the first listed stays (remembered
        // programs come last).
        index.symbols.sort_by_key(|&(address, ..)| address);
        index.symbols.dedup_by_key(|&mut (address, ..)| address);
        index.symbols.shrink_to_fit();
        index.names.shrink_to_fit();
        index
    }

    /// Add one symbol (dropped if the names would pass 4 GiB).
    fn push(&mut self, address: u64, name: &str) {
        let start = self.names.len();
        let (Ok(start32), Ok(end32)) = (u32::try_from(start), u32::try_from(start + name.len()))
        else {
            return;
        };
        self.names.push_str(name);
        self.symbols.push((address, start32, end32));
    }

    /// The name of the code at kernel `address`: the nearest code symbol at
    /// or below it, but for an address at or past `_etext` only one that
    /// is past `_etext` too. `None` when there is none.
    pub(super) fn name(&self, address: u64) -> Option<&str> {
        let below = self
            .symbols
            .partition_point(|&(start, ..)| start <= address);
        let &(start, name_start, name_end) = self.symbols.get(below.checked_sub(1)?)?;
        if self
            .etext
            .is_some_and(|etext| address >= etext && start < etext)
        {
            return None;
        }
        self.names.get(name_start as usize..name_end as usize)
    }
}

/// Whether a kallsyms type letter marks code (`t`/`T`, and weak `w`/`W`).
fn is_code(kind: char) -> bool {
    matches!(kind, 't' | 'T' | 'w' | 'W')
}

/// Call `each` with `(address, type, name, module)` for every well-formed
/// line of a `/proc/kallsyms` text, read line by line; `module` is the
/// bracketed last field (`[bpf]`, `[ext4]`) without its brackets. Lines
/// with address 0 (read without the privilege to see addresses, which
/// needs CAP_SYSLOG) and lines that are not UTF-8 are skipped; a read
/// error ends the list.
fn for_each_line(mut reader: impl BufRead, mut each: impl FnMut(u64, char, &str, Option<&str>)) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            continue;
        };
        if let Some((address, kind, name, module)) = parse_line(text) {
            each(address, kind, name, module);
        }
    }
}

/// The fields of one `/proc/kallsyms` line; `None` when it is malformed or
/// its address is 0.
fn parse_line(line: &str) -> Option<(u64, char, &str, Option<&str>)> {
    let mut fields = line.split_ascii_whitespace();
    let address = u64::from_str_radix(fields.next()?, 16).ok()?;
    let kind = fields.next()?.chars().next()?;
    let name = fields.next()?;
    let module = fields
        .next()
        .and_then(|m| m.strip_prefix('[')?.strip_suffix(']'));
    (address != 0).then_some((address, kind, name, module))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 T do_syscall_64
ffffffff81001000 T __alias_of_do_syscall_64
ffffffff81002000 D some_data_in_text
ffffffff822784c8 T _etext
ffffffff83b28974 R __stop_runtime_ptr_USER_PTR_MAX
ffffffffc0027f50 t bpf_prog_dfd62677faf2bb0f_unwind_step\t[bpf]
ffffffffc0029000 d some_module_data\t[ext4]
ffffffffc0030000 t ext4_fill_super\t[ext4]
ffffffffc0201000 t ftrace_trampoline\t[__builtin__ftrace]
";

    fn index(text: &str, remembered: &[(u64, &str)]) -> KernelSymbols {
        let remembered = remembered
            .iter()
            .map(|&(address, name)| (address, Arc::from(name)))
            .collect();
        KernelSymbols::parse(text.as_bytes(), &remembered)
    }

    #[test]
    fn names_image_code_from_the_nearest_code_symbol() {
        let symbols = index(KALLSYMS, &[]);
        assert_eq!(symbols.name(0xffffffff81000010), Some("_stext"));
        // The first listed of two symbols at one address; data is never
        // the name of code.
        assert_eq!(symbols.name(0xffffffff81001000), Some("do_syscall_64"));
        assert_eq!(symbols.name(0xffffffff81002010), Some("do_syscall_64"));
        assert_eq!(symbols.name(0xffffffff80000000), None);
        // Only code symbols are kept, one per address, `_etext` not.
        assert_eq!(symbols.symbols.len(), 5);
    }

    #[test]
    fn names_code_past_the_image_only_from_code_past_the_image() {
        let symbols = index(KALLSYMS, &[]);
        // From `_etext` to the first code listed past it: nobody's.
        assert_eq!(symbols.name(0xffffffff822784c8), None);
        assert_eq!(symbols.name(0xffffffffc0000100), None);
        assert_eq!(
            symbols.name(0xffffffffc0027f80),
            Some("bpf_prog_dfd62677faf2bb0f_unwind_step")
        );
        // Module data is never the name of code.
        assert_eq!(
            symbols.name(0xffffffffc0029010),
            Some("bpf_prog_dfd62677faf2bb0f_unwind_step")
        );
        assert_eq!(symbols.name(0xffffffffc0030010), Some("ext4_fill_super"));
        assert_eq!(symbols.name(0xffffffffc0201008), Some("ftrace_trampoline"));
    }

    #[test]
    fn remembered_programs_name_code_no_longer_listed() {
        let symbols = index(
            KALLSYMS,
            &[
                (0xffffffffc0010000, "bpf_prog_0123456789abcdef_on_exec"),
                // A listed symbol at the same address wins.
                (0xffffffffc0030000, "bpf_prog_stale"),
            ],
        );
        assert_eq!(
            symbols.name(0xffffffffc0010040),
            Some("bpf_prog_0123456789abcdef_on_exec")
        );
        assert_eq!(symbols.name(0xffffffffc0030010), Some("ext4_fill_super"));
    }

    #[test]
    fn without_etext_every_code_symbol_names() {
        let symbols = index("ffffffff81001000 T do_syscall_64\n", &[]);
        assert_eq!(symbols.name(u64::MAX), Some("do_syscall_64"));
    }

    #[test]
    fn reads_module_fields_and_skips_hidden_addresses_and_bad_lines() {
        let mut lines = Vec::new();
        let text: &[u8] =
            b"0000000000000000 T hidden\nffffffffc0030000 t ext4_fill_super\t[ext4]\nbad\n\xff\xfe\n";
        for_each_line(text, |address, kind, name, module| {
            lines.push((address, kind, name.to_string(), module.map(str::to_string)));
        });
        assert_eq!(
            lines,
            vec![(
                0xffffffffc0030000,
                't',
                "ext4_fill_super".to_string(),
                Some("ext4".to_string())
            )]
        );
    }

    #[test]
    fn reads_this_machines_kallsyms() {
        let symbols = KernelSymbols::read();
        // Without CAP_SYSLOG every address reads as 0 and nothing is kept.
        if let Some(&(address, ..)) = symbols.symbols.get(symbols.symbols.len() / 2) {
            assert!(symbols.name(address).is_some_and(|n| !n.is_empty()));
        }
    }
}
