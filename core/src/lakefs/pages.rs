//! Pagination, checked in one place: every page lakeFS sends, of a listing (objects, diff,
//! branches: [`LakefsClient::list_pages`]) or of a log ([`check_log_page`]), goes through
//! [`next_page`] before anything in it is used, and a page that could loop or skip is refused,
//! never followed.

use super::{
    Commit, LakefsClient, LakefsError, MAX_KEY_BYTES, MAX_PAGE,
    models::{Page, Pagination, commit_id},
};
use reqwest::Method;

impl LakefsClient {
    /// Every entry of the paginated listing at `path` (with `query` besides `after` and
    /// `amount`), each checked by `check` as its page arrives; each page must continue the
    /// listing ([`next_page`], by the entries' `key`), and more than `max` entries is
    /// [`LakefsError::TooMany`].
    pub(super) async fn list_pages<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        path: &str,
        query: &[(&str, &str)],
        max: usize,
        key: impl Fn(&T) -> &str,
        check: impl Fn(&T) -> Result<(), LakefsError>,
    ) -> Result<Vec<T>, LakefsError> {
        let amount = MAX_PAGE.to_string();
        let mut after = String::new();
        let mut out = Vec::new();
        loop {
            let mut page_query = query.to_vec();
            page_query.extend([("after", after.as_str()), ("amount", amount.as_str())]);
            let bytes = self.read(op, Method::GET, path, &page_query).await?;
            let page: Page<T> = Self::decode(op, &bytes)?;
            drop(bytes);
            page.results.iter().try_for_each(&check)?;
            let keys: Vec<&str> = page.results.iter().map(&key).collect();
            let next = next_page(op, &after, Order::Keys, &keys, &page.pagination)?;
            if out.len() + page.results.len() > max {
                return Err(LakefsError::TooMany {
                    op: op.to_owned(),
                    max,
                });
            }
            out.extend(page.results);
            match next {
                Some(next) => after = next,
                None => return Ok(out),
            }
        }
    }
}

/// One checked page of a branch log.
#[derive(Debug, Clone)]
pub struct LogPage {
    /// The commits, newest first; every id is a commit id.
    pub commits: Vec<Commit>,
    /// The `after` of the next page (the last commit's id), `None` on the last page.
    pub next: Option<String>,
}

/// A log page as lakeFS sends it (`LogCommits` in its controller), checked by [`next_page`]
/// in [`Order::Log`].
pub fn check_log_page(
    op: &str,
    after: &str,
    amount: u32,
    page: Page<Commit>,
) -> Result<LogPage, LakefsError> {
    let ids: Vec<&str> = page.results.iter().map(|c| c.id.as_str()).collect();
    let next = next_page(op, after, Order::Log { amount }, &ids, &page.pagination)?;
    Ok(LogPage {
        commits: page.results,
        next,
    })
}

/// How the pages of a listing follow each other.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// A listing (`paginationFor` in lakeFS's controller): keys in byte order strictly after
    /// `after`; a page that says `has_more` has results and a `next_offset` past `after`, not
    /// before its last key.
    Keys,
    /// A log (`LogCommits`): at most `amount` commit ids, none of them `after` itself; a page
    /// that says `has_more` has commits and gives the last one's id as `next_offset`.
    Log {
        /// The most commits asked for.
        amount: u32,
    },
}

/// Checks one page (its entries' `keys`, in the order sent) and returns where the next one
/// starts (`None`: this was the last). Anything that could loop or skip is refused.
fn next_page(
    op: &str,
    after: &str,
    order: Order,
    keys: &[&str],
    pagination: &Pagination,
) -> Result<Option<String>, LakefsError> {
    let refuse = |message: String| {
        Err(LakefsError::Pagination {
            op: op.to_owned(),
            message,
        })
    };
    let short = |key: &str| key.chars().take(80).collect::<String>();
    match order {
        Order::Keys => {
            let mut last: Option<&str> = None;
            for &key in keys {
                if key.len() > MAX_KEY_BYTES {
                    return refuse(format!(
                        "a key of {} bytes (lakeFS keys are at most {MAX_KEY_BYTES})",
                        key.len()
                    ));
                }
                if key <= last.unwrap_or(after) {
                    return refuse(format!(
                        "key {:?} does not come after {:?}",
                        short(key),
                        short(last.unwrap_or(after))
                    ));
                }
                last = Some(key);
            }
        }
        Order::Log { amount } => {
            if keys.len() > amount as usize {
                return refuse(format!(
                    "{} commits in a page of at most {amount}",
                    keys.len()
                ));
            }
            for &id in keys {
                commit_id(op, id.to_owned())?;
                if id == after {
                    return refuse(format!("commit {after} listed again after itself"));
                }
            }
        }
    }
    if !pagination.has_more {
        return Ok(None);
    }
    let next = pagination.next_offset.as_str();
    let Some(&last) = keys.last() else {
        return refuse(
            match order {
                Order::Keys => "a page with has_more but no results",
                Order::Log { .. } => "a page with has_more but no commits",
            }
            .to_owned(),
        );
    };
    if let Order::Log { .. } = order {
        if next != last {
            return refuse(format!(
                "next_offset {:?} is not the last commit listed, {last}",
                short(next)
            ));
        }
        return Ok(Some(last.to_owned()));
    }
    if next.len() > MAX_KEY_BYTES {
        return refuse(format!("a next_offset of {} bytes", next.len()));
    }
    if next <= after {
        return refuse(format!(
            "next_offset {:?} does not advance past {:?}",
            short(next),
            short(after)
        ));
    }
    if next < last {
        return refuse(format!(
            "next_offset {:?} is before the last key returned, {:?}",
            short(next),
            short(last)
        ));
    }
    Ok(Some(next.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn log_page(ids: &[&str], has_more: bool, next: &str) -> Page<Commit> {
        serde_json::from_value(json!({
            "pagination": {"has_more": has_more, "next_offset": next},
            "results": ids.iter().map(|id| json!({"id": id, "parents": []})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    #[test]
    fn a_log_page_must_continue_the_log() {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let page = check_log_page("log", "", 2, log_page(&[&b, &a], true, &a)).unwrap();
        assert_eq!(page.next.as_deref(), Some(a.as_str()));
        assert_eq!(page.commits.len(), 2);
        let last = check_log_page("log", &a, 2, log_page(&[&c], false, "")).unwrap();
        assert!(last.next.is_none());
        let refused = |page, after: &str, amount| {
            check_log_page("log", after, amount, page)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(log_page(&[&b, &a, &c], false, ""), "", 2),
            "lakeFS log: bad pagination: 3 commits in a page of at most 2; refused"
        );
        assert_eq!(
            refused(log_page(&[&b, &a], true, &b), "", 2),
            format!(
                "lakeFS log: bad pagination: next_offset \"{b}\" is not the last commit listed, {a}; refused"
            )
        );
        assert_eq!(
            refused(log_page(&[], true, &a), "", 2),
            "lakeFS log: bad pagination: a page with has_more but no commits; refused"
        );
        assert_eq!(
            refused(log_page(&[&a], false, ""), &a, 2),
            format!("lakeFS log: bad pagination: commit {a} listed again after itself; refused")
        );
        assert!(refused(log_page(&["HEAD"], false, ""), "", 2).contains("is not a commit id"));
    }
}
