//! `cargo run --release --example bench_checked -- [--n N] [--batch B] [--rounds R]`
//!
//! What the contract checks (`ledger::Checked`) cost per recorded item: the same batches of the
//! benchmark's kind of load (20% byte-identical resends) recorded into the in-memory ledger
//! bare (`MemoryStore`) and checked (`MemoryLedger`, the same store inside `Checked`), rounds
//! alternating, reporting the recording thread's own CPU per item (`RUSAGE_THREAD`). The
//! memory ledger is the cheapest there is, so the difference is the checks' whole cost, an
//! upper bound on their share of a SQLite or PostgreSQL batch.

use claimgate::domain::submission::{parse_payload, Limits, Submission};
use claimgate::ledger::{Item, Ledger, MemoryLedger, MemoryStore};

fn main() {
    let (mut n, mut batch, mut rounds) = (200_000usize, 4_000usize, 5usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().and_then(|v| v.parse().ok()).expect("a number");
        match a.as_str() {
            "--n" => n = value(),
            "--batch" => batch = value(),
            "--rounds" => rounds = value(),
            other => panic!("unknown flag {other}"),
        }
    }
    let load = submissions(n);
    let (mut bare, mut checked) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        bare.push(record_all(&MemoryStore::default(), &load, batch));
        checked.push(record_all(&MemoryLedger::new(), &load, batch));
        println!(
            "round {round}: bare {:.3} us/item, checked {:.3} us/item",
            bare[round - 1],
            checked[round - 1]
        );
    }
    let (b, c) = (median(&mut bare), median(&mut checked));
    println!(
        "medians over {rounds} rounds of {n} items in batches of {batch}: bare {b:.3} us/item, \
         checked {c:.3} us/item, the checks {:.0} ns/item",
        (c - b) * 1000.0
    );
}

/// `n` submissions, every fifth a resend of the one before it.
fn submissions(n: usize) -> Vec<Submission> {
    let limits = Limits {
        payload_bytes_max: 1 << 20,
        amount_cents_max: 1 << 40,
    };
    (0..n)
        .map(|i| {
            let i = if i % 5 == 4 { i - 1 } else { i };
            let payload = format!(
                r#"{{"award_id":"A-{i:07}","submission_timestamp":"2026-07-01T09:00:00Z","amount_cents":{}}}"#,
                i + 1
            );
            parse_payload(payload.as_bytes(), &limits).expect("a valid submission")
        })
        .collect()
}

/// Records `load` in batches into `ledger`; the recording thread's CPU per item, in us.
fn record_all(ledger: &dyn Ledger, load: &[Submission], batch: usize) -> f64 {
    let ids: Vec<String> = (0..load.len()).map(|i| format!("{i}-0")).collect();
    let cpu = thread_cpu_us();
    for (subs, ids) in load.chunks(batch).zip(ids.chunks(batch)) {
        let items: Vec<Item<'_>> = subs
            .iter()
            .zip(ids)
            .map(|(s, id)| Item::Submission {
                submission: s,
                entry_id: id,
                delivery_count: 1,
            })
            .collect();
        let outcomes = ledger.record(&items, "bench", "bench:s").expect("recorded");
        assert_eq!(outcomes.len(), items.len());
    }
    (thread_cpu_us() - cpu) / load.len() as f64
}

/// This thread's user + system CPU time so far, in microseconds.
fn thread_cpu_us() -> f64 {
    // SAFETY: getrusage writes only into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
