//! The tables the symbolizer derives from an object beside blazesym's
//! parsed data, for the names blazesym does not give: full paths of Rust
//! functions that DWARF names without one ([`RustPaths`], from the DWARF
//! and `.symtab` of the object or its debug file), the dynamic symbols of
//! an object without section headers and its MiniDebugInfo
//! ([`FunctionSymbols`], from the object file), and the names of its PLT
//! stubs ([`PltStubs`], from its dynamic relocations).
//!
//! Each table is built the first time a window needs it and held in the
//! object's [`ObjectTables`]. A continuous symbolizer keeps those with the
//! object's parsed data ([`super::objects`], by object: build ID or file
//! identity), so that a table is built once per object for as long as the
//! object stays parsed, not again in every window that brings new
//! addresses in it (MiniDebugInfo was xz-inflated, and a Rust binary's
//! DWARF units walked, each time), and is dropped when the object is
//! evicted; its bytes ([`ObjectTables::heap_bytes`]) count in the object's
//! cost, which the parsed-object budget bounds. Objects not kept (one-shot
//! runs, objects over the budget) get tables for one batch only.

use std::cell::{Cell, OnceCell};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::elf_file::ObjectFile;
use super::function_symbols::FunctionSymbols;
use super::lines::line_of;
use super::plt::PltStubs;
use super::rust_paths::{self, RustPaths};
use crate::profile::Line;

static RUST_PATHS: AtomicU64 = AtomicU64::new(0);
static DYNAMIC_SYMBOLS: AtomicU64 = AtomicU64::new(0);
static MINIDEBUGINFO: AtomicU64 = AtomicU64::new(0);
static PLT: AtomicU64 = AtomicU64::new(0);

/// Tables built since the process started, by kind (`/metrics`): each
/// counts once per object while a continuous symbolizer keeps the object's
/// parsed data, and once per batch for objects it does not keep.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableBuilds {
    /// Rust paths read from an object's DWARF ([`RustPaths`]).
    pub rust_paths: u64,
    /// Dynamic symbol tables of objects without section headers.
    pub dynamic_symbols: u64,
    /// MiniDebugInfo symbol tables (each one `.gnu_debugdata` inflated).
    pub minidebuginfo: u64,
    /// PLT stub tables (dynamic relocations read).
    pub plt: u64,
}

/// The counts so far.
pub fn builds() -> TableBuilds {
    TableBuilds {
        rust_paths: RUST_PATHS.load(Ordering::Relaxed),
        dynamic_symbols: DYNAMIC_SYMBOLS.load(Ordering::Relaxed),
        minidebuginfo: MINIDEBUGINFO.load(Ordering::Relaxed),
        plt: PLT.load(Ordering::Relaxed),
    }
}

/// One object's derived tables, each built at most once (a table the
/// object does not have is remembered as absent too).
#[derive(Default)]
pub(super) struct ObjectTables {
    rust_paths: OnceCell<Option<RustPaths>>,
    dynamic_symbols: OnceCell<Option<FunctionSymbols>>,
    minidebuginfo: OnceCell<Option<FunctionSymbols>>,
    plt: OnceCell<Option<PltStubs>>,
    /// Heap the tables built so far hold, bytes.
    bytes: Cell<u64>,
}

/// One object's batch after blazesym's passes, for
/// [`ObjectTables::complete`]: entry `i` of each list is for the batch's
/// `i`-th file offset.
pub(super) struct Passes<'a> {
    /// The object as opened (MiniDebugInfo's messages).
    pub path: &'a Path,
    /// The file whose DWARF was read: the object, or its debug file.
    pub dwarf_path: &'a Path,
    /// The object, mapped; `None` if it could not be read as 64-bit ELF.
    pub file: Option<&'a ObjectFile>,
    /// Whether the object is the profiler's own executable (named from its
    /// symbol table only).
    pub own: bool,
    /// Whether a separate debug file was found (MiniDebugInfo comes after
    /// it, gdb's order, so it is not read then).
    pub has_debug_file: bool,
    /// Each offset's virtual address in the object (`None`: in no `PT_LOAD`).
    pub vaddrs: &'a [Option<u64>],
    /// Each offset's lines from the symbol table (blazesym without DWARF).
    pub symbols: Vec<Option<Vec<Line>>>,
    /// Each offset's lines from DWARF (names, source lines, inlined frames).
    pub debug: Vec<Option<Vec<Line>>>,
}

/// The tables one batch uses.
struct Found<'t> {
    paths: Option<&'t RustPaths>,
    dynamic: Option<&'t FunctionSymbols>,
    mini: Option<&'t FunctionSymbols>,
    plt: Option<&'t PltStubs>,
}

impl ObjectTables {
    /// The heap the tables built so far hold, bytes (each table's estimate
    /// from its capacities, added when it is built).
    pub fn heap_bytes(&self) -> u64 {
        self.bytes.get()
    }

    /// `cell`'s table, built by `build` (counted in `counter`, its bytes
    /// by `bytes`) unless it was before.
    fn built<'s, T>(
        &self,
        cell: &'s OnceCell<Option<T>>,
        counter: &AtomicU64,
        build: impl FnOnce() -> Option<T>,
        bytes: impl Fn(&T) -> u64,
    ) -> Option<&'s T> {
        cell.get_or_init(|| {
            let table = build();
            if let Some(table) = &table {
                counter.fetch_add(1, Ordering::Relaxed);
                self.bytes.set(self.bytes.get() + bytes(table));
            }
            table
        })
        .as_ref()
    }

    /// Each offset's lines, DWARF's completed from the tables: the PLT
    /// stub's callee (`name@plt`), Rust paths for names DWARF gives without
    /// one, MiniDebugInfo names where DWARF has none (only without a debug
    /// file, and only if some offset lacks DWARF), the symbol table's full
    /// name for DWARF's short one, then the symbol table's line, then the
    /// dynamic symbols of an object without section headers. Tables are
    /// built only when the batch needs them.
    pub fn complete(&self, passes: Passes<'_>) -> Vec<Option<Vec<Line>>> {
        let Passes {
            path,
            dwarf_path,
            file,
            own,
            has_debug_file,
            vaddrs,
            symbols,
            debug,
        } = passes;
        let paths = (!own && rust_paths::wanted(&symbols, &debug))
            .then(|| {
                let read = || RustPaths::read(dwarf_path);
                self.built(&self.rust_paths, &RUST_PATHS, read, RustPaths::heap_bytes)
            })
            .flatten();
        let dynamic = file.and_then(|f| {
            let read = || f.dynamic_symbols();
            let cell = &self.dynamic_symbols;
            self.built(cell, &DYNAMIC_SYMBOLS, read, FunctionSymbols::heap_bytes)
        });
        let mini = (!has_debug_file && !own && debug.iter().any(Option::is_none))
            .then(|| {
                let read = || file?.mini_debug_info(path);
                let cell = &self.minidebuginfo;
                self.built(cell, &MINIDEBUGINFO, read, FunctionSymbols::heap_bytes)
            })
            .flatten();
        let known: Vec<u64> = vaddrs.iter().flatten().copied().collect();
        let plt = file
            .filter(|f| f.in_plt(&known))
            .and_then(|f| self.built(&self.plt, &PLT, || f.plt_stubs(), PltStubs::heap_bytes));
        let found = Found {
            paths,
            dynamic,
            mini,
            plt,
        };
        debug
            .into_iter()
            .enumerate()
            .map(|(i, lines)| {
                let symbol = symbols.get(i).and_then(|s| s.as_ref()?.last());
                found.lines(lines, symbol, vaddrs[i])
            })
            .collect()
    }
}

impl Found<'_> {
    /// The lines of one offset at virtual address `vaddr`, from DWARF's
    /// `lines` and the symbol table's innermost line `symbol`.
    fn lines(
        &self,
        mut lines: Option<Vec<Line>>,
        symbol: Option<&Line>,
        vaddr: Option<u64>,
    ) -> Option<Vec<Line>> {
        // A PLT stub has no symbol: the one before it (`_init`) is not its
        // name.
        if let Some(callee) = self.plt.zip(vaddr).and_then(|(p, v)| p.name_of(v)) {
            let mut line = line_of(callee, None);
            line.function = Arc::from(format!("{}@plt", line.function));
            line.system_name = Arc::from(format!("{callee}@plt"));
            return Some(vec![line]);
        }
        if let Some((lines, paths)) = lines.as_mut().zip(self.paths) {
            paths.qualify(lines);
        }
        if lines.is_none() {
            let name = self.mini.zip(vaddr).and_then(|(m, v)| m.name_of(v));
            lines = name.map(|name| vec![line_of(name, None)]);
        }
        match (&mut lines, symbol) {
            (Some(lines), Some(symbol)) => {
                // Only where DWARF's name is the short form of the same
                // function (`hot` for `unwind_test::hot`): other toolchains'
                // symbol names carry their own decorations (Go's `.abi0`)
                // that DWARF rightly leaves out.
                if let Some(outer) = lines.last_mut() {
                    if symbol.function.ends_with(&format!("::{}", outer.function)) {
                        outer.function = symbol.function.clone();
                        outer.system_name = symbol.system_name.clone();
                    }
                }
            }
            (None, Some(symbol)) => lines = Some(vec![symbol.clone()]),
            (None, None) => {
                let name = self.dynamic.zip(vaddr).and_then(|(d, v)| d.name_of(v));
                lines = name.map(|name| vec![line_of(name, None)]);
            }
            _ => {}
        }
        lines
    }
}
