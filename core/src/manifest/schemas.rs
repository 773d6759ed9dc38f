//! The params and result JSON Schemas a manifest names, compiled once at load.

use super::{model::TaskSpec, reader::Problems};
use serde_json::Value;
use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

/// How many schema violations a failure reason lists before "and N more".
const MAX_LISTED_VIOLATIONS: usize = 3;

/// One compiled JSON Schema.
#[derive(Clone)]
pub struct Schema {
    path: PathBuf,
    document: Value,
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema").field("path", &self.path).finish()
    }
}

impl Schema {
    /// Reads and compiles a schema file; the error says what is wrong with it.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = crate::files::read_regular(path, crate::files::MAX_CONFIG_BYTES)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let document: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
        let validator = jsonschema::validator_for(&document)
            .map_err(|e| format!("{} is not a valid JSON Schema: {e}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            document,
            validator: Arc::new(validator),
        })
    }

    /// The schema file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema as JSON (for the TaskDef's inputSchema/outputSchema).
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// Checks `instance`; the error lists the first violations, each as
    /// `<label><json pointer>: <message>` (e.g. `params/count: "x" is not of type "integer"`).
    pub fn validate(&self, label: &str, instance: &Value) -> Result<(), String> {
        let mut violations = self.validator.iter_errors(instance);
        let mut listed = Vec::new();
        let mut more = 0usize;
        for error in violations.by_ref() {
            if listed.len() < MAX_LISTED_VIOLATIONS {
                listed.push(format!("{label}{}: {error}", error.instance_path()));
            } else {
                more += 1;
            }
        }
        if listed.is_empty() {
            return Ok(());
        }
        let mut reason = listed.join("; ");
        if more > 0 {
            reason.push_str(&format!("; and {more} more"));
        }
        Err(reason)
    }
}

/// The manifest's schemas, if it names them.
#[derive(Debug, Clone, Default)]
pub struct Schemas {
    /// Validates `params`.
    pub params: Option<Schema>,
    /// Validates the body's result.
    pub result: Option<Schema>,
}

impl Schemas {
    pub(crate) fn load(p: &mut Problems, task: &TaskSpec) -> Self {
        let mut one = |key: &str, path: &Option<PathBuf>| {
            path.as_ref().and_then(|path| match Schema::load(path) {
                Ok(schema) => Some(schema),
                Err(problem) => {
                    p.add(key, problem);
                    None
                }
            })
        };
        Self {
            params: one("task.params_schema", &task.params_schema),
            result: one("task.result_schema", &task.result_schema),
        }
    }
}
