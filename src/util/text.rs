//! Wording shared by the messages and summaries lightswitch prints.

/// `count` followed by the noun in the right number: `plural(1, "process",
/// "processes")` is `1 process`, `plural(2, ...)` is `2 processes`.
pub fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn singular_only_for_one() {
        assert_eq!(plural(1, "process", "processes"), "1 process");
        assert_eq!(plural(0, "process", "processes"), "0 processes");
        assert_eq!(plural(2, "sample", "samples"), "2 samples");
    }
}
