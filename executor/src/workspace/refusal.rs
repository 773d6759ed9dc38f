//! What a publish refused by lakeFS's configuration says (issue #24, item 7).
//!
//! A branch protection rule blocks staging writes and commits on the branches it matches
//! (`403 cannot write to protected branch`, `403 cannot commit to protected branch`); a rule such
//! as `*` or `perago-*` covers every staging branch, so every attempt is refused the same way. A
//! read-only repository refuses every write (`403 read-only repository`). A failed lakeFS hook
//! (pre-create-branch, pre-commit, pre-merge action) answers `412` with the hook's run id and
//! error.
//!
//! Retry semantics: a 403 is configuration, and the rule is read again on every write, so a
//! Conductor retry would run the body again only to be refused again: the attempt is
//! FAILED_WITH_TERMINAL_ERROR (Conductor does not retry it; the workflow fails unless the task is
//! optional), with a reason naming the branch, the rule and what to change; once it is changed,
//! `POST /workflow/{id}/retry` runs the task again. A 412 is FAILED (retried as Conductor's
//! `retryCount` allows): a hook may be a webhook that was down or timed out, which lakeFS
//! reports as the same 412, so a retry may pass; a hook that judges the change refuses each
//! retry, bounded by `retryCount`.

use super::flow::WorkspaceFailure;
use perago_core::lakefs::LakefsError;

/// Which write of a publish lakeFS refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Cutting the staging branch, uploading or deleting on it.
    Stage,
    /// Committing the staging branch.
    Commit,
    /// Merging into the target branch.
    Merge,
}

impl Step {
    fn action(self) -> &'static str {
        match self {
            Self::Stage => "writing to",
            Self::Commit => "committing on",
            Self::Merge => "merging into",
        }
    }
}

/// The step, status and message of a failure lakeFS refused with 403 or 412, if it is one.
pub fn refused(failure: &WorkspaceFailure) -> Option<(Step, u16, &str)> {
    let (step, error) = match failure {
        WorkspaceFailure::Staging(e) => (Step::Stage, e),
        WorkspaceFailure::StagingCommit(e) => (Step::Commit, e),
        WorkspaceFailure::Publish(e) => (Step::Merge, e),
        _ => return None,
    };
    match error {
        LakefsError::Status {
            status: status @ (403 | 412),
            message,
            ..
        } => Some((step, *status, message.as_str())),
        _ => None,
    }
}

/// Whether `pattern` matches all of `name` as lakeFS matches a protection rule: `*` any run of
/// characters, `?` one character, anything else itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || (p[i] != '*' && p[i] == n[j])) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// Where a refused publish was going.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The repository.
    pub repository: &'a str,
    /// The branch the change is merged into.
    pub branch: &'a str,
    /// The attempt's staging branch.
    pub staging: &'a str,
}

/// The failure that says what lakeFS refused and what to change. `rules` are the repository's
/// branch protection patterns, when they were read (after a 403 naming a protected branch).
pub fn explain(
    step: Step,
    status: u16,
    message: &str,
    target: Target<'_>,
    rules: Option<Result<Vec<String>, String>>,
) -> WorkspaceFailure {
    let Target {
        repository,
        branch: target_branch,
        staging,
    } = target;
    let branch = match step {
        Step::Merge => target_branch,
        Step::Stage | Step::Commit => staging,
    };
    let action = step.action();
    if status == 412 {
        return WorkspaceFailure::HookFailed {
            what: format!(
                "{action} {branch} in repository {repository} was aborted by a hook (HTTP 412: {message})"
            ),
            remedy: format!(
                "see the action run in lakeFS (lakectl actions runs list lakefs://{repository}) and fix the hook or what it checks"
            ),
        };
    }
    let (what, remedy) = if message.contains("protected branch") {
        let rule = match rules {
            Some(Ok(patterns)) => {
                let matching: Vec<String> = patterns
                    .iter()
                    .filter(|p| glob_match(p, branch))
                    .map(|p| format!("{p:?}"))
                    .collect();
                match matching.len() {
                    0 => "a branch protection rule".to_owned(),
                    1 => format!("the branch protection rule {}", matching[0]),
                    _ => format!("the branch protection rules {}", matching.join(", ")),
                }
            }
            Some(Err(problem)) => {
                format!("a branch protection rule (the rules could not be read: {problem})")
            }
            None => "a branch protection rule".to_owned(),
        };
        (
            format!(
                "{action} {branch} in repository {repository} is blocked by {rule} (HTTP 403: {message})"
            ),
            format!(
                "perago stages each attempt's change on its own branch perago-staging-<execution id> and merges it into {target_branch}: change the rule so that it does not match perago-staging-* (a rule on {target_branch} itself is fine: lakeFS lets merges into a protected branch through)"
            ),
        )
    } else if message.contains("read-only") {
        (
            format!("repository {repository} is read-only (HTTP 403: {message})"),
            "make it writable, or name a writable repository in workspace.repository".to_owned(),
        )
    } else {
        (
            format!(
                "{action} {branch} in repository {repository} is forbidden (HTTP 403: {message})"
            ),
            "a lakeFS setting or permission refuses it: change it".to_owned(),
        )
    };
    WorkspaceFailure::Forbidden { what, remedy }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Target<'static> = Target {
        repository: "r",
        branch: "main",
        staging: "perago-staging-e1",
    };

    fn status(status: u16, message: &str) -> LakefsError {
        LakefsError::Status {
            op: "upload".into(),
            status,
            message: message.into(),
        }
    }

    #[test]
    fn a_protected_staging_branch_names_the_rule_and_what_to_change_and_is_terminal() {
        let failure = WorkspaceFailure::Staging(status(403, "cannot write to protected branch"));
        let (step, code, message) = refused(&failure).unwrap();
        let rules = Some(Ok(vec!["main".to_owned(), "perago-*".to_owned()]));
        let explained = explain(step, code, message, TARGET, rules);
        assert!(explained.is_terminal());
        assert_eq!(
            explained.to_string(),
            "publish refused by lakeFS: writing to perago-staging-e1 in repository r is blocked by the branch protection rule \"perago-*\" (HTTP 403: cannot write to protected branch); perago stages each attempt's change on its own branch perago-staging-<execution id> and merges it into main: change the rule so that it does not match perago-staging-* (a rule on main itself is fine: lakeFS lets merges into a protected branch through); nothing was published, and the task is not retried: a retry would be refused the same way"
        );
        let unread = explain(step, code, message, TARGET, Some(Err("HTTP 401".into())));
        assert!(
            unread.to_string().contains(
                "blocked by a branch protection rule (the rules could not be read: HTTP 401)"
            ),
            "{unread}"
        );
    }

    #[test]
    fn a_failed_hook_names_the_hook_and_is_retried() {
        let message = "pre-merge hook aborted, run id 'r1': hook run id 'h1' failed on action 'check' hook 'lint': action failed: bad";
        let failure = WorkspaceFailure::Publish(status(412, message));
        let (step, code, text) = refused(&failure).unwrap();
        assert_eq!(step, Step::Merge);
        let explained = explain(step, code, text, TARGET, None);
        assert!(!explained.is_terminal());
        assert_eq!(
            explained.to_string(),
            format!(
                "publish refused by a lakeFS hook: merging into main in repository r was aborted by a hook (HTTP 412: {message}); see the action run in lakeFS (lakectl actions runs list lakefs://r) and fix the hook or what it checks; nothing was published"
            )
        );
    }

    #[test]
    fn only_403_and_412_of_a_write_are_refusals() {
        assert!(refused(&WorkspaceFailure::Staging(status(500, "x"))).is_none());
        assert!(refused(&WorkspaceFailure::Download(status(403, "x"))).is_none());
        let read_only = WorkspaceFailure::StagingCommit(status(403, "read-only repository"));
        let (step, code, message) = refused(&read_only).unwrap();
        assert!(
            explain(step, code, message, TARGET, None)
                .to_string()
                .starts_with("publish refused by lakeFS: repository r is read-only (HTTP 403: read-only repository); make it writable")
        );
    }

    #[test]
    fn rule_patterns_match_whole_names() {
        assert!(glob_match("*", "perago-staging-1"));
        assert!(glob_match("perago-?taging-*", "perago-staging-1"));
        assert!(!glob_match("main", "perago-staging-1"));
        assert!(!glob_match("perago", "perago-staging-1"));
    }
}
