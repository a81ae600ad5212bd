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
    Some(without_empty_pack_parameters(out.text))
}

/// What cpp_demangle prints for an empty function parameter pack (`Dp`:
/// `Args&&...`, `const Args&...`, `Args*...` with no arguments): the
/// pattern's qualifiers alone (` const&` with its space), which no real
/// parameter is.
const EMPTY_PACK_PARAMETERS: [&str; 5] = ["&&", "&", " const&", "const&", "*"];

/// `text` without the parameters an empty parameter pack left in it
/// (`f(int, &&)` for llvm-cxxfilt's `f(int)`).
fn without_empty_pack_parameters(mut text: String) -> String {
    for parameter in EMPTY_PACK_PARAMETERS {
        for (from, to) in [
            (format!("({parameter})"), "()"),
            (format!("({parameter}, "), "("),
            (format!(", {parameter})"), ")"),
            (format!(", {parameter}, "), ", "),
        ] {
            while text.contains(&from) {
                text = text.replace(&from, to);
            }
        }
    }
    text
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
    /// A list just ended with a separator dropped: cpp_demangle, which saw
    /// its `, ` last, writes `>` without the space it puts between `>`s.
    closed_after_drop: bool,
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
        if std::mem::take(&mut self.closed_after_drop)
            && s.starts_with('>')
            && self.text.ends_with('>')
        {
            self.text.push(' ');
        }
        self.text.push_str(s);
        Ok(())
    }

    fn pop_demangle_node(&mut self) {
        // The list ends after its separator: the last argument was empty.
        if self.held == Some(self.nodes.len()) {
            self.held = None;
            self.closed_after_drop = true;
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
            // An empty function parameter pack (`Args&&...`).
            (
                "_ZNSt6vectorIN4llvm16ExecutionContextESaIS1_EE17_M_realloc_insertIJEEEvN9__gnu_cxx17__normal_iteratorIPS1_S3_EEDpOT_",
                "void std::vector<llvm::ExecutionContext, std::allocator<llvm::ExecutionContext> \
                 >::_M_realloc_insert<>(__gnu_cxx::__normal_iterator<llvm::ExecutionContext*, \
                 std::vector<llvm::ExecutionContext, std::allocator<llvm::ExecutionContext> > >)",
            ),
            ("_Z1fIJEEviDpOT_", "void f<>(int)"),
            ("_Z1fIJEEvDpRKT_", "void f<>()"),
            // A list ending in an empty pack, closing another list.
            (
                "_ZN4llvm11PassBuilder25invokePeepholeEPCallbacksERNS_11PassManagerINS_8FunctionENS_15AnalysisManagerIS2_JEEEJEEENS_17OptimizationLevelE",
                "llvm::PassBuilder::invokePeepholeEPCallbacks(llvm::PassManager<llvm::Function, \
                 llvm::AnalysisManager<llvm::Function> >&, llvm::OptimizationLevel)",
            ),
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

    /// The template argument and parameter lists of `name` as printed: its
    /// `<`, `>` and `,`, with the space between two `>` (what empty packs
    /// and their separators change), leaving out how each argument itself is printed
    /// (cpp_demangle and llvm-cxxfilt differ there in ways that have
    /// nothing to do with packs: `(unsigned int)8` for `8u`, a function
    /// type's space before its parameters, `&&` lost after some pack
    /// expansions' non-reference types).
    fn argument_lists(name: &str) -> String {
        let kept: Vec<char> = name.chars().filter(|c| "<>, ".contains(*c)).collect();
        (0..kept.len())
            .filter(|&i| {
                kept[i] != ' ' || (i > 0 && kept[i - 1] == '>' && kept.get(i + 1) == Some(&'>'))
            })
            .map(|i| kept[i])
            .collect()
    }

    /// Every name with a pack (`J...E`) among libLLVM's dynamic symbols has
    /// its template argument lists and function parameters printed as
    /// llvm-cxxfilt prints them (skipped when either is absent).
    #[test]
    fn llvm_names_with_packs_match_llvm_cxxfilt() {
        use object::ObjectSymbol;
        use std::io::Write;
        use std::process::{Command, Stdio};
        const LIBLLVM: &str = "/usr/lib/llvm-14/lib/libLLVM-14.so.1";
        let Ok(bytes) = std::fs::read(LIBLLVM) else {
            eprintln!("skipped: {LIBLLVM} is absent");
            return;
        };
        let file =
            object::read::elf::ElfFile64::<object::Endianness>::parse(&*bytes).expect("parses");
        let mut names: Vec<String> = object::Object::dynamic_symbols(&file)
            .filter_map(|s| s.name().ok().map(str::to_string))
            .filter(|n| n.starts_with("_Z") && n.contains("JE"))
            .collect();
        names.sort();
        names.dedup();
        let Ok(mut filter) = Command::new("llvm-cxxfilt")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        else {
            eprintln!("skipped: no llvm-cxxfilt");
            return;
        };
        let input = names.join("\n") + "\n";
        let mut stdin = filter.stdin.take().expect("stdin");
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let output = filter.wait_with_output().expect("llvm-cxxfilt");
        writer.join().expect("writer").expect("write");
        let expected = String::from_utf8(output.stdout).expect("UTF-8");
        let expected: Vec<&str> = expected.lines().collect();
        assert_eq!(expected.len(), names.len());
        let empty_packs = names.iter().filter(|n| n.contains("JEE")).count();
        assert!(
            empty_packs > 100,
            "only {empty_packs} names with empty packs"
        );
        let wrong: Vec<String> = names
            .iter()
            .zip(&expected)
            .filter(|(name, want)| {
                demangle(name).map(|ours| argument_lists(&ours)) != Some(argument_lists(want))
            })
            .map(|(name, want)| format!("{name}\n  ours: {:?}\n  llvm: {want}", demangle(name)))
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {} differ:\n{}",
            wrong.len(),
            names.len(),
            wrong
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
