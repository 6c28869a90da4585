//! The lease's expiry: `--expires-at RFC3339` (the control plane passes START's `expiresAt`).
//!
//! At expiry the mount turns read-only (writes already made are flushed first), and after the
//! policy's grace period it is unmounted. An expiry already past refuses the mount
//! (`START_EXPIRED`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parse an RFC 3339 timestamp such as `2026-11-22T12:22:29.696Z` or
/// `2026-11-22T14:22:29+02:00`.
pub fn parse_rfc3339(s: &str) -> Result<SystemTime, String> {
    let bad =
        |why: &str| format!("'{s}' is not an RFC 3339 time ({why}); example: 2026-11-22T12:22:29Z");
    let b = s.as_bytes();
    if b.len() < 20 {
        return Err(bad("too short"));
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = s.get(r).ok_or_else(|| bad("bad digits"))?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad("bad digits"));
        }
        part.parse::<i64>().map_err(|_| bad("bad digits"))
    };
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad("expected YYYY-MM-DDTHH:MM:SS"));
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return Err(bad("field out of range"));
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad("empty fraction"));
        }
        let frac = &s[start..i.min(start + 9)];
        nanos = frac.parse::<u32>().map_err(|_| bad("bad fraction"))?
            * 10u32.pow(9 - frac.len() as u32);
    }
    let offset_secs = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            let off = oh * 3600 + om * 60;
            if *sign == b'+' {
                off
            } else {
                -off
            }
        }
        _ => return Err(bad("expected Z or +HH:MM after the seconds")),
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec.min(59) - offset_secs;
    if secs < 0 {
        return Err(bad("before 1970"));
    }
    Ok(UNIX_EPOCH + Duration::new(secs as u64, nanos))
}

/// Format a time as RFC 3339 UTC with milliseconds (as AWCP messages carry them).
pub fn format_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_awcp_timestamps() {
        let t = parse_rfc3339("2026-11-22T12:22:29.696Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::new(1_795_350_149, 696_000_000)
        );
        assert_eq!(format_rfc3339(t), "2026-11-22T12:22:29.696Z");
        let plus = parse_rfc3339("2026-11-22T14:22:29.696+02:00").unwrap();
        assert_eq!(plus, t);
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z").unwrap(), UNIX_EPOCH);
        assert_eq!(
            format_rfc3339(parse_rfc3339("2024-02-29T23:59:59Z").unwrap()),
            "2024-02-29T23:59:59.000Z"
        );
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "tomorrow",
            "2026-11-22",
            "2026-13-01T00:00:00Z",
            "2026-11-22T12:22:29",
            "2026-11-22T12:22:29+0200",
            "2026-11-22T12:22:29.Z",
        ] {
            assert!(parse_rfc3339(s).is_err(), "{s}");
        }
    }
}
