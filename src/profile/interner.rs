//! The aggregator's tables of distinct values (user frames, kernel stacks,
//! stacks, thread and process names): each value once, in the order it was
//! first seen, found again by its hash; whatever refers to a value holds
//! its 4-byte index.
//!
//! A table of indices ([`hashbrown::HashTable`]) over a plain `Vec` of
//! values: 4 bytes (plus one control byte) a slot, nothing stored beside a
//! value, the hash computed again when the table grows. Issue 18: under
//! process churn a 10 s window at 997 Hz holds 63,000-68,000 distinct user
//! frames and about 10,000 stacks; kept in `IndexSet`s and an `IndexMap`,
//! which store each entry's hash beside it and index by `usize`, they were
//! the largest part of what a window frees when it closes (a user frame
//! took 24 bytes an entry and 9 bytes a slot, now 16 and 5).
//!
//! A value can be looked up by anything that hashes as it does and says
//! when it is equal to it ([`Equivalent`]), so that a sample's stack is
//! found without first building the owned key (`&[u32]` for a
//! `Box<[u32]>`, `&str` for an `Arc<str>`).

use std::hash::{BuildHasher, Hash};

use hashbrown::{Equivalent, HashTable};
use rustc_hash::FxBuildHasher;

/// Distinct values, each with a stable index: its position.
#[derive(Debug)]
pub struct Interner<T> {
    values: Vec<T>,
    index: HashTable<u32>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            values: Vec::new(),
            index: HashTable::new(),
        }
    }
}

impl<T: Eq + Hash> Interner<T> {
    /// The index of the value `query` stands for (the value itself, or a
    /// borrowed form of it), made by `make` and added at the end if it is
    /// new. `query` must hash as the value it stands for ([`Equivalent`]'s
    /// contract). Panics past 2^32 distinct values (no window comes near).
    pub fn insert_as<Q>(&mut self, query: &Q, make: impl FnOnce(&Q) -> T) -> u32
    where
        Q: Hash + Equivalent<T> + ?Sized,
    {
        let hash = FxBuildHasher.hash_one(query);
        let values = &self.values;
        if let Some(&i) = self
            .index
            .find(hash, |&i| query.equivalent(&values[i as usize]))
        {
            return i;
        }
        self.push(hash, make(query))
    }

    fn push(&mut self, hash: u64, value: T) -> u32 {
        let values = &self.values;
        let i = u32::try_from(values.len()).expect("fewer than 2^32 values in a window");
        self.index
            .insert_unique(hash, i, |&j| FxBuildHasher.hash_one(&values[j as usize]));
        self.values.push(value);
        i
    }

    /// Every value, in index order.
    pub fn as_slice(&self) -> &[T] {
        &self.values
    }
}

impl<T> std::ops::Index<u32> for Interner<T> {
    type Output = T;

    fn index(&self, i: u32) -> &T {
        &self.values[i as usize]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn equal_values_share_an_index_through_growth() {
        let mut table = Interner::default();
        // Enough to make the index table grow several times.
        for round in 0..2 {
            for a in 0..5_000u64 {
                let i = table.insert_as(&(Some((a % 7) as u32), 0x1000 + a), |v| *v);
                assert_eq!(i as u64, a, "round {round}");
            }
        }
        assert_eq!(
            table.insert_as(&(None, 0x1000), |v| *v),
            5_000,
            "another value"
        );
        assert_eq!(table.as_slice().len(), 5_001);
        assert_eq!(table[42], (Some(0), 0x1000 + 42));
    }

    #[test]
    fn a_borrowed_query_finds_the_owned_value_and_makes_it_once() {
        let mut names: Interner<Arc<str>> = Interner::default();
        let mut made = 0;
        for name in ["bash", "python3", "bash", "bash", "python3"] {
            names.insert_as(name, |n| {
                made += 1;
                Arc::from(n)
            });
        }
        assert_eq!(made, 2);
        assert_eq!(names.as_slice(), [Arc::from("bash"), Arc::from("python3")]);
        let mut stacks: Interner<Box<[u64]>> = Interner::default();
        assert_eq!(stacks.insert_as(&[1, 2, 3][..], |s| s.into()), 0);
        assert_eq!(stacks.insert_as(&[1, 2][..], |s| s.into()), 1);
        let owned: Box<[u64]> = vec![1, 2, 3].into();
        assert_eq!(stacks.insert_as(&owned, Clone::clone), 0);
    }
}
