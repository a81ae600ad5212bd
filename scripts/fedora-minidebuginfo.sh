# What Fedora's find-debuginfo does to the ELF file "$1" (strip_to_debug
# with binutils for eu-strip, then add_minidebug, the commands as it runs
# them): the debug file "$1.debug" split off and linked, the file stripped,
# and the functions of the debug file's .symtab that .dynsym lacks kept
# xz-compressed in .gnu_debugdata. Needs binutils and xz-utils. Used by
# tests/debug_info.rs and benches/symbolize.rs (include_str!, run with sh -c).
set -e
binary="$1"; debuginfo="$1.debug"
objcopy --only-keep-debug "$binary" "$debuginfo"
strip --strip-all --remove-section=.comment "$binary"
objcopy --add-gnu-debuglink="$debuginfo" "$binary"
dynsyms="$binary.dynsyms"; funcsyms="$binary.funcsyms"; keep_symbols="$binary.keep"
mini_debuginfo="$binary.mini"
nm -D "$binary" --format=posix --defined-only | awk '{ print $1 }' | sort > "$dynsyms"
nm "$debuginfo" --format=sysv --defined-only | awk -F \| '{ if ($4 ~ "FUNC") print $1 }' | sort > "$funcsyms"
comm -13 "$dynsyms" "$funcsyms" > "$keep_symbols"
objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols="$keep_symbols" "$debuginfo" "$mini_debuginfo"
xz --threads=1 "$mini_debuginfo"
objcopy --add-section .gnu_debugdata="$mini_debuginfo.xz" "$binary"
