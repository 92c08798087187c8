//! Document timestamps: Unix seconds or RFC 3339 text, to one scale (milliseconds).
//!
//! The original of a cluster is its earliest document, so timestamps from a corpus must be
//! comparable whatever form they came in. JSONL input may give an integer (or decimal)
//! number of seconds since the Unix epoch, or an RFC 3339 date-time such as
//! `2024-05-01T12:00:00Z` or `2024-05-01T14:00:00.250+02:00`. Both become milliseconds since
//! the epoch (UTC). Parsing is a few lines of arithmetic, so no date library is linked.

/// Milliseconds since the Unix epoch for a JSON number of seconds. `None` for NaN, infinite
/// or out-of-range values.
pub fn from_seconds(secs: f64) -> Option<i64> {
    let ms = (secs * 1000.0).round();
    if ms.is_finite() && ms.abs() < 9.0e18 { Some(ms as i64) } else { None }
}

/// Milliseconds since the Unix epoch for an integer number of seconds (saturating).
pub fn from_integer_seconds(secs: i64) -> i64 {
    secs.saturating_mul(1000)
}

/// Parses an RFC 3339 date-time (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`; `t` or a
/// space may stand for `T`, `z` for `Z`) to milliseconds since the Unix epoch. Fractions
/// finer than a millisecond are truncated. A leap second (`:60`) counts as the next second.
pub fn parse_rfc3339(s: &str) -> Result<i64, String> {
    let bad =
        || format!("timestamp {s:?} is neither Unix seconds nor RFC 3339 (2024-05-01T12:00:00Z)");
    let b = s.as_bytes();
    if b.len() < 20 {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = &b[r];
        if part.iter().all(u8::is_ascii_digit) {
            Ok(part.iter().fold(0i64, |a, &d| a * 10 + (d - b'0') as i64))
        } else {
            Err(bad())
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || min > 59
        || sec > 60
    {
        return Err(bad());
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let digits = &b[start..i.min(start + 3)];
        millis = digits.iter().fold(0i64, |a, &d| a * 10 + (d - b'0') as i64)
            * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_min = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return Err(bad());
            }
            let o = h * 60 + m;
            if sign == b'-' { -o } else { o }
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_min * 60;
    Ok(secs * 1000 + millis)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_examples() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01.5Z"), Ok(1500));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Ok(951_868_800_000));
        // `date -u -d 2024-02-29T12:34:56Z +%s` = 1709210096
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), Ok(1_709_210_096_000));
        assert_eq!(parse_rfc3339("2024-02-29t14:34:56.123456+02:00"), Ok(1_709_210_096_123));
        assert_eq!(parse_rfc3339("2024-02-29 07:34:56-05:00"), Ok(1_709_210_096_000));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Ok(-1000));
    }

    #[test]
    fn rfc3339_rejects() {
        for s in [
            "",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00+0200",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00Zjunk",
            "2024/01/01T00:00:00Z",
            "２０２４-01-01T00:00:00Z",
        ] {
            assert!(parse_rfc3339(s).is_err(), "{s}");
        }
    }

    #[test]
    fn days_match_a_day_by_day_count() {
        let mut days = 0i64;
        for y in 1970..2100 {
            for m in 1..=12 {
                for d in 1..=days_in_month(y, m) {
                    assert_eq!(days_from_civil(y, m, d), days);
                    days += 1;
                }
            }
        }
    }

    #[test]
    fn seconds() {
        assert_eq!(from_seconds(1.25), Some(1250));
        assert_eq!(from_seconds(f64::NAN), None);
        assert_eq!(from_seconds(1e300), None);
        assert_eq!(from_integer_seconds(i64::MAX), i64::MAX);
    }
}
