//! The Conductor TaskDef a manifest describes (`perago extract`), per the TaskDef model of
//! Conductor OSS: timeouts, retries, input/output keys and the params/result schemas.

use crate::manifest::{Manifest, Schema, TaskKind};
use serde_json::{Map, Value, json};

/// The schema of a workspace task's `workspace` input, as the shape rules check it.
fn workspace_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "repository": {"type": "string", "minLength": 1},
            "branch": {"type": "string", "minLength": 1},
            "prefix": {"type": "string"},
            "ref": {"type": "string", "minLength": 1}
        },
        "required": ["repository", "branch", "prefix"],
        "additionalProperties": false
    })
}

/// Embeds a user schema under a wrapper. Giving it its own `$id` keeps its internal
/// `"$ref": "#/…"` references pointing into itself rather than into the wrapper.
fn embedded(schema: &Schema, id: String) -> Value {
    let mut doc = schema.document().clone();
    if let Value::Object(map) = &mut doc {
        map.entry("$id").or_insert(Value::String(id));
    }
    doc
}

fn wrapper(keys: &[&str], properties: Map<String, Value>) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": keys,
        "additionalProperties": false
    })
}

/// `inputSchema`: the whole input (`params` and, for workspace tasks, `workspace`), with the
/// manifest's params schema inside. `None` without a params schema.
pub fn input_schema(manifest: &Manifest) -> Option<Value> {
    let params = manifest.schemas.params.as_ref()?;
    let name = &manifest.task.name;
    let mut properties = Map::new();
    properties.insert(
        "params".into(),
        embedded(params, format!("urn:perago:{name}:params")),
    );
    if manifest.task.kind == TaskKind::Workspace {
        properties.insert("workspace".into(), workspace_input_schema());
    }
    Some(wrapper(manifest.task.kind.input_keys(), properties))
}

/// `outputSchema`: the whole output, with the manifest's result schema inside. `None` without
/// a result schema.
pub fn output_schema(manifest: &Manifest) -> Option<Value> {
    let result = manifest.schemas.result.as_ref()?;
    let name = &manifest.task.name;
    let mut properties = Map::new();
    properties.insert(
        "result".into(),
        embedded(result, format!("urn:perago:{name}:result")),
    );
    if manifest.task.kind == TaskKind::Workspace {
        properties.insert("workspace".into(), json!({"type": "object"}));
    }
    Some(wrapper(manifest.task.kind.output_keys(), properties))
}

fn schema_def(name: String, data: Value) -> Value {
    json!({"name": name, "version": 1, "type": "JSON", "data": data})
}

/// The TaskDef JSON for `POST /api/metadata/taskdefs` (as one element of the array) or
/// `PUT /api/metadata/taskdefs`.
pub fn task_def(manifest: &Manifest) -> Value {
    let task = &manifest.task;
    let mut def = json!({
        "name": task.name,
        "description": task.description.clone().unwrap_or_else(|| {
            format!("{} ({} task run by perago)", task.name, task.kind)
        }),
        "retryCount": task.retry_count,
        "retryLogic": task.retry_logic.as_str(),
        "retryDelaySeconds": task.retry_delay_seconds,
        "timeoutSeconds": task.timeout_seconds,
        "responseTimeoutSeconds": task.response_timeout_seconds,
        "timeoutPolicy": task.timeout_policy.as_str(),
        "inputKeys": task.kind.input_keys(),
        "outputKeys": task.kind.output_keys(),
    });
    if let Some(email) = &task.owner_email {
        def["ownerEmail"] = json!(email);
    }
    // Conductor OSS stores schemas without enforcing them; perago checks them itself in the
    // executor, with reasons that name the field. enforceSchema stays false so a server that
    // does enforce (Orkes) does not fail the workflow before the worker can say why.
    if let Some(schema) = input_schema(manifest) {
        def["inputSchema"] = schema_def(format!("{}.input", task.name), schema);
    }
    if let Some(schema) = output_schema(manifest) {
        def["outputSchema"] = schema_def(format!("{}.output", task.name), schema);
    }
    if def.get("inputSchema").is_some() || def.get("outputSchema").is_some() {
        def["enforceSchema"] = json!(false);
    }
    def
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, path::Path};

    fn load(dir: &Path, manifest: &str) -> Manifest {
        fs::write(dir.join("task.toml"), manifest).unwrap();
        Manifest::load(&dir.join("task.toml")).unwrap()
    }

    const FREE: &str = r#"
[task]
name = "echo.params"
kind = "workspace-free"
owner_email = "data@example.com"
timeout_seconds = 120
response_timeout_seconds = 30
retry_count = 2
retry_logic = "LINEAR_BACKOFF"
retry_delay_seconds = 1
[body]
command = ["cat"]
"#;

    #[test]
    fn workspace_free_task_def() {
        let tmp = tempfile::tempdir().unwrap();
        let def = task_def(&load(tmp.path(), FREE));
        assert_eq!(
            def,
            json!({
                "name": "echo.params",
                "description": "echo.params (workspace-free task run by perago)",
                "ownerEmail": "data@example.com",
                "retryCount": 2,
                "retryLogic": "LINEAR_BACKOFF",
                "retryDelaySeconds": 1,
                "timeoutSeconds": 120,
                "responseTimeoutSeconds": 30,
                "timeoutPolicy": "TIME_OUT_WF",
                "inputKeys": ["params"],
                "outputKeys": ["result"],
            })
        );
    }

    #[test]
    fn workspace_task_def_derives_response_timeout_and_wraps_schemas() {
        let tmp = tempfile::tempdir().unwrap();
        // A schema with an internal reference: embedding must keep it resolvable.
        fs::write(
            tmp.path().join("params.json"),
            r##"{"type":"object","properties":{"day":{"$ref":"#/$defs/day"}},"required":["day"],"$defs":{"day":{"type":"string","pattern":"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}}"##,
        )
        .unwrap();
        fs::write(
            tmp.path().join("result.json"),
            r#"{"type":"object","required":["rows"]}"#,
        )
        .unwrap();
        let manifest = load(
            tmp.path(),
            r#"
[task]
name = "features.build"
kind = "workspace"
timeout_seconds = 3600
params_schema = "params.json"
result_schema = "result.json"
[body]
command = ["./build.sh"]
[workspace.publish_budget]
seconds = 300
"#,
        );
        let def = task_def(&manifest);
        assert_eq!(def["responseTimeoutSeconds"], 300);
        assert_eq!(def["inputKeys"], json!(["workspace", "params"]));
        assert_eq!(def["outputKeys"], json!(["workspace", "result"]));
        assert_eq!(def["enforceSchema"], false);
        assert_eq!(def["inputSchema"]["name"], "features.build.input");
        assert_eq!(def["inputSchema"]["type"], "JSON");
        assert_eq!(def["outputSchema"]["name"], "features.build.output");
        assert!(def.get("ownerEmail").is_none());

        // The exported schemas are themselves valid and describe the whole input/output.
        let input = jsonschema::validator_for(&def["inputSchema"]["data"]).unwrap();
        let ws = json!({"repository": "r", "branch": "main", "prefix": "p/"});
        assert!(input.is_valid(&json!({"workspace": ws, "params": {"day": "2026-11-30"}})));
        assert!(!input.is_valid(&json!({"workspace": ws, "params": {"day": "yesterday"}})));
        assert!(!input.is_valid(&json!({"params": {"day": "2026-11-30"}})));
        assert!(
            !input.is_valid(&json!({"workspace": ws, "params": {"day": "2026-11-30"}, "x": 1}))
        );
        let output = jsonschema::validator_for(&def["outputSchema"]["data"]).unwrap();
        assert!(output.is_valid(&json!({"workspace": {}, "result": {"rows": 3}})));
        assert!(!output.is_valid(&json!({"workspace": {}, "result": {}})));
    }
}
