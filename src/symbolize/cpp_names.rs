//! C++ (Itanium ABI) names, demangled by cpp_demangle through its
//! structured output, which lets this module mend one of its printing
//! faults: an empty template parameter pack (`J E` in the mangled name)
//! still gets the comma before it, so
//! `_ZN4llvm15AnalysisManagerINS_8FunctionEJEE3runEv` came out as
//! `llvm::AnalysisManager<llvm::Function, >::run()` where c++filt and perf
//! print `llvm::AnalysisManager<llvm::Function>::run()`
//! (gimli-rs/cpp_demangle issue 132).

use cpp_demangle::{DemangleNodeType, DemangleOptions, DemangleWrite, Symbol};

/// The demangled form of the Itanium-mangled `name`, as llvm-cxxfilt prints
/// it (GNU c++filt agrees but for empty packs before the last argument,
/// where it keeps the separator); `None` when `name` does not parse as one.
pub(super) fn demangle(name: &str) -> Option<String> {
    let symbol = Symbol::new(name).ok()?;
    let mut out = ArgumentList::default();
    symbol
        .structured_demangle(&mut out, &DemangleOptions::default())
        .ok()?;
    Some(out.text)
}

/// The separator cpp_demangle writes between template arguments.
const SEPARATOR: &str = ", ";

/// Receives the demangled text with the node it belongs to, and holds
/// back each separator written directly inside a template argument list
/// until an argument follows it: an empty pack writes nothing, so a
/// separator followed by another separator, by the list's end, or written
/// right after its `<`, is dropped.
#[derive(Default)]
struct ArgumentList {
    text: String,
    /// The nodes entered and not yet left, innermost last.
    nodes: Vec<DemangleNodeType>,
    /// The depth (length of `nodes`) at which a separator was held back.
    held: Option<usize>,
}

impl DemangleWrite for ArgumentList {
    fn push_demangle_node(&mut self, node: DemangleNodeType) {
        self.nodes.push(node);
    }

    fn write_string(&mut self, s: &str) -> std::fmt::Result {
        if s == SEPARATOR && self.nodes.last() == Some(&DemangleNodeType::TemplateArgs) {
            // A separator still held is followed by another: the argument
            // between them was an empty pack.
            self.held = Some(self.nodes.len());
            return Ok(());
        }
        if self.held.take().is_some() && !self.text.ends_with('<') {
            self.text.push_str(SEPARATOR);
        }
        self.text.push_str(s);
        Ok(())
    }

    fn pop_demangle_node(&mut self) {
        // The list ends after its separator: the last argument was empty.
        if self.held == Some(self.nodes.len()) {
            self.held = None;
        }
        self.nodes.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::demangle;

    /// Each as llvm-cxxfilt 14 prints it.
    #[test]
    fn empty_packs_leave_no_separator_behind() {
        for (mangled, expected) in [
            (
                "_ZN4llvm15AnalysisManagerINS_8FunctionEJEE3runEv",
                "llvm::AnalysisManager<llvm::Function>::run()",
            ),
            // An empty pack first, then an argument.
            ("_ZN1fIJEiE1gEv", "f<int>::g()"),
            // An empty pack between two arguments.
            ("_ZN1fIiJEcE1gEv", "f<int, char>::g()"),
            // Packs with arguments keep their separators.
            ("_Z3addIJicEEvDpT_", "void add<int, char>(int, char)"),
            (
                "_ZNSt6vectorIiSaIiEE9push_backERKi",
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
            ),
            ("_Z3addii", "add(int, int)"),
        ] {
            assert_eq!(demangle(mangled).as_deref(), Some(expected), "{mangled}");
        }
        assert_eq!(demangle("main"), None);
    }
}
