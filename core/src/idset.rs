//! Task id lists as users write them: `5,17-20` (what `htc retry --tasks` takes).

use std::ops::RangeInclusive;

/// Parses `5,17-20,3`: ids from 1, single or as inclusive ranges, in any order. The error names
/// the piece that is wrong.
pub fn parse(s: &str) -> Result<Vec<RangeInclusive<u64>>, String> {
    let mut out = Vec::new();
    for piece in s.split(',') {
        let p = piece.trim();
        if p.is_empty() {
            return Err(format!("empty task id in '{s}'"));
        }
        let id = |x: &str| -> Result<u64, String> {
            match x.trim().parse::<u64>() {
                Ok(0) => Err(format!("'{p}': task ids start at 1")),
                Ok(v) => Ok(v),
                Err(_) => Err(format!("'{p}' is not a task id or a range like 17-20")),
            }
        };
        let r = match p.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (id(a)?, id(b)?);
                if a > b {
                    return Err(format!("'{p}': the range ends before it starts"));
                }
                a..=b
            }
            None => {
                let v = id(p)?;
                v..=v
            }
        };
        out.push(r);
    }
    Ok(out)
}

/// `ids` (any order) as the list `parse` reads back: `5,17-20`.
pub fn format(ids: &[u64]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut spans: Vec<RangeInclusive<u64>> = Vec::new();
    for id in sorted {
        match spans.last_mut() {
            Some(r) if *r.end() + 1 == id => *r = *r.start()..=id,
            _ => spans.push(id..=id),
        }
    }
    let show = |r: &RangeInclusive<u64>| {
        if r.start() == r.end() {
            r.start().to_string()
        } else {
            format!("{}-{}", r.start(), r.end())
        }
    };
    spans.iter().map(show).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_formatted_list_parses_back_to_its_ids() {
        let f = format(&[20, 5, 17, 18, 19, 5, 3]);
        assert_eq!(f, "3,5,17-20");
        let back: Vec<u64> = parse(&f).unwrap().into_iter().flatten().collect();
        assert_eq!(back, [3, 5, 17, 18, 19, 20]);
        assert_eq!(format(&[]), "");
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse("5,17-20, 3").unwrap(), vec![5..=5, 17..=20, 3..=3]);
        assert_eq!(parse("7").unwrap(), vec![7..=7]);
    }

    #[test]
    fn bad_pieces_are_named() {
        assert_eq!(parse("5,,6").unwrap_err(), "empty task id in '5,,6'");
        assert_eq!(parse("0").unwrap_err(), "'0': task ids start at 1");
        assert_eq!(parse("9-3").unwrap_err(), "'9-3': the range ends before it starts");
        assert_eq!(parse("1,x").unwrap_err(), "'x' is not a task id or a range like 17-20");
        assert!(parse("-4").is_err() && parse("3-").is_err() && parse("").is_err());
    }
}
