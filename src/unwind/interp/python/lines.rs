//! Source lines of CPython bytecode: the location table of CPython 3.11 and
//! later (`co_linetable`, format described in CPython's
//! `Objects/locations.md`), 3.10's `co_linetable` and the `co_lnotab` of
//! 3.8 and 3.9 (both described in those versions' `Objects/lnotab_notes.txt`).

/// The line of the instruction `byte` bytes from the first of a code
/// object whose first line is `first_line` and whose `co_lnotab` (3.8,
/// 3.9) is `table`: pairs of (bytes, signed lines) increments, the line
/// changing at each byte offset the pairs reach.
pub fn lnotab_line(table: &[u8], first_line: i64, byte: u64) -> Option<u32> {
    let mut line = first_line;
    let mut at = 0u64;
    for pair in table.chunks_exact(2) {
        at += u64::from(pair[0]);
        if at > byte {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    u32::try_from(line).ok()
}

/// The line of the instruction `byte` bytes from the first of a code
/// object whose first line is `first_line` and whose `co_linetable` (3.10)
/// is `table`: consecutive ranges, each (bytes, signed line change), a
/// change of -128 marking a range with no line; `None` for those, and
/// past the table.
pub fn ranges_line(table: &[u8], first_line: i64, byte: u64) -> Option<u32> {
    let mut line = first_line;
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = (delta != -128).then(|| {
            line += i64::from(delta);
            line
        });
        if byte < end {
            return here.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

/// The line of the instruction `unit` code units (2 bytes each) from the
/// first of a code object whose first line is `first_line` and whose
/// location table is `table`; `None` when the table gives it no line (or
/// does not reach it).
pub fn line_of(table: &[u8], first_line: i64, unit: u64) -> Option<u32> {
    let mut bytes = table.iter().copied();
    let mut line = first_line;
    let mut start = 0u64;
    let mut pending = bytes.next();
    while let Some(head) = pending {
        if head & 0x80 == 0 {
            return None; // Not at the start of an entry: a table this does not know.
        }
        let code = (head >> 3) & 0x0f;
        let length = u64::from(head & 0x07) + 1;
        let mut has_line = true;
        match code {
            15 => has_line = false,
            14 => {
                line += signed_varint(&mut bytes)?;
                for _ in 0..3 {
                    varint(&mut bytes)?;
                }
            }
            13 => line += signed_varint(&mut bytes)?,
            10..=12 => {
                line += i64::from(code - 10);
                bytes.next()?;
                bytes.next()?;
            }
            _ => {
                bytes.next()?;
            }
        }
        if unit < start + length {
            return if has_line {
                u32::try_from(line).ok()
            } else {
                None
            };
        }
        start += length;
        pending = bytes.next();
    }
    None
}

/// An unsigned varint of the table: 6 bits per byte, low bits first, bit 6
/// set on every byte but the last.
fn varint(bytes: &mut impl Iterator<Item = u8>) -> Option<u64> {
    let mut b = bytes.next()?;
    let mut value = u64::from(b & 63);
    let mut shift = 6;
    while b & 64 != 0 {
        b = bytes.next()?;
        if shift > 56 {
            return None;
        }
        value |= u64::from(b & 63) << shift;
        shift += 6;
    }
    Some(value)
}

/// A signed varint: the unsigned value's low bit is the sign.
fn signed_varint(bytes: &mut impl Iterator<Item = u8>) -> Option<i64> {
    let u = varint(bytes)?;
    let magnitude = i64::try_from(u >> 1).ok()?;
    Some(if u & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `co_linetable` of `leaf_work` below, compiled by CPython 3.12.1
    /// (`leaf_work.__code__.co_linetable`), first line 1:
    /// ```python
    /// def leaf_work(n):
    ///     s = 0
    ///     for i in range(n):
    ///         s += i * i
    ///     return s
    /// ```
    /// Checked against `dis.get_instructions` of the same code (each
    /// instruction's `positions.lineno`): units 0 (line 1), 1-2 (2), 3-16
    /// (3), 17-25 (4), 26 (3), 27-28 (5).
    const LEAF_WORK_3_12: &[u8] = b"\x80\x00\xd8\x08\t\x80A\xdc\r\x12\x901\x8bX\xf2\x00\x01\x05\x13\x88\x01\xd8\x08\t\x88Q\x90\x11\x89U\x89\n\x89\x01\xf0\x03\x01\x05\x13\xe0\x0b\x0c\x80H";

    #[test]
    fn lines_of_a_3_12_table() {
        let at = |unit| line_of(LEAF_WORK_3_12, 1, unit);
        let expected = |unit| match unit {
            0 => 1,
            1..=2 => 2,
            3..=16 | 26 => 3,
            17..=25 => 4,
            _ => 5,
        };
        for unit in 0..=28 {
            assert_eq!(at(unit), Some(expected(unit)), "unit {unit}");
        }
        assert_eq!(at(10_000), None);
    }

    /// `leaf_work` as above but defined at line 2, compiled by CPython 3.8.18 and
    /// 3.9.18 (`co_lnotab`, the same bytes) and 3.10.13 (`co_linetable`);
    /// `dis.get_instructions` and 3.10's `co_lines()` give bytes 0-3 line
    /// 3, 4-15 line 4, 16-29 line 5, 30-33 line 6.
    const LEAF_WORK_3_9: &[u8] = b"\x00\x01\x04\x01\x0c\x01\x0e\x01";
    const LEAF_WORK_3_10: &[u8] = b"\x04\x01\x0c\x01\x0e\x01\x04\x01";

    #[test]
    fn lines_of_3_8_to_3_10_tables() {
        let expected = |byte| match byte {
            0..=3 => 3,
            4..=15 => 4,
            16..=29 => 5,
            _ => 6,
        };
        for byte in (0..34).step_by(2) {
            let want = Some(expected(byte));
            assert_eq!(lnotab_line(LEAF_WORK_3_9, 2, byte), want, "byte {byte}");
            assert_eq!(ranges_line(LEAF_WORK_3_10, 2, byte), want, "byte {byte}");
        }
        assert_eq!(ranges_line(LEAF_WORK_3_10, 2, 34), None);
        // A range with no line (-128), as 3.10 marks some cleanup code.
        assert_eq!(ranges_line(b"\x04\x01\x02\x80\x02\x01", 2, 4), None);
        assert_eq!(ranges_line(b"\x04\x01\x02\x80\x02\x01", 2, 6), Some(4));
    }

    #[test]
    fn hostile_tables_give_no_line() {
        assert_eq!(line_of(b"", 1, 0), None);
        assert_eq!(line_of(b"\x01\x02", 1, 0), None);
        assert_eq!(
            line_of(b"\xf0\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 1, 0),
            None
        );
        assert_eq!(lnotab_line(b"\x01", 1, 0), Some(1));
        assert_eq!(lnotab_line(b"\x00\x80\x00\x80", 1, 0), None);
        assert_eq!(ranges_line(b"", 1, 0), None);
    }
}
