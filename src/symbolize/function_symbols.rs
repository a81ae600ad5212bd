//! A function symbol table held in memory, sorted by address: what the
//! symbolizer builds from symbols blazesym cannot reach (a dynamic symbol
//! table found through `PT_DYNAMIC` in [`super::elf_file`], or the `.symtab`
//! of a MiniDebugInfo section in [`super::minidebuginfo`]).

/// One function of a symbol table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FunctionSymbol {
    /// Virtual address of its first byte.
    start: u64,
    /// Its size, bytes (0 when the symbol table does not say).
    size: u64,
    /// Its (mangled) name.
    name: String,
}

/// The function symbols of a symbol table (a dynamic symbol table read
/// through `PT_DYNAMIC`, or a MiniDebugInfo `.symtab`), sorted by address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FunctionSymbols {
    symbols: Vec<FunctionSymbol>,
}

impl FunctionSymbols {
    /// The table of `functions`, each `(virtual address, size in bytes,
    /// name)`; those at address 0 (undefined) are left out.
    pub fn new<'n>(functions: impl Iterator<Item = (u64, u64, &'n [u8])>) -> Self {
        let mut symbols: Vec<FunctionSymbol> = functions
            .filter(|&(start, _, _)| start != 0)
            .map(|(start, size, name)| FunctionSymbol {
                start,
                size,
                name: String::from_utf8_lossy(name).into_owned(),
            })
            .collect();
        symbols.sort_by_key(|s| (s.start, std::cmp::Reverse(s.size)));
        FunctionSymbols { symbols }
    }

    /// How many functions the table has.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// The name of the function whose range holds virtual address
    /// `address`: among the symbols with the highest start at or below it,
    /// one whose size covers it (a sizeless symbol only matches its own
    /// address, as blazesym treats them).
    pub fn name_of(&self, address: u64) -> Option<&str> {
        let candidates = &self.symbols[..self.symbols.partition_point(|s| s.start <= address)];
        let nearest = candidates.last()?.start;
        candidates
            .iter()
            .rev()
            .take_while(|s| s.start == nearest)
            .find(|s| s.start == address || address < s.start.saturating_add(s.size))
            .map(|s| s.name.as_str())
    }
}
