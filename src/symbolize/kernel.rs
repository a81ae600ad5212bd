//! The kernel as a symbol source (`/proc/kallsyms`), and facts about the
//! running kernel needed to describe kernel frames.

use std::cell::RefCell;
use std::collections::HashMap;

use blazesym::symbolize::source::{Kernel as KernelSource, Source};
use blazesym::symbolize::{Input, Symbolizer as BlazeSymbolizer};
use blazesym::MaybeDefault;
use object::read::elf::NoteIterator;
use object::{elf, LittleEndian};
use tracing::debug;

use super::kernel_code::OutsideText;
use super::lines::{line_of, lines_of, unknown_line, Lines};
use super::sources::{Batch, FrameRef, Site, SymbolSource};
use super::{MappingSource, KERNEL_MAPPING_NAME};

/// Names kernel frames from `/proc/kallsyms` in one batch per window; sites
/// are `(0, address)`. Addresses it cannot name become
/// `[kernel.kallsyms]+0xADDR`.
pub(super) struct Kallsyms {
    /// Holds the parsed `/proc/kallsyms` (7.5 MiB; blazesym's for the
    /// kernel image, ours for code past it) while windows bring new kernel
    /// addresses; dropped after a window without any.
    inner: RefCell<Option<(BlazeSymbolizer, OutsideText)>>,
    keep_parsed: bool,
}

impl Kallsyms {
    /// A kernel source with its own blazesym symbolizer; `keep_parsed`
    /// keeps the parsed `/proc/kallsyms` from one window to the next while
    /// windows bring new kernel addresses (continuous mode).
    pub(super) fn new(keep_parsed: bool) -> Self {
        Kallsyms {
            inner: RefCell::new(None),
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
        let mut inner = self.inner.borrow_mut();
        if batch.is_empty() || !self.keep_parsed {
            // Parsing it again (~100 ms) is cheaper than keeping it through
            // windows without new kernel addresses.
            *inner = None;
            if batch.is_empty() {
                return HashMap::new();
            }
        }
        let (inner, outside) = inner.get_or_insert_with(|| {
            let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
            (
                BlazeSymbolizer::builder().enable_demangling(false).build(),
                OutsideText::parse(&kallsyms),
            )
        });
        let addrs: Vec<u64> = batch.values().flatten().copied().collect();
        let source = Source::Kernel(KernelSource {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            kaslr_offset: Some(0),
            debug_syms: false,
            ..Default::default()
        });
        let results = match inner.symbolize(&source, Input::AbsAddr(&addrs)) {
            Ok(r) => r,
            Err(err) => {
                debug!("kernel symbolization failed: {err}");
                Vec::new()
            }
        };
        addrs
            .iter()
            .enumerate()
            .map(|(i, &addr)| {
                let named = if outside.covers(addr) {
                    outside.name(addr).map(|name| vec![line_of(name, None)])
                } else {
                    results.get(i).and_then(lines_of)
                };
                let entry = match named {
                    Some(lines) => (lines, true),
                    None => (vec![unknown_line(kernel_placeholder(addr))], false),
                };
                ((0, addr), entry)
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
