"""Independent check of a Perfetto trace (docs/reading-output.md).

Decodes FILE (a perfetto.protos.Trace, raw or gzip'd) with the generated
classes of the `perfetto` package from PyPI, reads it the way Perfetto's
trace processor does (interned data accumulated per packet sequence,
cleared by SEQ_INCREMENTAL_STATE_CLEARED) and asserts:

- the first packet's clock snapshot makes REALTIME the trace's clock, and
  every timestamped packet is in it;
- every iid a packet refers to (callstack, frame, function name, mapping,
  path component, build ID) was interned by an earlier packet of its
  sequence, and no iid is interned twice;
- every sample's process and thread have a named track descriptor, and
  every track event's track is described;
- slices begin and end in pairs on their track, nested, none ending
  before it begins;
- each thread's sample timestamps never go back (in the file's order).

Prints a JSON summary for the Rust test to compare with the other formats
of the same run: {"folded": {line: count}, "samples": N, "threads":
[[pid, tid, name, samples, first_ns, last_ns]] (threads with samples),
"all_threads": [[pid, tid, name]] (every thread described), "processes":
[[pid, name]], "slices": [[pid, tid, name, begin_ns, end_ns, ns_arg]],
"mappings": [[path, build_id_hex]]}. A folded line is the process's name,
then the frames root to leaf, kernel frames (kind KIND_KERNEL) suffixed
`_[k]`, names as lightswitch's folded output writes them.
"""

import gzip
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

REALTIME = pb.BUILTIN_CLOCK_REALTIME


def fail(message):
    sys.exit("Perfetto check failed: " + message)


def check(condition, message):
    if not condition:
        fail(message)


def folded_name(name):
    """A frame name as folded output writes it (`;` separates frames)."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


class Sequence:
    """The interned tables of one packet sequence."""

    TABLES = ("function_names", "mapping_paths", "build_ids", "mappings", "frames", "callstacks")

    def __init__(self):
        self.tables = {name: {} for name in self.TABLES}

    def add(self, interned):
        for name in self.TABLES:
            table = self.tables[name]
            for entry in getattr(interned, name):
                check(entry.iid != 0, f"{name} entry with iid 0")
                check(entry.iid not in table, f"{name} iid {entry.iid} interned twice")
                table[entry.iid] = entry

    def get(self, name, iid):
        table = self.tables[name]
        check(iid in table, f"{name} iid {iid} used before it was interned")
        return table[iid]

    def string(self, name, iid):
        return self.get(name, iid).str.decode("utf-8")


def main(path):
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    trace = pb.Trace()
    trace.ParseFromString(data)
    packets = trace.packet
    check(len(packets) > 0, "no packets")
    first = packets[0]
    check(first.HasField("clock_snapshot"), "the first packet is not a clock snapshot")
    check(
        first.clock_snapshot.primary_trace_clock == REALTIME,
        "the trace clock is not REALTIME",
    )
    check(
        first.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED,
        "the first packet does not clear the incremental state",
    )

    sequences = {}
    tracks = {}  # uuid -> (pid, tid or None, name)
    samples = []  # (pid, tid, ts, folded stack)
    events = []  # (uuid, ts, type, name, ns arg)
    mappings = []
    for packet in packets:
        seq_id = packet.trusted_packet_sequence_id
        if packet.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            sequences[seq_id] = Sequence()
        if packet.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
            check(seq_id in sequences, f"sequence {seq_id} needs state it never cleared")
        seq = sequences.setdefault(seq_id, Sequence())
        if packet.HasField("interned_data"):
            seq.add(packet.interned_data)
            for m in packet.interned_data.mappings:
                parts = [seq.string("mapping_paths", p) for p in m.path_string_ids]
                build_id = seq.get("build_ids", m.build_id).str.hex() if m.build_id else ""
                mappings.append(["/" + "/".join(parts), build_id])
        if packet.HasField("timestamp"):
            check(packet.timestamp_clock_id == REALTIME, "a timestamp not in REALTIME")
        kind = packet.WhichOneof("data")
        if kind == "track_descriptor":
            d = packet.track_descriptor
            check(d.uuid not in tracks, f"track {d.uuid} described twice")
            if d.HasField("thread"):
                check(d.thread.thread_name != "", f"thread {d.thread.tid} has no name")
                tracks[d.uuid] = (d.thread.pid, d.thread.tid, d.thread.thread_name)
            elif d.HasField("process"):
                check(d.process.process_name != "", f"process {d.process.pid} has no name")
                tracks[d.uuid] = (d.process.pid, None, d.process.process_name)
            else:
                fail(f"track {d.uuid} is neither a process's nor a thread's")
        elif kind == "perf_sample":
            s = packet.perf_sample
            check(packet.HasField("timestamp"), "a sample without a timestamp")
            stack = seq.get("callstacks", s.callstack_iid)
            names = []
            for frame_id in stack.frame_ids:
                frame = seq.get("frames", frame_id)
                seq.get("mappings", frame.mapping_id)
                name = folded_name(seq.string("function_names", frame.function_name_id))
                if frame.kind == pb.Frame.KIND_KERNEL:
                    name += "_[k]"
                names.append(name)
            samples.append((s.pid, s.tid, packet.timestamp, ";".join(names)))
        elif kind == "track_event":
            e = packet.track_event
            check(e.track_uuid in tracks, f"an event on undescribed track {e.track_uuid}")
            ns = [a.uint_value for a in e.debug_annotations if a.name == "ns"]
            events.append((e.track_uuid, packet.timestamp, e.type, e.name, ns[0] if ns else None))
        elif kind != "clock_snapshot":
            fail(f"unexpected packet {kind}")

    threads = {(t[0], t[1]): t[2] for t in tracks.values() if t[1] is not None}
    processes = {t[0]: t[2] for t in tracks.values() if t[1] is None}
    folded = {}
    per_thread = {}
    for pid, tid, ts, stack in samples:
        check((pid, tid) in threads, f"sample of undescribed thread {pid}/{tid}")
        check(pid in processes, f"sample of undescribed process {pid}")
        line = folded_name(processes[pid]) + (";" + stack if stack else "")
        folded[line] = folded.get(line, 0) + 1
        count, first_ns, last_ns = per_thread.get((pid, tid), (0, ts, ts))
        check(ts >= last_ns, f"thread {tid}'s samples go back in time: {ts} after {last_ns}")
        per_thread[(pid, tid)] = (count + 1, first_ns, ts)

    slices = []
    open_slices = {}
    for uuid, ts, event_type, name, ns in events:
        stack = open_slices.setdefault(uuid, [])
        if event_type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stack.append((ts, name, ns))
        elif event_type == pb.TrackEvent.TYPE_SLICE_END:
            check(stack, f"a slice ends on track {uuid} with none open")
            begin, name, ns = stack.pop()
            check(begin <= ts, "a slice ends before it begins")
            pid, tid, _ = tracks[uuid]
            slices.append([pid, tid, name, begin, ts, ns, uuid])
        else:
            fail(f"unexpected track event type {event_type}")
    check(all(not s for s in open_slices.values()), "a slice never ends")
    # On a track, in time order, a slice is after the previous or inside it.
    by_track = {}
    for s in slices:
        by_track.setdefault(s[6], []).append((s[3], s[4]))
    for spans in by_track.values():
        spans.sort(key=lambda span: (span[0], -span[1]))
        for (a_begin, a_end), (b_begin, b_end) in zip(spans, spans[1:]):
            check(b_begin >= a_end or b_end <= a_end, "slices of a track cross")
    slices = [s[:6] for s in slices]

    print(
        json.dumps(
            {
                "folded": folded,
                "samples": len(samples),
                "threads": [
                    [pid, tid, threads[(pid, tid)], n, a, b]
                    for (pid, tid), (n, a, b) in sorted(per_thread.items())
                ],
                "all_threads": [[pid, tid, name] for (pid, tid), name in sorted(threads.items())],
                "processes": sorted([pid, name] for pid, name in processes.items()),
                "slices": slices,
                "mappings": mappings,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
