//! The stack table's records as stored in its segment files (prost
//! messages; [`super::dict`] holds them in memory and writes them).

use prost::Message;

/// A mapping: string ids for its file name and build ID (0: none).
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct MappingRec {
    /// First address (inclusive).
    #[prost(uint64, tag = "1")]
    pub start: u64,
    /// End address (exclusive).
    #[prost(uint64, tag = "2")]
    pub limit: u64,
    /// File offset of `start`, bytes.
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    /// String id of the file name.
    #[prost(uint32, tag = "4")]
    pub filename: u32,
    /// String id of the GNU build ID in hex (0: none).
    #[prost(uint32, tag = "5")]
    pub build_id: u32,
}

/// One line of a frame (string ids; `file` 0: none, `line` 0: unknown).
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct LineRec {
    /// String id of the demangled function name.
    #[prost(uint32, tag = "1")]
    pub function: u32,
    /// String id of the symbol-table name.
    #[prost(uint32, tag = "2")]
    pub system_name: u32,
    /// String id of the source file (0: none).
    #[prost(uint32, tag = "3")]
    pub file: u32,
    /// Source line (0: unknown).
    #[prost(uint32, tag = "4")]
    pub line: u32,
}

/// A frame: kind (0 kernel, 1 user, 2 unwind marker), address, mapping id
/// + 1 (0: none), lines innermost first, whether symbolized.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct FrameRec {
    /// 0 kernel, 1 user, 2 unwind marker.
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    /// Absolute address (0 for markers).
    #[prost(uint64, tag = "2")]
    pub address: u64,
    /// Mapping id + 1 (0: none).
    #[prost(uint32, tag = "3")]
    pub mapping: u32,
    /// Innermost first; never empty.
    #[prost(message, repeated, tag = "4")]
    pub lines: Vec<LineRec>,
    /// Whether the lines came from a symbol table.
    #[prost(bool, tag = "5")]
    pub symbolized: bool,
}

/// A stack: frame ids leaf first, and the string id of its unwind result's name.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct StackRec {
    /// Frame ids, leaf first.
    #[prost(uint32, repeated, tag = "1")]
    pub frames: Vec<u32>,
    /// String id of the unwind result's name.
    #[prost(uint32, tag = "2")]
    pub status: u32,
}

/// Who ran: string ids of host, process name and thread name; pid and tid.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct ThreadRec {
    /// String id of the host name.
    #[prost(uint32, tag = "1")]
    pub host: u32,
    /// Process id.
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    /// Thread id.
    #[prost(uint32, tag = "3")]
    pub tid: u32,
    /// String id of the process name.
    #[prost(uint32, tag = "4")]
    pub comm: u32,
    /// String id of the thread name.
    #[prost(uint32, tag = "5")]
    pub name: u32,
}

/// One segment file's content: the entries of each table from its `first_*` id on.
#[derive(Clone, PartialEq, Message)]
pub struct Segment {
    /// Id of the first string in this segment.
    #[prost(uint32, tag = "1")]
    pub first_string: u32,
    /// Id of the first mapping.
    #[prost(uint32, tag = "2")]
    pub first_mapping: u32,
    /// Id of the first frame.
    #[prost(uint32, tag = "3")]
    pub first_frame: u32,
    /// Id of the first stack.
    #[prost(uint32, tag = "4")]
    pub first_stack: u32,
    /// Id of the first thread.
    #[prost(uint32, tag = "5")]
    pub first_thread: u32,
    /// Strings, from `first_string` on.
    #[prost(string, repeated, tag = "6")]
    pub strings: Vec<String>,
    /// Mappings, from `first_mapping` on.
    #[prost(message, repeated, tag = "7")]
    pub mappings: Vec<MappingRec>,
    /// Frames, from `first_frame` on.
    #[prost(message, repeated, tag = "8")]
    pub frames: Vec<FrameRec>,
    /// Stacks, from `first_stack` on.
    #[prost(message, repeated, tag = "9")]
    pub stacks: Vec<StackRec>,
    /// Threads, from `first_thread` on.
    #[prost(message, repeated, tag = "10")]
    pub threads: Vec<ThreadRec>,
}
