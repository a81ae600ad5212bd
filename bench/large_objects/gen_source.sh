#!/usr/bin/env bash
# Print a medium Rust program (N modules of generic code, default 40) whose
# `rustc -O` compile keeps librustc_driver and libLLVM busy for seconds:
# traits, generics instantiated at several types, iterator chains, closures,
# formatting. Deterministic for a given N.
set -euo pipefail
n=${1:-40}
cat <<'HEAD'
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

pub trait Shape: Debug {
    fn area(&self) -> f64;
    fn scale(&mut self, k: f64);
}
HEAD
for ((i = 0; i < n; i++)); do
cat <<MOD
pub mod m$i {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    pub struct Item$i<T> {
        pub id: u64,
        pub values: Vec<T>,
        pub tags: BTreeMap<String, T>,
    }

    impl<T: Copy + Debug + Into<f64> + PartialOrd> Item$i<T> {
        pub fn stats(&self) -> (f64, f64, usize) {
            let sum: f64 = self.values.iter().map(|&v| v.into()).sum();
            let max = self
                .values
                .iter()
                .map(|&v| v.into())
                .fold(f64::MIN, f64::max);
            let above = self.values.iter().filter(|&&v| v.into() > sum / ($i as f64 + 1.0)).count();
            (sum, max, above)
        }
        pub fn describe(&self) -> String {
            let mut out = format!("item{} #{}:", $i, self.id);
            for (k, v) in &self.tags {
                out.push_str(&format!(" {k}={v:?}"));
            }
            out
        }
    }

    #[derive(Debug)]
    pub struct Poly$i {
        pub points: Vec<(f64, f64)>,
    }

    impl Shape for Poly$i {
        fn area(&self) -> f64 {
            let n = self.points.len();
            (0..n)
                .map(|j| {
                    let (x0, y0) = self.points[j];
                    let (x1, y1) = self.points[(j + 1) % n];
                    x0 * y1 - x1 * y0
                })
                .sum::<f64>()
                .abs()
                / 2.0
        }
        fn scale(&mut self, k: f64) {
            self.points.iter_mut().for_each(|p| *p = (p.0 * k, p.1 * k + $i as f64));
        }
    }

    pub fn run(seed: u64) -> (String, f64) {
        let a: Item$i<u32> = Item$i {
            id: seed,
            values: (0..(seed % 97 + $i) as u32).map(|x| x.wrapping_mul(2654435761) % 1000).collect(),
            tags: (0..5).map(|k| (format!("k{k}"), k as u32 * $i)).collect(),
        };
        let b: Item$i<f32> = Item$i {
            id: seed + 1,
            values: a.values.iter().map(|&v| v as f32 / 3.0).collect(),
            tags: a.tags.iter().map(|(k, &v)| (k.clone(), v as f32)).collect(),
        };
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for v in &a.values {
            *counts.entry(v % 17).or_default() += 1;
        }
        let mut shapes: Vec<Box<dyn Shape>> = vec![Box::new(Poly$i {
            points: (0..($i % 7 + 3)).map(|k| ((k as f64).cos(), (k as f64).sin())).collect(),
        })];
        shapes.iter_mut().for_each(|s| s.scale(1.5));
        let area: f64 = shapes.iter().map(|s| s.area()).sum();
        let (s1, m1, c1) = a.stats();
        let (s2, m2, c2) = b.stats();
        let mut keys: Vec<_> = counts.into_iter().collect();
        keys.sort_unstable();
        (
            format!("{} {} {:?} {c1} {c2}", a.describe(), b.describe(), keys),
            s1 + m1 + s2 + m2 + area,
        )
    }
}
MOD
done
echo "fn main() {"
echo "    let mut total = 0.0;"
echo "    let mut text = 0;"
for ((i = 0; i < n; i++)); do
  echo "    let (s, v) = m$i::run($i); total += v; text += s.len();"
done
echo '    println!("{total} {text}");'
echo "}"
