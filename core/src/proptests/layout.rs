//! Layout properties: compose and decode, ticks and first IDs, the end of
//! a layout, changed layouts, and the epoch's text form (format and parse,
//! against a naive calendar).

use super::*;
use crate::layout::{format_unix_ms, parse_epoch, PartError};

/// Days from 1970-01-01 to `y`-`m`-`d`, counted the slow way.
fn naive_days(y: i64, m: i64, d: i64) -> i64 {
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let year_len = |y: i64| if leap(y) { 366 } else { 365 };
    let mut days = 0;
    if y >= 1970 {
        days += (1970..y).map(year_len).sum::<i64>();
    } else {
        days -= (y..1970).map(year_len).sum::<i64>();
    }
    days += (1..m).map(|mm| naive_month_len(y, mm)).sum::<i64>();
    days + d - 1
}

fn naive_month_len(y: i64, m: i64) -> i64 {
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

proptest! {
    /// Property 8: compose and decode are inverse on in-range parts, and
    /// IDs order like their (ticks, worker, sequence).
    #[test]
    fn compose_decode_round_trip(
        (l, a) in arb_layout().prop_flat_map(arb_parts),
        b_seed in (any::<i64>(), any::<u32>(), any::<u32>()),
    ) {
        let id = l.compose(a.ticks, a.worker_id, a.sequence).unwrap();
        prop_assert!((0..=l.max_id()).contains(&id));
        prop_assert_eq!(l.decode(id).unwrap(), a);
        prop_assert_eq!(l.compose_unchecked(a.ticks, a.worker_id, a.sequence), id);
        let b = Parts {
            ticks: b_seed.0.rem_euclid(l.max_ticks() + 1),
            worker_id: b_seed.1 % (l.max_worker_id() + 1).max(1),
            sequence: b_seed.2 % (l.max_sequence() + 1),
        };
        let idb = l.compose(b.ticks, b.worker_id, b.sequence).unwrap();
        prop_assert_eq!(
            id.cmp(&idb),
            (a.ticks, a.worker_id, a.sequence).cmp(&(b.ticks, b.worker_id, b.sequence))
        );
    }

    /// Property 8: every value of 0..=max_id decodes and composes back.
    #[test]
    fn decode_compose_round_trip(l in arb_layout(), seed in any::<i64>()) {
        // max_id is 2^total_bits - 1: masking gives a uniform ID.
        let id = seed & l.max_id();
        let p = l.decode(id).unwrap();
        prop_assert_eq!(l.compose(p.ticks, p.worker_id, p.sequence), Ok(id));
        for edge in [0, l.max_id()] {
            let p = l.decode(edge).unwrap();
            prop_assert_eq!(l.compose(p.ticks, p.worker_id, p.sequence), Ok(edge));
        }
    }

    /// Property 8: out-of-range parts and IDs are errors naming the part.
    #[test]
    fn out_of_range_parts_are_errors(
        l in arb_layout(),
        over in 1..=1000i64,
        under in 1..=1000i64,
        small in any::<u32>(),
    ) {
        let (mt, mw, ms) = (l.max_ticks(), l.max_worker_id(), l.max_sequence());
        let over32 = u32::try_from(over).unwrap();
        let w = small % (mw + 1).max(1);
        let s = small % (ms + 1);
        prop_assert_eq!(
            l.compose(mt + over, w, s),
            Err(PartError::Ticks { value: mt + over, max: mt })
        );
        prop_assert_eq!(
            l.compose(-under, w, s),
            Err(PartError::Ticks { value: -under, max: mt })
        );
        if let Some(bad) = mw.checked_add(over32) {
            prop_assert_eq!(l.compose(0, bad, s), Err(PartError::Worker { value: bad.into(), max: mw }));
        }
        if let Some(bad) = ms.checked_add(over32) {
            prop_assert_eq!(l.compose(0, w, bad), Err(PartError::Sequence { value: bad.into(), max: ms }));
        }
        prop_assert_eq!(l.decode(-under), Err(PartError::Id { value: -under, max: l.max_id() }));
        if let Some(bad) = l.max_id().checked_add(over) {
            prop_assert_eq!(l.decode(bad), Err(PartError::Id { value: bad, max: l.max_id() }));
        }
        prop_assert_eq!(
            l.decode(i64::MIN),
            Err(PartError::Id { value: i64::MIN, max: l.max_id() })
        );
    }

    /// Property 8: `tick_at` and `tick_start_unix_ms` agree; `first_id_at`
    /// is the smallest ID of its tick and above every ID of the tick before.
    #[test]
    fn ticks_and_first_ids_are_consistent(
        l in arb_layout(),
        ms in prop_oneof![
            (NOW - 100 * YEAR_MS)..=(NOW + 100 * YEAR_MS),
            YEAR_0_MS..=YEAR_9999_END_MS,
        ],
        w in any::<u32>(),
        s in any::<u32>(),
    ) {
        let t = l.tick_at(ms);
        prop_assert!(l.tick_start_unix_ms(t) <= ms);
        prop_assert!(ms < l.tick_start_unix_ms(t + 1));
        prop_assert_eq!(l.tick_start_unix_ms(t + 1) - l.tick_start_unix_ms(t), l.unit_ms);
        prop_assert_eq!(l.tick_at(l.tick_start_unix_ms(t)), t);
        prop_assert_eq!(l.tick_at(l.tick_start_unix_ms(t + 1) - 1), t);
        match l.first_id_at(ms) {
            Ok(first) => {
                prop_assert!((0..=l.max_ticks()).contains(&t));
                let want = Parts { ticks: t, worker_id: 0, sequence: 0 };
                prop_assert_eq!(l.decode(first).unwrap(), want);
                let w = w % (l.max_worker_id() + 1).max(1);
                let s = s % (l.max_sequence() + 1);
                prop_assert!(first <= l.compose(t, w, s).unwrap());
                if t > 0 {
                    prop_assert!(first > last_id_of_tick(&l, t - 1));
                }
            }
            Err(e) => {
                prop_assert!(t < 0 || t > l.max_ticks(), "{:?} at tick {}", e, t);
                prop_assert_eq!(e, PartError::Ticks { value: t, max: l.max_ticks() });
            }
        }
    }

    /// The end of a layout is the last millisecond of its last tick.
    #[test]
    fn end_is_the_last_millisecond_of_the_last_tick(l in arb_layout()) {
        let exact = exact_end_ms(l.epoch_ms, l.unit_ms, l.time_bits());
        if exact < i128::from(i64::MAX) {
            prop_assert_eq!(i128::from(l.end_unix_ms()), exact);
            prop_assert_eq!(l.tick_at(l.end_unix_ms()), l.max_ticks());
            prop_assert_eq!(l.tick_at(l.end_unix_ms() + 1), l.max_ticks() + 1);
            prop_assert!(l.first_id_at(l.end_unix_ms()).is_ok());
            prop_assert!(l.first_id_at(l.end_unix_ms() + 1).is_err());
        } else {
            prop_assert_eq!(l.end_unix_ms(), i64::MAX);
        }
        prop_assert!(l.end_unix_ms() >= NOW + MIN_LIFETIME_MS);
    }

    /// A changed layout starts at the first tick whose IDs are all above
    /// every ID the old layout can have issued up to a time; `None` exactly
    /// when no tick of the new layout gets there.
    #[test]
    fn first_tick_above_is_the_first_tick_above_the_old_ids(
        old in arb_layout(),
        new in arb_layout(),
        until in prop_oneof![
            (NOW - 60 * YEAR_MS)..=(NOW + YEAR_MS),
            Just(i64::MIN),
            Just(i64::MAX),
            any::<i64>(),
        ],
    ) {
        let old_tick = old.tick_at(until).min(old.max_ticks());
        let got = new.first_tick_above(&old, until);
        if old_tick < 0 {
            prop_assert_eq!(got, Some(0));
        } else {
            let old_max = last_id_of_tick(&old, old_tick);
            match got {
                Some(t) => {
                    prop_assert!((0..=new.max_ticks()).contains(&t));
                    // Every ID of tick t (and after) is above the old ones ...
                    prop_assert!(new.compose(t, 0, 0).unwrap() > old_max);
                    // ... and some ID of the tick before is not.
                    if t > 0 {
                        prop_assert!(new.compose(t - 1, 0, 0).unwrap() <= old_max);
                    }
                }
                None => {
                    prop_assert!(new.compose(new.max_ticks(), 0, 0).unwrap() <= old_max);
                }
            }
        }
    }

    /// Property 8: format then parse gives back the millisecond, 1970 to 2200.
    #[test]
    fn format_then_parse_round_trips(ms in 0..YEAR_2200_MS) {
        let text = format_unix_ms(ms);
        prop_assert_eq!(text.len(), 24, "{}", text);
        prop_assert_eq!(parse_epoch(&text), Ok(ms), "{}", text);
        // The other accepted spellings of the same instant.
        let bare = &text[..23];
        prop_assert_eq!(parse_epoch(bare), Ok(ms));
        prop_assert_eq!(parse_epoch(&bare.replacen(' ', "T", 1)), Ok(ms));
        for suffix in ["z", "+00", "+00:00", "+0000"] {
            let spelled = format!(" {bare}{suffix} ");
            prop_assert_eq!(parse_epoch(&spelled), Ok(ms), "{}", spelled);
        }
        // The date alone is midnight.
        prop_assert_eq!(parse_epoch(&text[..10]), Ok(ms - ms.rem_euclid(DAY_MS)));
        // Unix milliseconds as digits.
        prop_assert_eq!(parse_epoch(&ms.to_string()), Ok(ms));
    }

    /// The same round trip over every four-digit year (0000 to 9999).
    #[test]
    fn format_then_parse_round_trips_for_four_digit_years(ms in YEAR_0_MS..=YEAR_9999_END_MS) {
        let text = format_unix_ms(ms);
        prop_assert_eq!(parse_epoch(&text), Ok(ms), "{}", text);
    }

    /// Dates and times built from fields parse to the slow count of days.
    #[test]
    fn parse_matches_a_naive_calendar(
        // Centuries and February often: the leap-year rules live there.
        y in prop_oneof![0..=9999i64, (0..=99i64).prop_map(|c| c * 100)],
        m in prop_oneof![1..=12i64, Just(2i64)],
        d_seed in any::<u32>(),
        (h, mi, s) in (0..=23i64, 0..=59i64, 0..=59i64),
        frac in prop_oneof![Just(None), (1..=3usize, 0..1000i64).prop_map(Some)],
        sep in prop_oneof![Just(' '), Just('T')],
        suffix in prop::sample::select(vec!["", "Z", "z", "+00", "+00:00", "+0000"]),
    ) {
        let d = 1 + i64::from(d_seed) % naive_month_len(y, m);
        let mut text = format!("{y:04}-{m:02}-{d:02}{sep}{h:02}:{mi:02}:{s:02}");
        let mut want = naive_days(y, m, d) * DAY_MS + ((h * 60 + mi) * 60 + s) * 1000;
        if let Some((len, v)) = frac {
            let digits = format!("{v:03}");
            text.push('.');
            text.push_str(&digits[..len]);
            want += digits[..len].parse::<i64>().unwrap() * [100, 10, 1][len - 1];
        }
        text.push_str(suffix);
        prop_assert_eq!(parse_epoch(&text), Ok(want), "{}", text);
        prop_assert_eq!(format_unix_ms(want)[..19].replace(' ', "T"), text[..19].replace(' ', "T"));
        // The day after the month's last is not a date.
        let bad = format!("{y:04}-{m:02}-{:02}", naive_month_len(y, m) + 1);
        prop_assert!(parse_epoch(&bad).is_err(), "{}", bad);
    }

    /// A field out of its range (month, day, hour, minute, second,
    /// fraction) makes the text an error, not a wrapped date.
    #[test]
    fn parse_rejects_out_of_range_fields(
        y in 0..=9999i64,
        m in 1..=12i64,
        d_seed in any::<u32>(),
        field in 0..6usize,
        bad in 0..=99i64,
        edge in any::<bool>(),
    ) {
        let dim = naive_month_len(y, m);
        let d = 1 + i64::from(d_seed) % dim;
        let mut f = [m, d, 12, 30, 30];
        // The first invalid value half the time, any invalid value otherwise.
        let spread = if edge { 0 } else { bad };
        let bad = match field {
            0 if bad % 2 == 0 => 0,
            0 => 13 + spread % 87,
            1 if bad % 2 == 0 => 0,
            1 => dim + 1 + spread % (99 - dim),
            2 => 24 + spread % 76,
            3 | 4 => 60 + spread % 40,
            _ => bad,
        };
        let text = if field < 5 {
            f[field] = bad;
            format!("{y:04}-{:02}-{:02} {:02}:{:02}:{:02}", f[0], f[1], f[2], f[3], f[4])
        } else {
            // A fraction of four digits or more is not milliseconds.
            format!("{y:04}-{m:02}-{d:02} 12:30:30.{bad:04}")
        };
        prop_assert!(parse_epoch(&text).is_err(), "{}", text);
    }

    /// `parse_epoch` never panics, whatever the text.
    #[test]
    fn parse_epoch_never_panics(
        text in prop_oneof![
            any::<String>(),
            "[0-9 :.TZz+-]{0,30}",
            concat!(
                "[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}",
                "(\\.[0-9]{0,4})?(Z|\\+00|\\+00:00)?",
            ),
        ],
    ) {
        let _ = parse_epoch(&text);
    }

    /// `format_unix_ms` never panics.
    #[test]
    fn format_never_panics(ms in any::<i64>()) {
        let _ = format_unix_ms(ms);
    }
}

#[test]
fn leap_years_follow_the_gregorian_rules() {
    for (text, ok) in [
        ("1900-02-29", false),
        ("2100-02-29", false),
        ("2200-02-29", false),
        ("1800-02-29", false),
        ("2023-02-29", false),
        ("2000-02-29", true),
        ("2400-02-29", true),
        ("2024-02-29", true),
        ("0000-02-29", true),
    ] {
        assert_eq!(parse_epoch(text).is_ok(), ok, "{text}");
    }
    assert_eq!(
        parse_epoch("2000-03-01").unwrap() - parse_epoch("2000-02-28").unwrap(),
        2 * DAY_MS
    );
    assert_eq!(
        parse_epoch("2100-03-01").unwrap() - parse_epoch("2100-02-28").unwrap(),
        DAY_MS
    );
    assert_eq!(
        format_unix_ms(parse_epoch("2100-03-01").unwrap() - 1),
        "2100-02-28 23:59:59.999Z"
    );
}
