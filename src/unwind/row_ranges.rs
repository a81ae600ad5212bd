//! Where tables' rows go in the `unwind_rows` array map: a first-fit
//! allocator of row ranges (a table may own several, see
//! [`super::loader`]).

/// First-fit allocator of row ranges in the `unwind_rows` map.
#[derive(Debug)]
pub(super) struct RowAllocator {
    /// Free ranges `(start, len)`, sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
}

impl RowAllocator {
    /// An allocator of the rows `0..capacity`, all free.
    pub(super) fn new(capacity: u32) -> Self {
        RowAllocator {
            free: vec![(0, capacity)],
        }
    }

    /// The first row of a free range of `len` rows, now taken (the
    /// lowest that fits); `None` when no free range is long enough.
    pub(super) fn allocate(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    /// Free the `len` rows from `start` (a range [`Self::allocate`] gave).
    pub(super) fn release(&mut self, start: u32, len: u32) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the next, then the previous range.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_first_fit_and_coalescing() {
        let mut a = RowAllocator::new(100);
        assert_eq!(a.allocate(40), Some(0));
        assert_eq!(a.allocate(40), Some(40));
        assert_eq!(a.allocate(40), None);
        a.release(0, 40);
        assert_eq!(a.allocate(30), Some(0));
        a.release(40, 40);
        // Free: [30, 100) after merging [30,40) + [40,80) + [80,100).
        assert_eq!(a.free, vec![(30, 70)]);
        a.release(0, 30);
        assert_eq!(a.free, vec![(0, 100)]);
    }
}
