//! The kernel as a symbol source (`/proc/kallsyms`), and facts about the
//! running kernel needed to describe kernel frames.

use std::cell::RefCell;
use std::collections::HashMap;

use object::read::elf::NoteIterator;
use object::{elf, LittleEndian};

use super::kallsyms::KernelSymbols;
use super::lines::{line_of, unknown_line, Lines};
use super::symbol_source::{Batch, FrameRef, Site, SymbolSource};
use super::MappingSource;
use crate::profile::KERNEL_MAPPING_NAME;

/// Names kernel frames from `/proc/kallsyms` in one batch per window; sites
/// are `(0, address)`. Addresses it cannot name become
/// `[kernel.kallsyms]+0xADDR`.
pub(super) struct Kallsyms {
    /// The code symbols of `/proc/kallsyms` (about 5 MiB for 120,000;
    /// [`KernelSymbols`]), kept while windows bring new kernel addresses
    /// and dropped after a window without any, so that a later window reads
    /// the list again (modules and BPF programs come and go).
    symbols: RefCell<Option<KernelSymbols>>,
    keep_parsed: bool,
}

impl Kallsyms {
    /// A kernel source; `keep_parsed` keeps the symbols read from
    /// `/proc/kallsyms` from one window to the next while windows bring new
    /// kernel addresses (continuous mode).
    pub(super) fn new(keep_parsed: bool) -> Self {
        Kallsyms {
            symbols: RefCell::new(None),
            keep_parsed,
        }
    }
}

impl SymbolSource for Kallsyms {
    fn locate(&self, _tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site> {
        match frame {
            FrameRef::Kernel(address) => Some((0, address)),
            FrameRef::User { .. } => None,
        }
    }

    fn symbolize(&self, _tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines> {
        let mut symbols = self.symbols.borrow_mut();
        if batch.is_empty() || !self.keep_parsed {
            // Reading it again (50-100 ms, mostly the kernel formatting
            // it) is cheaper than keeping it through windows without new
            // kernel addresses.
            *symbols = None;
            if batch.is_empty() {
                return HashMap::new();
            }
        }
        let symbols = symbols.get_or_insert_with(KernelSymbols::read);
        batch
            .values()
            .flatten()
            .map(|&address| {
                let entry = match symbols.name(address) {
                    Some(name) => (vec![line_of(name, None)], true),
                    None => (vec![unknown_line(kernel_placeholder(address))], false),
                };
                ((0, address), entry)
            })
            .collect()
    }
}

/// The name of a kernel address nobody could name.
pub(super) fn kernel_placeholder(address: u64) -> String {
    format!("{KERNEL_MAPPING_NAME}+0x{address:x}")
}

/// The running kernel's GNU build ID in hex, from the ELF notes the kernel
/// exports at `/sys/kernel/notes`. `None` when the file is missing or has no
/// build-ID note.
pub fn kernel_build_id() -> Option<String> {
    let notes = std::fs::read("/sys/kernel/notes").ok()?;
    build_id_from_notes(&notes)
}

fn build_id_from_notes(notes: &[u8]) -> Option<String> {
    let mut iter =
        NoteIterator::<elf::FileHeader64<LittleEndian>>::new(LittleEndian, 4, notes).ok()?;
    while let Ok(Some(note)) = iter.next() {
        if note.name() == b"GNU" && note.n_type(LittleEndian) == elf::NT_GNU_BUILD_ID {
            return Some(hex(note.desc()));
        }
    }
    None
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_build_id_note() {
        let mut notes = Vec::new();
        // An unrelated note first ("Xen", type 1, 4 bytes of desc).
        notes.extend_from_slice(&4u32.to_le_bytes());
        notes.extend_from_slice(&4u32.to_le_bytes());
        notes.extend_from_slice(&1u32.to_le_bytes());
        notes.extend_from_slice(b"Xen\0");
        notes.extend_from_slice(&[9, 9, 9, 9]);
        // The GNU build-ID note.
        notes.extend_from_slice(&4u32.to_le_bytes());
        notes.extend_from_slice(&3u32.to_le_bytes());
        notes.extend_from_slice(&3u32.to_le_bytes());
        notes.extend_from_slice(b"GNU\0");
        notes.extend_from_slice(&[0xde, 0xad, 0x01, 0]);
        assert_eq!(build_id_from_notes(&notes).as_deref(), Some("dead01"));
        assert_eq!(build_id_from_notes(&notes[..20]), None);
    }

    #[test]
    fn running_kernel_has_a_build_id() {
        if std::path::Path::new("/sys/kernel/notes").exists() {
            let id = kernel_build_id().expect("kernel notes carry a build ID");
            assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
        }
    }
}
