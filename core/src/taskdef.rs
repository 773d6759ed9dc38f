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
