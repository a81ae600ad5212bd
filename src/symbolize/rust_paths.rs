//! Full paths for functions whose DWARF names them without their module:
//! Rust built with `debuginfo=line-tables-only` (cargo's `debug =
//! "line-tables-only"`) gives each function, inlined or not, only its
//! `DW_AT_name` (`spin`, `{closure#0}`, `run<app::main::{closure_env#0}>`),
//! with no namespace around it and no `DW_AT_linkage_name`, where the
//! symbol table says `app::outer::spin`. (With limited or full debug info
//! the abstract origin of an inlined function has a linkage name, which
//! blazesym already reports.)
//!
//! The path is taken from the symbol table through the function's
//! out-of-line copy, when it has one: a `DW_TAG_subprogram` with an address
//! and the same name whose own source lines (the line table's rows for its
//! code, in the file of its first row) span the frame's source line, in
//! the same file. A frame whose name has no such copy (a function only ever
//! inlined) keeps its short name: a name alone does not say which of the
//! functions of that name it is. Where candidates disagree (two functions
//! of one name in one file, over the same lines), it keeps it too.
//!
//! LLVM's line-tables-only DWARF does not link an out-of-line copy to the
//! abstract DIE its inlined calls refer to (no `DW_AT_abstract_origin`), so
//! the source location is the evidence that they are one function.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use gimli::{AttributeValue, Dwarf, EndianSlice, RunTimeEndian, Unit};
use object::{Object, ObjectSection};

use super::function_symbols::FunctionSymbols;
use super::lines::{demangle, file_name, line_of};
use crate::profile::Line;

/// Most DIEs read from one object: bounds the work on huge debug info.
const MAX_ENTRIES: usize = 1 << 24;

type Slice<'d> = EndianSlice<'d, RunTimeEndian>;

/// The out-of-line copies of functions DWARF names without a path.
#[derive(Debug, Default)]
pub(super) struct RustPaths {
    /// DWARF name -> its copies.
    copies: HashMap<String, Vec<OutOfLine>>,
}

/// One out-of-line copy of a function: where its own source lines are, and
/// its symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OutOfLine {
    /// The last component of its source file's path.
    file: String,
    /// Its lowest and highest source line there.
    lines: (u64, u64),
    /// Its (mangled) symbol.
    symbol: String,
}

/// A function DIE with an address, before its lines are known.
struct Concrete {
    name: String,
    low: u64,
    high: u64,
    symbol: String,
}

impl RustPaths {
    /// Read the out-of-line copies of the Rust functions of the DWARF in the
    /// file at `path` (the object or its debug file) whose DIEs have a name
    /// but no linkage name, with their symbols from its symbol table.
    /// `None` if it cannot be read.
    pub fn read(path: &Path) -> Option<RustPaths> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: a read-only private mapping of an object file, as
        // blazesym maps them too; a file truncated while it is read can fault.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let file = object::File::parse(&*map).ok()?;
        file.section_by_name(".debug_info")?;
        let symbols = FunctionSymbols::of_symtab(&file);
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let sections = gimli::DwarfSections::<Cow<[u8]>>::load(|id| -> Result<_, gimli::Error> {
            Ok(file
                .section_by_name(id.name())
                .and_then(|s| s.uncompressed_data().ok())
                .unwrap_or(Cow::Borrowed(&[])))
        })
        .ok()?;
        let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
        let mut paths = RustPaths::default();
        let mut budget = MAX_ENTRIES;
        let mut headers = dwarf.units();
        while let Ok(Some(header)) = headers.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            if !is_rust(&unit) {
                continue;
            }
            let functions = concrete_functions(&dwarf, &unit, &symbols, &mut budget);
            if !functions.is_empty() {
                paths.add_copies(&dwarf, &unit, functions);
            }
            if budget == 0 {
                break;
            }
        }
        Some(paths)
    }

    /// The heap the table holds, bytes (estimated from its capacities:
    /// the map's slots, each name's copies, their strings).
    pub fn heap_bytes(&self) -> u64 {
        let slot = std::mem::size_of::<(String, Vec<OutOfLine>)>() + 1;
        let entries: usize = self
            .copies
            .iter()
            .map(|(name, copies)| {
                let strings: usize = copies
                    .iter()
                    .map(|c| c.file.capacity() + c.symbol.capacity())
                    .sum();
                name.capacity() + copies.capacity() * std::mem::size_of::<OutOfLine>() + strings
            })
            .sum();
        (self.copies.capacity() * slot + entries) as u64
    }

    /// Find each of `functions`' own source lines in `unit`'s line table.
    fn add_copies(
        &mut self,
        dwarf: &Dwarf<Slice<'_>>,
        unit: &Unit<Slice<'_>>,
        functions: Vec<Concrete>,
    ) {
        let rows = line_rows(dwarf, unit);
        for f in functions {
            let first = rows.partition_point(|r| r.0 < f.low);
            let in_range = || rows[first..].iter().take_while(|r| r.0 < f.high);
            let Some(own_file) = in_range().next().map(|r| r.1.clone()) else {
                continue;
            };
            let lines = in_range().filter(|r| r.1 == own_file).map(|r| r.2);
            let (Some(lo), Some(hi)) = (lines.clone().min(), lines.max()) else {
                continue;
            };
            self.copies.entry(f.name).or_default().push(OutOfLine {
                file: own_file,
                lines: (lo, hi),
                symbol: f.symbol,
            });
        }
    }

    /// The (mangled) symbol of the function DWARF calls `dwarf_name` whose
    /// out-of-line copy's source lines in `file` (a file name) span `line`,
    /// when all such copies demangle to one name.
    pub fn symbol_for(&self, dwarf_name: &str, file: &str, line: u64) -> Option<&str> {
        let mut matching = self
            .copies
            .get(dwarf_name)?
            .iter()
            .filter(|c| c.file == file && c.lines.0 <= line && line <= c.lines.1);
        let first = matching.next()?;
        let name = demangle(&first.symbol);
        matching
            .all(|c| demangle(&c.symbol) == name)
            .then_some(first.symbol.as_str())
    }

    /// Give each of `lines` that one function's copy accounts for
    /// ([`Self::symbol_for`]) that function's symbol-table name.
    pub fn qualify(&self, lines: &mut [Line]) {
        for line in lines {
            let (Some(file), Some(number)) = (line.file.as_deref(), line.line) else {
                continue;
            };
            if let Some(symbol) =
                self.symbol_for(&line.system_name, file_name(file), u64::from(number))
            {
                let named = line_of(symbol, None);
                line.function = named.function;
                line.system_name = named.system_name;
            }
        }
    }
}

/// Whether `line` names its function without a path (`spin`, not
/// `app::spin`; generic arguments aside: `run<app::Env>` has none).
fn lacks_path(line: &Line) -> bool {
    line.function
        .split('<')
        .next()
        .is_some_and(|head| !head.contains("::"))
}

/// Whether an object's DWARF is worth reading for paths: some of its
/// `symbols` (the symbol table's lines of a batch) are Rust's (they
/// demangle as Rust), and some of the `debug` lines (DWARF's) lack a path.
pub(super) fn wanted(symbols: &[Option<Vec<Line>>], debug: &[Option<Vec<Line>>]) -> bool {
    let rust = |l: &Line| rustc_demangle::try_demangle(&l.system_name).is_ok();
    symbols.iter().flatten().flatten().any(rust) && debug.iter().flatten().flatten().any(lacks_path)
}

/// Whether `unit` is Rust (`DW_AT_language` of its root DIE).
fn is_rust(unit: &Unit<Slice<'_>>) -> bool {
    let mut entries = unit.entries();
    let Ok(Some(root)) = entries.next_dfs() else {
        return false;
    };
    matches!(
        root.attr_value(gimli::DW_AT_language),
        Some(AttributeValue::Language(gimli::DW_LANG_Rust))
    )
}

/// The `DW_TAG_subprogram`s of `unit` with an address, a symbol there, a
/// name of their own and no linkage name. Counts the DIEs read off `budget`.
fn concrete_functions(
    dwarf: &Dwarf<Slice<'_>>,
    unit: &Unit<Slice<'_>>,
    symbols: &FunctionSymbols,
    budget: &mut usize,
) -> Vec<Concrete> {
    let mut found = Vec::new();
    let mut entries = unit.entries();
    while let Ok(Some(entry)) = entries.next_dfs() {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        if entry.tag() != gimli::DW_TAG_subprogram {
            continue;
        }
        let (mut name, mut low, mut high, mut size) = (None, None, None, None);
        for attr in entry.attrs() {
            match (attr.name(), attr.value()) {
                (gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name, _)
                | (gimli::DW_AT_abstract_origin | gimli::DW_AT_specification, _) => {
                    name = None;
                    break;
                }
                (gimli::DW_AT_name, value) => {
                    name = dwarf
                        .attr_string(unit, value)
                        .ok()
                        .map(|s| s.to_string_lossy().into_owned());
                }
                (gimli::DW_AT_low_pc, AttributeValue::Addr(a)) => low = Some(a),
                (gimli::DW_AT_low_pc, AttributeValue::DebugAddrIndex(i)) => {
                    low = dwarf.address(unit, i).ok()
                }
                (gimli::DW_AT_high_pc, AttributeValue::Addr(a)) => high = Some(a),
                (gimli::DW_AT_high_pc, AttributeValue::Udata(n)) => size = Some(n),
                _ => {}
            }
        }
        let (Some(name), Some(low)) = (name, low) else {
            continue;
        };
        let Some(high) = high.or_else(|| size.map(|n| low.saturating_add(n))) else {
            continue;
        };
        if let Some(symbol) = symbols.starting_at(low) {
            found.push(Concrete {
                name,
                low,
                high,
                symbol: symbol.to_string(),
            });
        }
    }
    found
}

/// `unit`'s line table as (address, file name, line) rows, by address.
fn line_rows(dwarf: &Dwarf<Slice<'_>>, unit: &Unit<Slice<'_>>) -> Vec<(u64, String, u64)> {
    let mut out = Vec::new();
    let Some(program) = unit.line_program.clone() else {
        return out;
    };
    let mut rows = program.rows();
    while let Ok(Some((header, row))) = rows.next_row() {
        let (Some(line), Some(file)) = (row.line(), row.file(header)) else {
            continue;
        };
        let Ok(path) = dwarf.attr_string(unit, file.path_name()) else {
            continue;
        };
        let path = path.to_string_lossy();
        out.push((row.address(), file_name(&path).to_string(), line.get()));
    }
    out.sort_by_key(|r| r.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(file: &str, lines: (u64, u64), symbol: &str) -> OutOfLine {
        OutOfLine {
            file: file.to_string(),
            lines,
            symbol: symbol.to_string(),
        }
    }

    /// A frame gets a symbol only from a copy of its name whose lines in
    /// its file span its line, and only when such copies agree.
    #[test]
    fn only_a_copy_over_the_frames_line_names_it() {
        let spin = "_ZN4demo5outer4spin17h0123456789abcdefE";
        let spin_again = "_ZN4demo5outer4spin17hfedcba9876543210E";
        let other = "_ZN4demo5other4spin17h0123456789abcdefE";
        let mut paths = RustPaths::default();
        paths.copies.insert(
            "spin".into(),
            vec![
                copy("lib.rs", (10, 20), spin),
                copy("lib.rs", (12, 18), spin_again),
                copy("other.rs", (10, 20), other),
                copy("both.rs", (1, 9), spin),
                copy("both.rs", (5, 15), other),
            ],
        );
        assert_eq!(paths.symbol_for("spin", "lib.rs", 15), Some(spin));
        assert_eq!(paths.symbol_for("spin", "lib.rs", 25), None);
        assert_eq!(paths.symbol_for("spin", "main.rs", 15), None);
        assert_eq!(paths.symbol_for("spin", "other.rs", 10), Some(other));
        assert_eq!(paths.symbol_for("spin", "both.rs", 3), Some(spin));
        assert_eq!(paths.symbol_for("spin", "both.rs", 7), None);
        assert_eq!(paths.symbol_for("new", "lib.rs", 15), None);
    }
}
