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

/// A submission's instant: like [`LEDGER_FORMAT`] but to the nanosecond, RFC 3339's finest
/// unit, so two timestamps are one instant exactly when their texts are equal. Spelled by
/// [`fixed_width`]; this is the reference its tests compare against.
#[cfg(test)]
const INSTANT_FORMAT: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z"
);

/// Why a timestamp has no instant a ledger stores: the outcome is the same on every ledger,
/// because it is decided here, before any ledger sees the submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstorable {
    /// Not an RFC 3339 date-time at all.
    NotRfc3339,
    /// RFC 3339's leap second (`23:59:60`, with or without a fraction, on the last day of a
    /// month in UTC). It has no spelling of its own among the instants: the `time` crate reads
    /// `23:59:60Z`, `23:59:60.5Z` and `23:59:59.999999999Z` as one instant, so distinct
    /// submissions would meet as conflicts. Refused with a reason instead (issue 40).
    LeapSecond,
    /// A valid RFC 3339 date-time whose UTC instant lies outside the years 0000–9999
    /// (`0000-01-01T00:30:00+01:00`, `9999-12-31T23:30:00-01:00`), which has no fixed-width
    /// spelling.
    OutsideYears,
}

impl std::fmt::Display for Unstorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unstorable::NotRfc3339 => "is not an RFC 3339 date-time",
            Unstorable::LeapSecond => {
                "names a leap second (23:59:60 UTC), which no ledger stores as an instant of \
                 its own (it would be taken for the last nanosecond before it)"
            }
            Unstorable::OutsideYears => {
                "is an RFC 3339 date-time whose UTC instant falls outside the years 0000-9999, \
                 which no ledger stores"
            }
        })
    }
}

/// The instant an RFC 3339 timestamp names, in one spelling: UTC, nine fractional digits, `Z`
/// (`2026-07-01T11:00:00+02:00` → `2026-07-01T09:00:00.000000000Z`). Fixed width, so text
/// order is time order. Refused ([`Unstorable`]) if `rfc3339` is not RFC 3339, names a leap
/// second, or names an instant outside the years 0000–9999 in UTC. Conflict detection compares
/// these, never the submitted spelling.
pub fn instant_utc(rfc3339: &str) -> Result<String, Unstorable> {
    let t = OffsetDateTime::parse(rfc3339, &Rfc3339).map_err(|_| Unstorable::NotRfc3339)?;
    // A parsed RFC 3339 text has its seconds at bytes 17 and 18 (`YYYY-MM-DDTHH:MM:SS`);
    // `time` accepts 60 there only at a month's last second in UTC.
    if rfc3339.get(17..19) == Some("60") {
        return Err(Unstorable::LeapSecond);
    }
    let utc = t
        .checked_to_offset(time::UtcOffset::UTC)
        .ok_or(Unstorable::OutsideYears)?;
    if !(0..=9999).contains(&utc.year()) {
        return Err(Unstorable::OutsideYears);
    }
    Ok(fixed_width(utc, Fraction::Nanos))
}

/// The instant releases before issue 40 stored for a leap-second timestamp, which they took
/// for the last nanosecond of the minute (`…T23:59:59.999999999Z`, whatever the fraction);
/// `None` for any other timestamp. `verify` accepts it on claims those releases made.
pub fn leap_second_stand_in(rfc3339: &str) -> Option<String> {
    if instant_utc(rfc3339) != Err(Unstorable::LeapSecond) {
        return None;
    }
    let t = OffsetDateTime::parse(rfc3339, &Rfc3339).ok()?;
    let utc = t.checked_to_offset(time::UtcOffset::UTC)?;
    (0..=9999)
        .contains(&utc.year())
        .then(|| fixed_width(utc, Fraction::Nanos))
}

/// How many fractional digits [`fixed_width`] writes.
#[derive(Clone, Copy)]
enum Fraction {
    /// Six, as [`LEDGER_FORMAT`].
    Micros,
    /// Nine, as [`INSTANT_FORMAT`].
    Nanos,
}

/// `utc` (a UTC time in the years 0000–9999) spelled as [`LEDGER_FORMAT`] or
/// [`INSTANT_FORMAT`] would spell it, fractions truncated, not rounded, as they do.
///
/// Why by hand: every submission's instant and every log line is spelled this way, and the
/// format-description interpreter was about 7% of the parse threads' time (BENCHMARKS.md).
/// A call took 178 ns there, 156 ns through `write!` with widths, and 42 ns here. The tests
/// check it against `time`'s own formatting.
fn fixed_width(utc: OffsetDateTime, fraction: Fraction) -> String {
    debug_assert!(utc.offset().is_utc() && (0..=9999).contains(&utc.year()));
    fn digits(out: &mut String, value: u32, width: u32) {
        for place in (0..width).rev() {
            out.push(char::from(b'0' + (value / 10u32.pow(place) % 10) as u8));
        }
    }
    let (date, clock) = (utc.date(), utc.time());
    let mut out = String::with_capacity(30);
    digits(&mut out, utc.year() as u32, 4);
    out.push('-');
    digits(&mut out, u32::from(u8::from(date.month())), 2);
    out.push('-');
    digits(&mut out, u32::from(date.day()), 2);
    out.push('T');
    digits(&mut out, u32::from(clock.hour()), 2);
    out.push(':');
    digits(&mut out, u32::from(clock.minute()), 2);
    out.push(':');
    digits(&mut out, u32::from(clock.second()), 2);
    out.push('.');
    match fraction {
        Fraction::Micros => digits(&mut out, clock.microsecond(), 6),
        Fraction::Nanos => digits(&mut out, clock.nanosecond(), 9),
    }
    out.push('Z');
    out
}

/// The current time as the ledger stores it.
pub fn now_rfc3339() -> String {
    ledger_time(OffsetDateTime::now_utc())
}

/// The time `ago` before now, as the ledger stores times.
pub fn ago_rfc3339(ago: std::time::Duration) -> String {
    ledger_time(OffsetDateTime::now_utc() - ago)
}

/// `t` as the ledger stores times (converted to UTC first).
pub fn ledger_time(t: OffsetDateTime) -> String {
    let utc = t.to_offset(time::UtcOffset::UTC);
    if (0..=9999).contains(&utc.year()) {
        return fixed_width(utc, Fraction::Micros);
    }
    utc.format(LEDGER_FORMAT).expect("UTC time always formats")
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
    fn every_spelling_of_one_instant_has_one_instant() {
        let spellings = [
            "2026-07-01T09:00:00Z",
            "2026-07-01T11:00:00+02:00",
            "2026-07-01t09:00:00z",
            "2026-07-01T09:00:00.000Z",
            "2026-07-01T04:30:00-04:30",
        ];
        for s in spellings {
            assert_eq!(
                instant_utc(s).as_deref(),
                Ok("2026-07-01T09:00:00.000000000Z"),
                "{s}"
            );
        }
        assert_eq!(
            instant_utc("2026-07-01T09:00:00.000000001Z").as_deref(),
            Ok("2026-07-01T09:00:00.000000001Z")
        );
        assert_eq!(
            instant_utc("2026-07-01 09:00:00"),
            Err(Unstorable::NotRfc3339)
        );
        assert_eq!(
            instant_utc("0000-01-01T00:30:00+01:00"),
            Err(Unstorable::OutsideYears)
        );
        assert_eq!(
            instant_utc("9999-12-31T23:30:00-01:00"),
            Err(Unstorable::OutsideYears)
        );
        assert_eq!(
            instant_utc("9999-12-31T23:30:00+01:00").as_deref(),
            Ok("9999-12-31T22:30:00.000000000Z")
        );
    }

    #[test]
    fn leap_seconds_are_refused_and_never_taken_for_the_nanosecond_before() {
        for leap in [
            "2016-12-31T23:59:60Z",
            "2016-12-31T23:59:60.5Z",
            "2016-12-31T23:59:60.000000001Z",
            "2016-12-31T18:59:60-05:00",
            "2015-06-30T23:59:60z",
        ] {
            assert_eq!(instant_utc(leap), Err(Unstorable::LeapSecond), "{leap}");
            assert_eq!(
                leap_second_stand_in(leap).as_deref(),
                Some(if leap.starts_with("2015") {
                    "2015-06-30T23:59:59.999999999Z"
                } else {
                    "2016-12-31T23:59:59.999999999Z"
                }),
                "{leap}"
            );
        }
        assert_eq!(
            instant_utc("2016-12-31T23:59:59.999999999Z").as_deref(),
            Ok("2016-12-31T23:59:59.999999999Z")
        );
        assert_eq!(leap_second_stand_in("2016-12-31T23:59:59.999999999Z"), None);
        // Second 60 anywhere but a month's last second in UTC is no leap second at all.
        assert_eq!(
            instant_utc("2016-12-30T23:59:60Z"),
            Err(Unstorable::NotRfc3339)
        );
        assert_eq!(
            instant_utc("2016-12-31T23:58:60Z"),
            Err(Unstorable::NotRfc3339)
        );
    }

    #[test]
    fn the_hand_spelling_is_the_format_descriptions_spelling() {
        let mut rng = fastrand::Rng::with_seed(17);
        let edges = [
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
            "2024-02-29T12:34:56.000000999Z",
            "2026-07-01T09:00:00.1234567Z",
        ]
        .map(|s| OffsetDateTime::parse(s, &Rfc3339).unwrap());
        let random = (0..20_000).map(|_| {
            let seconds = rng.i64(-62_167_219_200..253_402_300_800);
            OffsetDateTime::from_unix_timestamp(seconds).unwrap()
                + time::Duration::nanoseconds(rng.i64(0..1_000_000_000))
        });
        for t in edges.into_iter().chain(random) {
            assert_eq!(
                fixed_width(t, Fraction::Micros),
                t.format(LEDGER_FORMAT).unwrap(),
                "{t}"
            );
            assert_eq!(
                fixed_width(t, Fraction::Nanos),
                t.format(INSTANT_FORMAT).unwrap(),
                "{t}"
            );
        }
        let before_year_0 = OffsetDateTime::parse("0000-01-01T00:30:00+01:00", &Rfc3339).unwrap();
        assert_eq!(
            ledger_time(before_year_0),
            before_year_0
                .to_offset(time::UtcOffset::UTC)
                .format(LEDGER_FORMAT)
                .unwrap()
        );
    }

    #[test]
    fn age_is_never_negative_and_rejects_garbage() {
        assert_eq!(age_seconds("2999-01-01T00:00:00Z"), Some(0.0));
        assert!(age_seconds("2000-01-01T00:00:00Z").unwrap() > 0.0);
        assert_eq!(age_seconds("yesterday"), None);
    }
}
