//! The "disbursed per day or month" chart: buckets from the tally's days, drawn as inline SVG.
//!
//! Pure. Buckets are days when the payments span at most [`DAYS_SPAN_MAX`] days, months when
//! they span at most [`MONTHS_SPAN_MAX`] months, years beyond that; days and months with no
//! payment between the first and the last are drawn as empty buckets, so a gap shows as a gap.

use super::markup::text;
use super::tally::{Day, OTHER};
use crate::domain::money::{dollars, thousands};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The longest span drawn day by day.
pub const DAYS_SPAN_MAX: usize = 62;
/// The longest span drawn month by month.
pub const MONTHS_SPAN_MAX: usize = 240;
/// The chart's drawing area, in SVG units.
const WIDTH: f64 = 880.0;
const HEIGHT: f64 = 200.0;
/// Room for the labels: left (amounts), bottom (buckets).
const LEFT: f64 = 120.0;
const BOTTOM: f64 = 34.0;
/// The widest bar, so a chart of one or two buckets does not fill the page.
const BAR_MAX: f64 = 48.0;

/// What one bar stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// `YYYY-MM-DD`.
    Day,
    /// `YYYY-MM`.
    Month,
    /// `YYYY`.
    Year,
}

impl Unit {
    /// The word for a bucket of this unit.
    pub fn noun(self) -> &'static str {
        match self {
            Unit::Day => "day",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// The buckets of `days` (label and payments, in order; the [`OTHER`] bucket last), and the
/// unit chosen.
pub fn buckets(days: &BTreeMap<String, Day>) -> (Unit, Vec<(String, Day)>) {
    let dated: Vec<(&String, &Day)> = days.iter().filter(|(d, _)| *d != OTHER).collect();
    let (first, last) = match (dated.first(), dated.last()) {
        (Some(f), Some(l)) => (f.0.as_str(), l.0.as_str()),
        _ => ("", ""),
    };
    let unit = if first.is_empty() || span_days(first, last) <= DAYS_SPAN_MAX {
        Unit::Day
    } else if span_months(first, last) <= MONTHS_SPAN_MAX {
        Unit::Month
    } else {
        Unit::Year
    };
    let width = match unit {
        Unit::Day => 10,
        Unit::Month => 7,
        Unit::Year => 4,
    };
    let mut out: BTreeMap<String, Day> = BTreeMap::new();
    if !first.is_empty() && unit != Unit::Year {
        for label in labels_between(&first[..width], &last[..width], unit) {
            out.insert(label, Day::default());
        }
    }
    for (day, d) in dated {
        let b = out.entry(day[..width].to_owned()).or_default();
        b.payments += d.payments;
        b.cents += d.cents;
    }
    let mut rows: Vec<(String, Day)> = out.into_iter().collect();
    if let Some(d) = days.get(OTHER) {
        rows.push((OTHER.to_owned(), *d));
    }
    (unit, rows)
}

/// Days from `first` to `last` (both `YYYY-MM-DD`), counting both.
fn span_days(first: &str, last: &str) -> usize {
    match (date(first), date(last)) {
        (Some(a), Some(b)) => ((b - a).whole_days().max(0) + 1) as usize,
        _ => usize::MAX,
    }
}

/// Months from `first` to `last`, counting both.
fn span_months(first: &str, last: &str) -> usize {
    let month = |s: &str| -> i64 {
        let y: i64 = s[..4].parse().unwrap_or(0);
        let m: i64 = s[5..7].parse().unwrap_or(1);
        y * 12 + m - 1
    };
    (month(last) - month(first)).max(0) as usize + 1
}

fn date(s: &str) -> Option<time::Date> {
    time::Date::parse(
        s.get(..10)?,
        time::macros::format_description!("[year]-[month]-[day]"),
    )
    .ok()
}

/// Every day or month label from `first` to `last`, both included.
fn labels_between(first: &str, last: &str, unit: Unit) -> Vec<String> {
    let mut out = Vec::new();
    match unit {
        Unit::Day => {
            let (Some(mut d), Some(end)) = (date(first), date(last)) else {
                return out;
            };
            while d <= end && out.len() <= DAYS_SPAN_MAX {
                out.push(d.to_string());
                let Some(next) = d.next_day() else { break };
                d = next;
            }
        }
        Unit::Month => {
            let (mut y, mut m): (i64, i64) = (
                first[..4].parse().unwrap_or(0),
                first[5..7].parse().unwrap_or(1),
            );
            while out.len() <= MONTHS_SPAN_MAX {
                let label = format!("{y:04}-{m:02}");
                let done = label.as_str() >= last;
                out.push(label);
                if done {
                    break;
                }
                (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            }
        }
        Unit::Year => {}
    }
    out
}

/// The chart as inline SVG: one bar per bucket, each with a `<title>` (shown on hover, read by
/// screen readers) and its figures as data attributes.
pub fn svg(unit: Unit, rows: &[(String, Day)]) -> String {
    let max = rows.iter().map(|(_, d)| d.cents).max().unwrap_or(0).max(1);
    let step = (WIDTH - LEFT) / rows.len().max(1) as f64;
    let bar = (step * 0.8).clamp(1.0, BAR_MAX);
    let plot = HEIGHT - BOTTOM;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" preserveAspectRatio="xMinYMin meet" aria-label="Disbursed per {}"><g font-size="11" fill="#444">"##,
        unit.noun()
    );
    for (frac, y) in [(1.0, 4.0), (0.5, 4.0 + (plot - 4.0) / 2.0), (0.0, plot)] {
        let amount = (max as f64 * frac) as i128;
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{WIDTH}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            y + 4.0,
            text(&dollars(amount))
        );
    }
    let label_every = (rows.len() / 8).max(1);
    for (i, (label, d)) in rows.iter().enumerate() {
        let h = ((d.cents.max(0) as f64 / max as f64) * (plot - 4.0)).max(0.0);
        let x = LEFT + step * i as f64 + (step - bar) / 2.0;
        let _ = write!(
            s,
            r##"<rect class="bar" x="{x:.1}" y="{:.1}" width="{bar:.1}" height="{h:.1}" fill="#2f6db5" data-bucket="{}" data-cents="{}" data-payments="{}"><title>{}: {} in {} payments</title></rect>"##,
            plot - h,
            text(label),
            d.cents,
            d.payments,
            text(label),
            text(&dollars(d.cents)),
            thousands(d.payments)
        );
        if i % label_every == 0 || i + 1 == rows.len() {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                x + bar / 2.0,
                HEIGHT - BOTTOM + 16.0,
                text(label)
            );
        }
    }
    s.push_str("</g></svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn days(list: &[(&str, i128)]) -> BTreeMap<String, Day> {
        list.iter()
            .map(|(d, c)| {
                (
                    (*d).to_owned(),
                    Day {
                        payments: 1,
                        cents: *c,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_short_span_is_drawn_day_by_day_with_its_gaps() {
        let (unit, rows) = buckets(&days(&[("2026-06-30", 5), ("2026-07-02", 7)]));
        assert_eq!(unit, Unit::Day);
        let labels: Vec<&str> = rows.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["2026-06-30", "2026-07-01", "2026-07-02"]);
        assert_eq!(rows[1].1, Day::default());
    }

    #[test]
    fn a_long_span_is_drawn_by_month_and_a_very_long_one_by_year() {
        let (unit, rows) = buckets(&days(&[
            ("2023-01-05", 1),
            ("2023-01-20", 2),
            ("2024-03-01", 4),
            (OTHER, 8),
        ]));
        assert_eq!(unit, Unit::Month);
        assert_eq!(rows.len(), 15 + 1);
        assert_eq!(
            rows[0],
            (
                "2023-01".into(),
                Day {
                    payments: 2,
                    cents: 3
                }
            )
        );
        assert_eq!(rows[14].0, "2024-03");
        assert_eq!(rows[15].0, OTHER);
        let (unit, rows) = buckets(&days(&[("1999-01-01", 1), ("2026-07-01", 2)]));
        assert_eq!((unit, rows.len()), (Unit::Year, 2));
        let total: i128 = rows.iter().map(|(_, d)| d.cents).sum();
        assert_eq!(total, 3);
    }

    #[test]
    fn the_svg_has_one_bar_per_bucket_carrying_its_figures() {
        let (unit, rows) = buckets(&days(&[("2026-07-01", 150), ("2026-07-02", 0)]));
        let svg = svg(unit, &rows);
        assert_eq!(svg.matches("<rect class=\"bar\"").count(), 2);
        assert!(
            svg.contains(r#"data-bucket="2026-07-01" data-cents="150""#),
            "{svg}"
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }
}
