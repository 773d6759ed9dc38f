//! Pagination and delimiter folding shared by every list endpoint, as the real server does it:
//! keys in byte order, `after` exclusive, common prefixes counted once at their first key, and
//! `next_offset` = the last key returned.

use serde::Serialize;

use super::error::LakefsError;

/// Default page size when `amount` is absent or `<= 0`.
pub(crate) const DEFAULT_PER_PAGE: usize = 100;
/// The largest `amount`; also what every `Pagination.max_per_page` says.
pub(crate) const MAX_PER_PAGE: usize = 1000;

/// The `Pagination` object of every list response.
#[derive(Debug, Serialize)]
pub(crate) struct Pagination {
    pub(crate) has_more: bool,
    pub(crate) next_offset: String,
    pub(crate) results: usize,
    pub(crate) max_per_page: usize,
}

/// A `{pagination, results}` body.
#[derive(Debug, Serialize)]
pub(crate) struct Page<T> {
    pub(crate) pagination: Pagination,
    pub(crate) results: Vec<T>,
}

/// The page size for an `amount` query value: absent or `<= 0` → 100; above 1000 or below -1
/// is what the real server's request validator rejects.
pub(crate) fn amount(raw: Option<&str>) -> Result<usize, LakefsError> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(DEFAULT_PER_PAGE);
    };
    let bad = || {
        LakefsError::BadRequest(format!(
            "parameter \"amount\" in query has an error: value {raw}: must be an integer between -1 and {MAX_PER_PAGE}"
        ))
    };
    let n: i64 = raw.parse().map_err(|_| bad())?;
    match n {
        n if !(-1..=MAX_PER_PAGE as i64).contains(&n) => Err(bad()),
        n if n <= 0 => Ok(DEFAULT_PER_PAGE),
        n => Ok(n as usize),
    }
}

/// One row of a delimited listing.
#[derive(Debug)]
pub(crate) enum Row<T> {
    Item(String, T),
    CommonPrefix(String),
}

impl<T> Row<T> {
    fn key(&self) -> &str {
        match self {
            Self::Item(key, _) | Self::CommonPrefix(key) => key,
        }
    }
}

/// What to list.
#[derive(Debug, Default)]
pub(crate) struct Query<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) after: &'a str,
    pub(crate) delimiter: &'a str,
    pub(crate) amount: usize,
}

/// One page of `items` (sorted by key) under `query`.
pub(crate) fn page<'k, T>(
    items: impl IntoIterator<Item = (&'k str, T)>,
    query: &Query<'_>,
) -> (Vec<Row<T>>, Pagination) {
    let mut rows: Vec<Row<T>> = Vec::new();
    let mut has_more = false;
    for (key, item) in items {
        if !key.starts_with(query.prefix) || key <= query.after {
            continue;
        }
        let row = match fold(key, query) {
            Some(common) => {
                // `after` naming a common prefix skips the prefix and everything under it.
                if common.as_str() <= query.after || rows.last().is_some_and(|r| r.key() == common)
                {
                    continue;
                }
                Row::CommonPrefix(common)
            }
            None => Row::Item(key.to_owned(), item),
        };
        if rows.len() == query.amount {
            has_more = true;
            break;
        }
        rows.push(row);
    }
    let next_offset = if has_more {
        rows.last().map(|r| r.key().to_owned()).unwrap_or_default()
    } else {
        String::new()
    };
    let pagination = Pagination {
        has_more,
        next_offset,
        results: rows.len(),
        max_per_page: MAX_PER_PAGE,
    };
    (rows, pagination)
}

fn fold(key: &str, query: &Query<'_>) -> Option<String> {
    if query.delimiter.is_empty() {
        return None;
    }
    let rest = &key[query.prefix.len()..];
    let at = rest.find(query.delimiter)?;
    Some(format!(
        "{}{}",
        query.prefix,
        &rest[..at + query.delimiter.len()]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<T>(rows: &[Row<T>]) -> Vec<String> {
        rows.iter()
            .map(|r| match r {
                Row::Item(k, _) => k.clone(),
                Row::CommonPrefix(k) => format!("{k}*"),
            })
            .collect()
    }

    #[test]
    fn delimiter_folds_and_pages_count_prefixes_once() {
        let items = ["a/1", "a/2", "b", "c/x/y", "d"].map(|k| (k, ()));
        let q = Query {
            delimiter: "/",
            amount: 2,
            ..Default::default()
        };
        let (rows, p) = page(items, &q);
        assert_eq!(keys(&rows), ["a/*", "b"]);
        assert!(p.has_more);
        assert_eq!(p.next_offset, "b");
        let q = Query {
            delimiter: "/",
            amount: 2,
            after: "b",
            ..Default::default()
        };
        let (rows, p) = page(items, &q);
        assert_eq!(keys(&rows), ["c/*", "d"]);
        assert!(!p.has_more);
        assert_eq!(p.next_offset, "");
        let q = Query {
            delimiter: "/",
            amount: 10,
            after: "a/",
            ..Default::default()
        };
        assert_eq!(keys(&page(items, &q).0), ["b", "c/*", "d"]);
    }

    #[test]
    fn prefix_and_amount_rules() {
        let items = ["x/1", "x/2", "y"].map(|k| (k, ()));
        let q = Query {
            prefix: "x/",
            amount: 100,
            ..Default::default()
        };
        assert_eq!(keys(&page(items, &q).0), ["x/1", "x/2"]);
        assert_eq!(amount(None).unwrap(), 100);
        assert_eq!(amount(Some("-1")).unwrap(), 100);
        assert_eq!(amount(Some("0")).unwrap(), 100);
        assert_eq!(amount(Some("1000")).unwrap(), 1000);
        assert!(amount(Some("1001")).is_err());
        assert!(amount(Some("-2")).is_err());
        assert!(amount(Some("ten")).is_err());
    }
}
