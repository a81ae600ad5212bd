//! The pipeline's data types: what the BPF program reports (one sample
//! record, how its user-stack walk ended, process events) and how user space
//! describes a process's executable mappings to it. The sampler produces
//! and consumes them; the process tracker, aggregator, symbolizer and
//! encoders read them.
//!
//! The byte layouts are the C structs of `src/sampling/bpf/profiler.h` as the
//! libbpf-rs skeleton generates them from the BPF object's BTF at build time
//! (`crate::sampling::skel::types`): no field offset here is written by hand, and the
//! enum values below are the generated ones of `profiler.h`'s enums, which
//! its records carry as plain integers.

use std::mem::size_of;

use anyhow::{anyhow, bail, Result};

use crate::sampling::skel::types;

/// `SAMPLE_FLAG_KERNEL_THREAD` in `struct sample_header.flags`.
const SAMPLE_FLAG_KERNEL_THREAD: u8 = types::sample_flag::SAMPLE_FLAG_KERNEL_THREAD.0 as u8;
/// `SAMPLE_FLAG_STACK_COPY`: a `struct stack_copy` follows the whole
/// `struct stack_sample`.
const SAMPLE_FLAG_STACK_COPY: u8 = types::sample_flag::SAMPLE_FLAG_STACK_COPY.0 as u8;
/// `SAMPLE_FLAG_OFF_CPU`: the record is a wait, not a cpu-clock sample.
const SAMPLE_FLAG_OFF_CPU: u8 = types::sample_flag::SAMPLE_FLAG_OFF_CPU.0 as u8;
/// `SAMPLE_FLAG_RUNNABLE`: the wait was for a CPU (preempted), not a block.
const SAMPLE_FLAG_RUNNABLE: u8 = types::sample_flag::SAMPLE_FLAG_RUNNABLE.0 as u8;
/// `PYTHON_WALKED` in `enum python_status`.
const PYTHON_WALKED: u32 = types::python_status::PYTHON_WALKED.0;
/// `enum event_type`.
const EVENT_EXEC: u32 = types::event_type::EVENT_EXEC.0;
const EVENT_EXIT: u32 = types::event_type::EVENT_EXIT.0;
const EVENT_UNKNOWN_MAPPING: u32 = types::event_type::EVENT_UNKNOWN_MAPPING.0;
const EVENT_FORK: u32 = types::event_type::EVENT_FORK.0;
const EVENT_MAPPING: u32 = types::event_type::EVENT_MAPPING.0;
/// `enum mapping_kind`.
const MAPPING_TABLE: u32 = types::mapping_kind::MAPPING_TABLE.0;
const MAPPING_FRAME_POINTERS: u32 = types::mapping_kind::MAPPING_FRAME_POINTERS.0;

/// How the user-stack walk of one sample ended (`enum unwind_status` in
/// `src/sampling/bpf/profiler.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnwindStatus {
    /// The walk reached the outermost frame.
    Complete,
    /// The walk stopped at the frame limit; outer frames are missing.
    Truncated,
    /// Reading the user stack failed part-way.
    ReadFault,
    /// A kernel thread: there is no user stack.
    NoUserStack,
    /// A frame-pointer walk that stopped where the chain stopped (an
    /// unreadable or non-increasing frame pointer); whether outer frames
    /// exist is unknown.
    FramePointer,
    /// A PC fell outside every known mapping.
    NoMapping,
    /// The object's unwind table was not loaded yet.
    NoTable,
    /// A CFI rule the BPF program cannot evaluate.
    UnsupportedRule,
    /// The process's mappings were not known yet (it existed before its
    /// exec or fork could be followed, or was described before its latest
    /// exec): the frames are what frame pointers gave.
    MappingsUnknown,
    /// An off-CPU wait that did not end in a system call's return (a
    /// preemption, a page fault): its user stack could not be read in the
    /// thread's own context before it ran on; only its user pc is known.
    NotWalked,
    /// Set in user space, never by the BPF program: a walk the BPF program
    /// could not finish went on from its copy of the stack
    /// ([`crate::unwind::deferred`]) until the copy ended, short of the
    /// outermost frame; the frames up to there are the CFI walk's.
    StackCopyEnded,
    /// A value this version does not know.
    Unknown(u8),
}

impl UnwindStatus {
    /// Every status with a name of its own (all but [`Self::Unknown`]): the
    /// ones [`Self::from_name`] reads back.
    pub const NAMED: [UnwindStatus; 11] = [
        Self::Complete,
        Self::Truncated,
        Self::ReadFault,
        Self::NoUserStack,
        Self::FramePointer,
        Self::NoMapping,
        Self::NoTable,
        Self::UnsupportedRule,
        Self::MappingsUnknown,
        Self::NotWalked,
        Self::StackCopyEnded,
    ];

    /// The status whose [`Self::name`] is `name`: one of [`Self::NAMED`], or
    /// `unknown_N` as [`Self::Unknown`]; `None` for any other string.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMED
            .into_iter()
            .find(|s| s.name() == name)
            .or_else(|| Some(Self::Unknown(name.strip_prefix("unknown_")?.parse().ok()?)))
    }

    fn from_raw(raw: u8) -> Self {
        match types::unwind_status(u32::from(raw)) {
            types::unwind_status::UNWIND_COMPLETE => Self::Complete,
            types::unwind_status::UNWIND_TRUNCATED => Self::Truncated,
            types::unwind_status::UNWIND_READ_FAULT => Self::ReadFault,
            types::unwind_status::UNWIND_NO_USER_STACK => Self::NoUserStack,
            types::unwind_status::UNWIND_FRAME_POINTER => Self::FramePointer,
            types::unwind_status::UNWIND_NO_MAPPING => Self::NoMapping,
            types::unwind_status::UNWIND_NO_TABLE => Self::NoTable,
            types::unwind_status::UNWIND_UNSUPPORTED_RULE => Self::UnsupportedRule,
            types::unwind_status::UNWIND_MAPPINGS_UNKNOWN => Self::MappingsUnknown,
            types::unwind_status::UNWIND_NOT_WALKED => Self::NotWalked,
            _ => Self::Unknown(raw),
        }
    }

    /// Whether the user stack is known to be incomplete (outer frames missing).
    pub fn is_incomplete(self) -> bool {
        !matches!(
            self,
            Self::Complete | Self::NoUserStack | Self::FramePointer
        )
    }

    /// Short name used in summaries, metrics and the frame that marks an
    /// incomplete stack.
    pub fn name(self) -> String {
        match self {
            Self::Complete => "complete".into(),
            Self::Truncated => "truncated".into(),
            Self::ReadFault => "read_fault".into(),
            Self::NoUserStack => "no_user_stack".into(),
            Self::FramePointer => "frame_pointer".into(),
            Self::NoMapping => "no_mapping".into(),
            Self::NoTable => "no_table".into(),
            Self::UnsupportedRule => "unsupported_rule".into(),
            Self::MappingsUnknown => "mappings_unknown".into(),
            Self::NotWalked => "not_walked".into(),
            Self::StackCopyEnded => "stack_copy_ended".into(),
            Self::Unknown(raw) => format!("unknown_{raw}"),
        }
    }
}

/// One sample as the BPF program recorded it: who ran, and both raw stacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSample {
    /// `bpf_ktime_get_ns()` at the sample: CLOCK_MONOTONIC, ns.
    pub timestamp_ns: u64,
    /// Process id (thread group id) in the initial pid namespace.
    pub pid: u32,
    /// Thread id in the initial pid namespace.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// The process's name (the thread group leader's comm).
    pub process_comm: String,
    /// The sampled thread's name (its comm).
    pub thread_comm: String,
    /// Whether the task is a kernel thread (no user stack).
    pub kernel_thread: bool,
    /// Kernel return addresses, leaf first (absolute kernel addresses).
    pub kernel_stack: Vec<u64>,
    /// User addresses, leaf first: the sampled PC, then return addresses.
    pub user_stack: Vec<u64>,
    /// How the user-stack walk ended.
    pub user_status: UnwindStatus,
    /// For a walk that stopped for want of a table or a mapping: the
    /// registers of the frame it could not go past and the stack above
    /// them, for user space to walk on from ([`crate::unwind::deferred`]).
    pub stack_copy: Option<Box<StackCopy>>,
    /// The Python frames the BPF walker recorded (`struct python_frame`,
    /// two words each, innermost first; named by [`crate::unwind::interp`]).
    pub python: Vec<u64>,
    /// Whether the BPF walker found the thread's Python frames
    /// (`PYTHON_WALKED` in `enum python_status`), for a process whose
    /// interpreter it knows.
    pub python_walked: bool,
    /// `Some` for an off-CPU record (`--off-cpu`): the thread was off its
    /// CPU for this wait, which ended at `timestamp_ns`; the stacks are
    /// where it left the CPU. `None` for a cpu-clock sample.
    pub wait: Option<Wait>,
}

/// A time a thread spent off its CPU (`SAMPLE_FLAG_OFF_CPU` records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// From leaving the CPU to running again, ns.
    pub ns: u64,
    /// The thread was preempted (or yielded) and waited for a CPU, rather
    /// than blocked.
    pub runnable: bool,
}

/// The registers of one frame of a sample and a copy of the user stack
/// from its rsp up (`struct stack_copy` in `src/sampling/bpf/profiler.h`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackCopy {
    /// The frame's pc: the sampled pc or a signal frame's when `exact_ip`,
    /// else a return address.
    pub ip: u64,
    /// Its rsp: the address of `bytes[0]`.
    pub sp: u64,
    /// Its rbp.
    pub bp: u64,
    /// Its rbx, if the BPF walker recovered it (the interrupted register,
    /// or the word a caller's save slot held): `None` after a frame-pointer
    /// step or an rbx rule it does not follow.
    pub bx: Option<u64>,
    /// Its index in [`RawSample::user_stack`].
    pub frame: usize,
    /// Whether `ip` is not a return address.
    pub exact_ip: bool,
    /// The user stack from `sp` up: `STACK_COPY_SMALL_BYTES` (8 KiB)
    /// when that reaches past the top of a main thread's stack,
    /// `STACK_COPY_LARGE_BYTES` (96 KiB) when the ring had room, else
    /// `STACK_COPY_BYTES` (32 KiB); 32 KiB in a split copy ([`Self::upper`]).
    pub bytes: Vec<u8>,
    /// Pages of `bytes` the BPF program could not read (holes: a stack
    /// page never touched is not present): bit i for the i-th page from the
    /// one holding `sp`.
    pub missing_pages: u32,
    /// A split copy's upper part, the 64 KiB below the end of the stack
    /// (the outermost frames), when the stack is deeper than 96 KiB and its
    /// end is known; `None` for a copy in one part.
    pub upper: Option<UpperPart>,
}

/// The upper part of a split [`StackCopy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpperPart {
    /// The user address of `bytes[0]` (page aligned).
    pub start: u64,
    /// The stack from `start` up.
    pub bytes: Vec<u8>,
    /// Pages of `bytes` that could not be read, bit i for the i-th page.
    pub missing_pages: u32,
}

/// The 8-byte word at `addr` of a copy of the memory from `start`
/// (`bytes`, with `missing` pages as holes), if the copy holds all of it.
fn word_of(start: u64, bytes: &[u8], missing: u32, addr: u64) -> Option<u64> {
    let offset = usize::try_from(addr.checked_sub(start)?).ok()?;
    let word = bytes.get(offset..offset.checked_add(8)?)?;
    let in_hole = [addr, addr + 7].iter().any(|a| {
        let page = (a >> 12) - (start >> 12);
        page < 32 && missing & (1 << page) != 0
    });
    (!in_hole).then(|| u64::from_ne_bytes(word.try_into().expect("8 bytes")))
}

impl StackCopy {
    /// The 8-byte word at user address `addr`, if the copy holds all of it
    /// (in either part, not in a hole).
    pub fn word(&self, addr: u64) -> Option<u64> {
        word_of(self.sp, &self.bytes, self.missing_pages, addr).or_else(|| {
            let upper = self.upper.as_ref()?;
            word_of(upper.start, &upper.bytes, upper.missing_pages, addr)
        })
    }

    /// Bytes of stack the copy holds (both parts).
    pub fn stack_bytes(&self) -> usize {
        self.bytes.len() + self.upper.as_ref().map_or(0, |u| u.bytes.len())
    }

    /// Parse the `struct stack_copy` at the start of `data` (the bytes of a
    /// record after its `struct stack_sample`) and the `len` bytes of stack
    /// that follow it. Errors if `data` is shorter than that.
    fn parse(data: &[u8]) -> Result<Self> {
        let head = size_of::<types::stack_copy>();
        let mut copy = types::stack_copy::default();
        plain::copy_from_bytes(&mut copy, data).map_err(|_| {
            anyhow!(
                "stack copy of {} bytes is shorter than its head ({head} bytes)",
                data.len()
            )
        })?;
        let len = copy.len as usize;
        let Some(bytes) = data.get(head..head + len) else {
            bail!(
                "stack copy of {} bytes, its head says {}",
                data.len(),
                head + len
            );
        };
        let upper_len = copy.upper_len as usize;
        if upper_len > len {
            bail!("stack copy of {len} bytes, its upper part has {upper_len}");
        }
        let (lower, upper) = bytes.split_at(len - upper_len);
        Ok(StackCopy {
            ip: copy.ip,
            sp: copy.sp,
            bp: copy.bp,
            bx: (copy.bx_known != 0).then_some(copy.bx),
            frame: copy.frame as usize,
            exact_ip: copy.exact_ip != 0,
            bytes: lower.to_vec(),
            missing_pages: copy.missing,
            upper: (upper_len > 0).then(|| UpperPart {
                start: copy.upper_start,
                bytes: upper.to_vec(),
                missing_pages: copy.upper_missing,
            }),
        })
    }
}

impl RawSample {
    /// Parse one ring-buffer record: `struct sample_header`, then
    /// `kernel_frames` kernel addresses, then `user_frames` user addresses
    /// (u64 each, native endian). Errors if the record is shorter than its
    /// header says.
    pub fn parse(data: &[u8]) -> Result<Self> {
        let mut header = types::sample_header::default();
        plain::copy_from_bytes(&mut header, data).map_err(|_| {
            anyhow!(
                "sample record of {} bytes is shorter than its header ({} bytes)",
                data.len(),
                size_of::<types::sample_header>()
            )
        })?;
        let kernel_frames = usize::from(header.kernel_frames);
        let user_frames = usize::from(header.user_frames);
        let frames = &data[size_of::<types::sample_header>()..];
        let python_words = 2 * usize::from(header.python_frames);
        let frame_bytes = 8 * (kernel_frames + user_frames + python_words);
        if frames.len() < frame_bytes {
            bail!(
                "sample record of {} bytes, header says {}",
                data.len(),
                size_of::<types::sample_header>() + frame_bytes
            );
        }
        let mut addresses = frames[..frame_bytes]
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("chunks of 8 bytes")));
        let kernel_stack = addresses.by_ref().take(kernel_frames).collect();
        let user_stack = addresses.by_ref().take(user_frames).collect();
        let stack_copy = if header.flags & SAMPLE_FLAG_STACK_COPY != 0 {
            let after = data
                .get(size_of::<types::stack_sample>()..)
                .unwrap_or_default();
            Some(Box::new(StackCopy::parse(after)?))
        } else {
            None
        };
        Ok(RawSample {
            timestamp_ns: header.timestamp_ns,
            pid: header.pid,
            tid: header.tid,
            cpu: header.cpu,
            user_status: UnwindStatus::from_raw(header.user_status),
            kernel_thread: header.flags & SAMPLE_FLAG_KERNEL_THREAD != 0,
            process_comm: comm(&header.process_comm),
            thread_comm: comm(&header.thread_comm),
            kernel_stack,
            user_stack,
            python: addresses.collect(),
            python_walked: header.python_status == PYTHON_WALKED,
            stack_copy,
            wait: (header.flags & SAMPLE_FLAG_OFF_CPU != 0).then_some(Wait {
                ns: header.off_cpu_ns,
                runnable: header.flags & SAMPLE_FLAG_RUNNABLE != 0,
            }),
        })
    }
}

/// A `char[TASK_COMM_LEN]` up to its first NUL, invalid UTF-8 replaced.
fn comm(raw: &[i8]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
impl RawSample {
    /// A sample for unit tests: process and thread `pid` named `p`, taken
    /// at `timestamp_ns`, two kernel frames, the user stack `user` (leaf
    /// first; complete, or no user stack when empty).
    pub(crate) fn for_test(pid: u32, timestamp_ns: u64, user: Vec<u64>) -> Self {
        RawSample {
            timestamp_ns,
            pid,
            tid: pid,
            cpu: 0,
            process_comm: "p".into(),
            thread_comm: "p".into(),
            kernel_thread: false,
            kernel_stack: vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020],
            user_status: if user.is_empty() {
                UnwindStatus::NoUserStack
            } else {
                UnwindStatus::Complete
            },
            user_stack: user,
            python: Vec::new(),
            python_walked: false,
            stack_copy: None,
            wait: None,
        }
    }
}

/// A notification from the BPF programs about a process (`struct process_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEvent {
    /// The process called exec: its mappings are new.
    Exec {
        /// Process id.
        pid: u32,
        /// When (CLOCK_MONOTONIC ns).
        timestamp_ns: u64,
    },
    /// The process exited.
    Exit {
        /// Process id.
        pid: u32,
    },
    /// The walker met a pc in no mapping it knows (e.g. code loaded with
    /// dlopen), or a sample of a process it has no description of.
    UnknownMapping {
        /// Process id.
        pid: u32,
        /// The pc.
        address: u64,
    },
    /// A described process forked: the walker gave the child the parent's
    /// description.
    Fork {
        /// The child's process id.
        pid: u32,
        /// The parent's process id.
        parent: u32,
        /// When (CLOCK_MONOTONIC ns).
        timestamp_ns: u64,
    },
    /// The BPF programs added an executable mapping of an object whose
    /// table user space knows to the process's description.
    Mapping {
        /// Process id.
        pid: u32,
        /// The mapping's first address.
        start: u64,
        /// The mapping's end (exclusive).
        end: u64,
        /// File offset of `start`, bytes.
        file_offset: u64,
        /// The object's id (`ObjectId` of the tracker that registered it).
        object: u32,
        /// When it was seen mapped (the exec's time for an exec's mappings;
        /// CLOCK_MONOTONIC ns).
        timestamp_ns: u64,
    },
}

/// A [`ProcessEvent`] with the time the BPF program saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedEvent {
    /// What happened.
    pub event: ProcessEvent,
    /// `bpf_ktime_get_ns()` when it happened: CLOCK_MONOTONIC, ns (the
    /// clock of [`RawSample::timestamp_ns`]).
    pub timestamp_ns: u64,
}

impl ProcessEvent {
    /// Parse one `struct process_event` record; `None` for an unknown type or short record.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let mut event = types::process_event::default();
        plain::copy_from_bytes(&mut event, data).ok()?;
        let pid = event.pid;
        let timestamp_ns = event.timestamp_ns;
        match event.r#type {
            EVENT_EXEC => Some(Self::Exec { pid, timestamp_ns }),
            EVENT_EXIT => Some(Self::Exit { pid }),
            EVENT_UNKNOWN_MAPPING => Some(Self::UnknownMapping {
                pid,
                address: event.address,
            }),
            EVENT_MAPPING => Some(Self::Mapping {
                pid,
                start: event.address,
                end: event.end,
                file_offset: event.file_offset,
                object: event.object_id,
                timestamp_ns,
            }),
            EVENT_FORK => Some(Self::Fork {
                pid,
                parent: event.address as u32,
                timestamp_ns,
            }),
            _ => None,
        }
    }
}

impl TimedEvent {
    /// Parse one `struct process_event` record with its time; `None` for an
    /// unknown type or short record.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let event = ProcessEvent::parse(data)?;
        let mut raw = types::process_event::default();
        plain::copy_from_bytes(&mut raw, data).ok()?;
        Some(TimedEvent {
            event,
            timestamp_ns: raw.timestamp_ns,
        })
    }
}

/// The latest exec of a process, as the exec program recorded it
/// (`struct exec_time`, the `exec_times` map value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecTime {
    /// `bpf_ktime_get_ns()` at the exec (CLOCK_MONOTONIC, ns).
    pub timestamp_ns: u64,
    /// The task's `self_exec_id` after it (grows by one per exec).
    pub exec_id: u64,
}

impl ExecTime {
    /// Parse an `exec_times` map value; `None` for a short one.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let mut value = types::exec_time::default();
        plain::copy_from_bytes(&mut value, bytes).ok()?;
        Some(ExecTime {
            timestamp_ns: value.timestamp_ns,
            exec_id: value.exec_id,
        })
    }
}

/// One executable mapping as the BPF walker sees it (`struct exec_mapping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecMapping {
    /// First address (inclusive).
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Load bias: object vaddr = pc - bias.
    pub bias: u64,
    /// Object id of the table to use (`page_key.object_id`).
    pub object_id: u32,
    /// Walk this mapping by frame pointers (no table: JIT or anonymous code).
    pub frame_pointers: bool,
}

/// Most executable mappings per process the walker holds (`MAX_PROCESS_MAPPINGS`).
pub const MAX_PROCESS_MAPPINGS: usize =
    crate::sampling::skel::defines::MAX_PROCESS_MAPPINGS as usize;

/// `struct process_info` for the `process_mappings` map: `mappings` (sorted
/// by start; at most [`MAX_PROCESS_MAPPINGS`], the rest are dropped) under
/// `generation`, for the image of exec `exec_id` (0: unchecked), as the
/// bytes of the map value.
pub(crate) fn process_info_value(
    mappings: &[ExecMapping],
    generation: u32,
    exec_id: u64,
) -> Vec<u8> {
    let mut info = Box::<types::process_info>::default();
    let count = mappings.len().min(MAX_PROCESS_MAPPINGS);
    info.mapping_count = count as u32;
    info.generation = generation;
    info.exec_id = exec_id;
    for (raw, m) in info.mappings.iter_mut().zip(&mappings[..count]) {
        *raw = types::exec_mapping {
            start: m.start,
            end: m.end,
            bias: m.bias,
            object_id: m.object_id,
            kind: if m.frame_pointers {
                MAPPING_FRAME_POINTERS
            } else {
                MAPPING_TABLE
            },
        };
    }
    // SAFETY: process_info is Plain (see crate::sampling::skel): integers only, no
    // padding, so every byte of it is initialized.
    unsafe { plain::as_bytes(&*info) }.to_vec()
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
