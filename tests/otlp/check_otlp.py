"""Independent check of an OTLP profiles file (docs/otlp.md).

Decodes FILE (an ExportProfilesServiceRequest, raw or gzip'd) with the
`opentelemetry-proto` package's generated classes, asserts the spec's rules
and prints a JSON summary for the Rust test to compare with the other
formats of the same run:

- index 0 of every dictionary table is its zero element, every index is in
  its table's range;
- `values` and `timestamps_unix_nano` have the same length where both are
  set, and a sample has at least one of them;
- every timestamp lies in [time_unix_nano, time_unix_nano + duration_nano).

Summary: {"folded": {line: count}, "samples": N, "timestamps": T (how
many samples carry a time), "mappings": [[file,
build_id]], "inlined": [[function, ...]], "threads": [[pid, tid, thread
name, executable name]], "containers": [[pid, tid, container.id or null]]
(every sample of a thread must carry the same one), "host": str, "sample_type": [type, unit],
"period_type": [type, unit], "period": int}. A folded line is the
executable name, then the frames root to leaf (a location's inlined
functions outermost first), kernel frames suffixed `_[k]`, as lightswitch's
folded output.
"""

import gzip
import json
import sys

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2


def fail(message):
    sys.exit("OTLP check failed: " + message)


def check(condition, message):
    if not condition:
        fail(message)


def folded_name(name):
    """A frame name as folded output writes it (`;` separates frames)."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def in_range(index, table, what):
    check(0 <= index < len(table), f"{what} index {index} outside its table of {len(table)}")


def main(path):
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    request = profiles_service_pb2.ExportProfilesServiceRequest()
    request.ParseFromString(data)
    d = request.dictionary
    strings = d.string_table

    zero = {
        "mapping_table": profiles_pb2.Mapping(),
        "location_table": profiles_pb2.Location(),
        "function_table": profiles_pb2.Function(),
        "attribute_table": profiles_pb2.KeyValueAndUnit(),
        "stack_table": profiles_pb2.Stack(),
    }
    for name, empty in zero.items():
        table = getattr(d, name)
        check(len(table) > 0 and table[0] == empty, f"{name}[0] is not the zero element")
    check(len(strings) > 0 and strings[0] == "", "string_table[0] is not empty")
    check(len(d.link_table) > 0, "link_table has no zero element")
    check(not any(d.link_table[0].trace_id) and not any(d.link_table[0].span_id), "link_table[0] is not zero")

    def attrs(indices):
        out = {}
        for i in indices:
            in_range(i, d.attribute_table, "attribute")
            kv = d.attribute_table[i]
            in_range(kv.key_strindex, strings, "string")
            kind = kv.value.WhichOneof("value")
            value = getattr(kv.value, kind) if kind else None
            if kind == "string_value_strindex":
                in_range(value, strings, "string")
                value = strings[value]
            out[strings[kv.key_strindex]] = value
        return out

    mappings = []
    for m in d.mapping_table[1:]:
        in_range(m.filename_strindex, strings, "string")
        mappings.append([strings[m.filename_strindex], attrs(m.attribute_indices).get("process.executable.build_id.gnu")])
    for f in d.function_table[1:]:
        for i in (f.name_strindex, f.system_name_strindex, f.filename_strindex):
            in_range(i, strings, "string")
    names = []  # per location: its frames outermost first, kernel suffixed
    inlined = []
    for loc in d.location_table:
        in_range(loc.mapping_index, d.mapping_table, "mapping")
        kernel = attrs(loc.attribute_indices).get("profile.frame.type") == "kernel"
        lines = []
        for line in loc.lines:
            in_range(line.function_index, d.function_table, "function")
            check(line.function_index != 0, "a line names function 0")
            lines.append(strings[d.function_table[line.function_index].name_strindex])
        if len(lines) > 1:
            inlined.append(lines)
        names.append([folded_name(n) + ("_[k]" if kernel else "") for n in reversed(lines)])
    for stack in d.stack_table:
        for i in stack.location_indices:
            in_range(i, d.location_table, "location")
            check(i != 0, "a stack names location 0")

    resources = request.resource_profiles
    check(len(resources) == 1, f"{len(resources)} resource profiles")
    host = {kv.key: kv.value.string_value for kv in resources[0].resource.attributes}.get("host.name")
    scopes = resources[0].scope_profiles
    check(len(scopes) == 1 and len(scopes[0].profiles) == 1, "not one scope with one profile")
    profile = scopes[0].profiles[0]
    begin, end = profile.time_unix_nano, profile.time_unix_nano + profile.duration_nano
    check(profile.time_unix_nano > 0 and profile.duration_nano > 0, "time or duration unset")

    folded, threads, containers, total, stamps = {}, set(), {}, 0, 0
    for s in profile.samples:
        in_range(s.stack_index, d.stack_table, "stack")
        check(s.stack_index != 0, "a sample names stack 0")
        check(s.link_index == 0 or s.link_index < len(d.link_table), "link index out of range")
        check(len(s.values) > 0 or len(s.timestamps_unix_nano) > 0, "a sample without values or timestamps")
        if s.values and s.timestamps_unix_nano:
            check(len(s.values) == len(s.timestamps_unix_nano), "values and timestamps differ in length")
        for t in s.timestamps_unix_nano:
            check(begin <= t < end, f"timestamp {t} outside [{begin}, {end})")
        count = sum(s.values) if s.values else len(s.timestamps_unix_nano)
        stamps += len(s.timestamps_unix_nano)
        a = attrs(s.attribute_indices)
        check(len(a) == len(s.attribute_indices), "an attribute key twice in one sample")
        exe = a.get("process.executable.name", "")
        threads.add((a.get("process.pid"), a.get("thread.id"), a.get("thread.name"), exe))
        thread = (a.get("process.pid"), a.get("thread.id"))
        container = a.get("container.id")
        check(containers.setdefault(thread, container) == container, f"thread {thread} has two container ids")
        frames = [f for i in reversed(d.stack_table[s.stack_index].location_indices) for f in names[i]]
        line = ";".join([folded_name(exe)] + frames)
        folded[line] = folded.get(line, 0) + count
        total += count

    value_type = lambda v: [strings[v.type_strindex], strings[v.unit_strindex]]
    print(json.dumps({
        "folded": folded,
        "samples": total,
        "timestamps": stamps,
        "mappings": mappings,
        "inlined": inlined,
        "threads": sorted(list(t) for t in threads),
        "containers": sorted([pid, tid, c] for (pid, tid), c in containers.items()),
        "host": host,
        "sample_type": value_type(profile.sample_type),
        "period_type": value_type(profile.period_type),
        "period": profile.period,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
