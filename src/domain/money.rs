//! Amounts and counts as people read them.

/// Cents as dollars with thousands separators: `1234567` → `$12,345.67`. Takes any total
/// exactly (an i128 holds the sum of any number of i64 amounts a ledger can hold).
pub fn dollars(cents: impl Into<i128>) -> String {
    let cents: i128 = cents.into();
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    format!("{sign}${}.{:02}", thousands(cents / 100), cents % 100)
}

/// A count with thousands separators: `1234567` → `1,234,567`.
pub fn thousands(n: impl Into<u128>) -> String {
    let n: u128 = n.into();
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_group_thousands() {
        assert_eq!(dollars(0), "$0.00");
        assert_eq!(dollars(5), "$0.05");
        assert_eq!(dollars(123_456_789), "$1,234,567.89");
        assert_eq!(dollars(100_000), "$1,000.00");
        assert_eq!(dollars(-5i64), "-$0.05");
        assert_eq!(
            dollars(2 * i128::from(i64::MAX)),
            "$184,467,440,737,095,516.14"
        );
    }
}
