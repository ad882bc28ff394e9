//! The one time format the ledger stores, and arithmetic on it.
//!
//! Every time the ledger writes (`claimed_at`, `recorded_at`, `published_at`, ...) is RFC 3339
//! in UTC with exactly six fractional digits and a `Z`, so times compare correctly as text: a
//! purge's `recorded_at < cutoff` and the audit export's `--since` rely on that.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The ledger's format: `2026-07-01T09:00:00.000000Z`.
const LEDGER_FORMAT: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
);

/// The current time as the ledger stores it.
pub fn now_rfc3339() -> String {
    ledger_time(OffsetDateTime::now_utc())
}

/// `t` as the ledger stores times (converted to UTC first).
pub fn ledger_time(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(LEDGER_FORMAT)
        .expect("UTC time always formats")
}

/// Seconds between an RFC 3339 timestamp and now; never negative.
pub fn age_seconds(rfc3339: &str) -> Option<f64> {
    let then = OffsetDateTime::parse(rfc3339, &Rfc3339).ok()?;
    Some((OffsetDateTime::now_utc() - then).as_seconds_f64().max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_times_have_six_fraction_digits_in_utc() {
        let t = OffsetDateTime::parse("2026-07-01T11:00:00.5+02:00", &Rfc3339).unwrap();
        assert_eq!(ledger_time(t), "2026-07-01T09:00:00.500000Z");
        assert_eq!(now_rfc3339().len(), "2026-07-01T09:00:00.000000Z".len());
    }

    #[test]
    fn age_is_never_negative_and_rejects_garbage() {
        assert_eq!(age_seconds("2999-01-01T00:00:00Z"), Some(0.0));
        assert!(age_seconds("2000-01-01T00:00:00Z").unwrap() > 0.0);
        assert_eq!(age_seconds("yesterday"), None);
    }
}
