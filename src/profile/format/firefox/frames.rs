//! The frames of a Firefox profile: each profile frame as an address in its
//! object's library (one library per object, one address per function,
//! named through the library's symbol table) or as a label, followed by the
//! functions inlined there.

use std::sync::Arc;

use fxprof_processed_profile::debugid::DebugId;
use fxprof_processed_profile::{
    Frame as FxFrame, FrameFlags, FrameInfo, LibraryHandle, LibraryInfo, Profile as FxProfile,
    Symbol, SymbolTable,
};
use rustc_hash::FxHashMap;

use super::Categories;
use crate::profile::{Frame, FrameKind, Profile, ProfileMapping};

/// For every frame of `profile`, the Firefox frames it becomes, root first:
/// the address in its library (or a label), then the functions inlined
/// there, outermost first. Adds the libraries with their symbol tables.
pub(super) fn frame_infos(
    fx: &mut FxProfile,
    profile: &Profile,
    categories: &Categories,
) -> Vec<Vec<FrameInfo>> {
    let libs = Libraries::new(fx, profile);
    let mut out = Vec::with_capacity(profile.frames.len());
    for (frame, located) in profile.frames.iter().zip(&libs.of_frame) {
        let category = match frame.kind {
            FrameKind::Kernel => categories.kernel,
            FrameKind::User => categories.user,
            FrameKind::UnwindMarker => categories.unwind,
        };
        let info = |frame: FxFrame| FrameInfo {
            frame,
            category_pair: category,
            flags: FrameFlags::empty(),
        };
        // Lines are innermost first; the last is the function that contains
        // the address, the others were inlined into it.
        let mut lines = frame.lines.iter().rev();
        let mut infos = Vec::with_capacity(frame.lines.len());
        match (*located, lines.next()) {
            (Some((lib, rva)), Some(_)) => infos.push(info(
                FxFrame::RelativeAddressFromInstructionPointer(lib, rva),
            )),
            (None, Some(outer)) => {
                infos.push(info(FxFrame::Label(fx.intern_string(&outer.function))))
            }
            (_, None) => {}
        }
        for line in lines {
            infos.push(info(FxFrame::Label(fx.intern_string(&line.function))));
        }
        out.push(infos);
    }
    out
}

/// Where each frame of a profile is in a Firefox library.
struct Libraries {
    /// By frame index: the library and the address the frame is shown at.
    of_frame: Vec<Option<(LibraryHandle, u32)>>,
}

impl Libraries {
    /// One library per object (path and build ID) of `profile`'s mappings,
    /// and one address per function in it: every frame of a function is
    /// shown at the first of its addresses (relative to the library), named
    /// through the library's symbol table. The UI's call tree and flame
    /// graph are per function anyway, and one frame per function instead of
    /// one per address keeps each thread's frame, stack and symbol tables
    /// several times smaller (docs/decisions/0012-timeline-formats.md).
    fn new(fx: &mut FxProfile, profile: &Profile) -> Self {
        let mut by_key: FxHashMap<(&str, Option<&str>), usize> = FxHashMap::default();
        let mut libs: Vec<(LibraryInfo, FxHashMap<&str, u32>)> = Vec::new();
        let lib_of_mapping: Vec<Option<usize>> = profile
            .mappings
            .iter()
            .map(|m| {
                if !has_object(m) {
                    return None;
                }
                let key = (m.filename.as_str(), m.build_id.as_deref());
                Some(*by_key.entry(key).or_insert_with(|| {
                    libs.push((library_info(m), FxHashMap::default()));
                    libs.len() - 1
                }))
            })
            .collect();
        let located: Vec<Option<(usize, u32)>> = profile
            .frames
            .iter()
            .map(|frame| {
                let mapping = frame.mapping?;
                let lib = (*lib_of_mapping.get(mapping)?)?;
                let rva = rva(&profile.mappings[mapping], frame)?;
                let function = frame.lines.last()?.function.as_ref();
                Some((lib, *libs[lib].1.entry(function).or_insert(rva)))
            })
            .collect();
        let handles: Vec<LibraryHandle> = libs
            .into_iter()
            .map(|(info, functions)| {
                let symbols = functions
                    .into_iter()
                    .map(|(name, address)| Symbol {
                        address,
                        size: Some(1),
                        name: name.to_string(),
                    })
                    .collect();
                let handle = fx.add_lib(info);
                fx.set_lib_symbol_table(handle, Arc::new(SymbolTable::new(symbols)));
                handle
            })
            .collect();
        Libraries {
            of_frame: located
                .into_iter()
                .map(|l| l.map(|(lib, rva)| (handles[lib], rva)))
                .collect(),
        }
    }
}

/// Whether a mapping is backed by an object worth a library (not `[anon]`
/// or another pseudo-mapping but the kernel and `[vdso]`).
fn has_object(mapping: &ProfileMapping) -> bool {
    mapping.filename != "[anon]" && !mapping.filename.is_empty()
}

/// A frame's address relative to its library: the file offset for user
/// objects, the offset from the mapping's start for the kernel; `None` if
/// it does not fit the format's 32 bits.
fn rva(mapping: &ProfileMapping, frame: &Frame) -> Option<u32> {
    let offset = frame.address.checked_sub(mapping.start)?;
    let rva = match frame.kind {
        FrameKind::Kernel => offset,
        _ => offset.checked_add(mapping.file_offset)?,
    };
    u32::try_from(rva).ok()
}

/// The Firefox description of a mapping's object: its file name, path and
/// GNU build ID (as the code ID, and as the debug ID the way breakpad and
/// samply derive it: the first 16 bytes as a little-endian GUID).
fn library_info(mapping: &ProfileMapping) -> LibraryInfo {
    let name = std::path::Path::new(&mapping.filename)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(&mapping.filename)
        .to_string();
    let debug_id = mapping
        .build_id
        .as_deref()
        .and_then(|hex| {
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
                .collect::<Result<_, _>>()
                .ok()?;
            let mut guid = [0u8; 16];
            let n = bytes.len().min(16);
            guid[..n].copy_from_slice(&bytes[..n]);
            DebugId::from_guid_age(&guid, 0).ok()
        })
        .unwrap_or_else(DebugId::nil);
    LibraryInfo {
        debug_name: name.clone(),
        name,
        path: mapping.filename.clone(),
        debug_path: mapping.filename.clone(),
        debug_id,
        code_id: mapping.build_id.clone(),
        arch: Some(std::env::consts::ARCH.into()),
        symbol_table: None,
    }
}
