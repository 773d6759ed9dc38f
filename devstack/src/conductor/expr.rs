//! Resolution of `${…}` expressions in `inputParameters` and `outputParameters` (schemaVersion 2):
//! `${workflow.input.x}`, `${workflow.workflowId}`, `${workflow.correlationId}`,
//! `${ref.output.y}`, `${ref.input.y}`, with dotted paths and numeric array indexes.
//!
//! A string that is exactly one expression is replaced by the JSON value it points at (`null`
//! when missing); expressions embedded in a longer string are replaced by their text.

use serde_json::{Map, Value};

/// Looks a root path (`workflow.input`, `ref.output`, …) up; the rest of the path is walked here.
pub(crate) trait Scope {
    /// The value named by the first two segments, e.g. `("workflow", "input")`.
    fn root(&self, first: &str, second: &str) -> Option<Value>;
}

/// Resolves every expression inside `params`.
pub(crate) fn resolve_map(params: &Map<String, Value>, scope: &dyn Scope) -> Map<String, Value> {
    params
        .iter()
        .map(|(k, v)| (k.clone(), resolve(v, scope)))
        .collect()
}

fn resolve(value: &Value, scope: &dyn Scope) -> Value {
    match value {
        Value::String(s) => resolve_str(s, scope),
        Value::Array(items) => Value::Array(items.iter().map(|v| resolve(v, scope)).collect()),
        Value::Object(map) => Value::Object(resolve_map(map, scope)),
        other => other.clone(),
    }
}

fn resolve_str(s: &str, scope: &dyn Scope) -> Value {
    if let Some(path) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
        && !path.contains("${")
    {
        return lookup(path, scope).unwrap_or(Value::Null);
    }
    if !s.contains("${") {
        return Value::String(s.to_owned());
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let path = &rest[start + 2..start + len];
        match lookup(path, scope) {
            Some(Value::String(text)) => out.push_str(&text),
            Some(Value::Null) | None => {}
            Some(other) => out.push_str(&other.to_string()),
        }
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    Value::String(out)
}

fn lookup(path: &str, scope: &dyn Scope) -> Option<Value> {
    let mut segments = path.trim().split('.');
    let first = segments.next()?;
    let second = segments.next()?;
    let mut current = scope.root(first, second)?;
    for segment in segments {
        current = match current {
            Value::Object(mut map) => map.remove(segment)?,
            Value::Array(mut items) => {
                let index: usize = segment.parse().ok()?;
                if index >= items.len() {
                    return None;
                }
                items.swap_remove(index)
            }
            _ => return None,
        };
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    struct Fixed;

    impl Scope for Fixed {
        fn root(&self, first: &str, second: &str) -> Option<Value> {
            match (first, second) {
                ("workflow", "input") => Some(json!({"n": 3, "name": "x", "list": [1, 2]})),
                ("step", "output") => Some(json!({"sum": 7})),
                _ => None,
            }
        }
    }

    #[test]
    fn whole_expressions_keep_json_types_and_embedded_ones_become_text() {
        let params = json!({
            "n": "${workflow.input.n}",
            "second": "${workflow.input.list.1}",
            "sum": "${step.output.sum}",
            "missing": "${other.output.x}",
            "text": "n=${workflow.input.n} name=${workflow.input.name}",
            "nested": {"all": ["${step.output}", 5]},
        });
        let resolved = resolve_map(params.as_object().unwrap(), &Fixed);
        assert_eq!(
            Value::Object(resolved),
            json!({
                "n": 3,
                "second": 2,
                "sum": 7,
                "missing": null,
                "text": "n=3 name=x",
                "nested": {"all": [{"sum": 7}, 5]},
            })
        );
    }
}
