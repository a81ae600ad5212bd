//! A function symbol table held in memory, sorted by address: what the
//! symbolizer builds from symbols blazesym cannot reach or does not give
//! out (a dynamic symbol table found through `PT_DYNAMIC` in
//! [`super::elf_file`], the `.symtab` of a MiniDebugInfo section in
//! [`super::minidebuginfo`], an object's own `.symtab` for
//! [`super::rust_paths`]). The one reader of `.symtab` functions outside
//! blazesym is [`FunctionSymbols::of_symtab`].

use object::{Object, ObjectSymbol, SymbolKind};

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
/// through `PT_DYNAMIC`, or a `.symtab`), sorted by address.
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

    /// The functions of `file`'s `.symtab` (text symbols defined in it;
    /// virtual addresses of the object). Empty when it has none.
    pub fn of_symtab<'data>(file: &impl Object<'data>) -> Self {
        let functions = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .filter_map(|s| Some((s.address(), s.size(), s.name_bytes().ok()?)));
        Self::new(functions)
    }

    /// How many functions the table has.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// The heap the table holds, bytes (its entries and their names).
    pub fn heap_bytes(&self) -> u64 {
        let names: usize = self.symbols.iter().map(|s| s.name.capacity()).sum();
        (self.symbols.capacity() * std::mem::size_of::<FunctionSymbol>() + names) as u64
    }

    /// The name of a function starting exactly at virtual address
    /// `address` (of several aliases there, the largest, then the first in
    /// the table).
    pub fn starting_at(&self, address: u64) -> Option<&str> {
        let first = self.symbols.partition_point(|s| s.start < address);
        let symbol = self.symbols.get(first)?;
        (symbol.start == address).then_some(symbol.name.as_str())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A covering lookup finds the function around an address; an exact
    /// one only a function starting there (the largest of aliases).
    #[test]
    fn exact_and_covering_lookups_read_one_table() {
        let table = FunctionSymbols::new(
            [
                (0x1000, 0x10, &b"small_alias"[..]),
                (0x1000, 0x20, b"big"),
                (0x1040, 0, b"sizeless"),
                (0, 0x10, b"undefined"),
            ]
            .into_iter(),
        );
        assert_eq!(table.len(), 3);
        assert_eq!(table.starting_at(0x1000), Some("big"));
        assert_eq!(table.starting_at(0x1008), None);
        assert_eq!(table.starting_at(0x1040), Some("sizeless"));
        assert_eq!(table.starting_at(0), None);
        assert_eq!(table.name_of(0x1018), Some("big"));
        assert_eq!(table.name_of(0x1041), None);
        assert!(table.heap_bytes() >= 3 * std::mem::size_of::<FunctionSymbol>() as u64);
    }
}
