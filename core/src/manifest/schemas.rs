//! The params and result JSON Schemas a manifest names, compiled once at load.

use super::{model::TaskSpec, reader::Problems};
use serde_json::Value;
use std::{
    fmt, io,
    path::{Path, PathBuf},
    sync::Arc,
};

/// How many schema violations a failure reason lists before "and N more".
const MAX_LISTED_VIOLATIONS: usize = 3;

/// A schema file that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The schema file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not JSON.
    #[error("{} is not valid JSON", path.display())]
    Json {
        /// The schema file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON is not a JSON Schema.
    #[error("{} is not a valid JSON Schema: {message}", path.display())]
    NotASchema {
        /// The schema file.
        path: PathBuf,
        /// What the schema compiler says.
        message: String,
    },
}

/// One place where an instance breaks its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What was checked (`params`, `result`).
    pub label: String,
    /// The JSON pointer of the bad value (empty for the instance itself).
    pub pointer: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}: {}", self.label, self.pointer, self.message)
    }
}

/// An instance that does not match its schema: the first violations, and how many more there
/// are. Displays as `<violation>; <violation>; and N more`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}", listed.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), if *more > 0 { format!("; and {more} more") } else { String::new() })]
pub struct SchemaViolations {
    /// The first violations (at most three).
    pub listed: Vec<Violation>,
    /// How many more there are.
    pub more: usize,
}

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
    pub fn load(path: &Path) -> Result<Self, SchemaError> {
        Self::read_with(path, &super::source::read_file)
    }

    /// [`Schema::load`], the file's text coming from `read` (the disk, or a snapshot's copy).
    pub(crate) fn read_with(
        path: &Path,
        read: super::source::Reader<'_>,
    ) -> Result<Self, SchemaError> {
        let text = read(path).map_err(|source| SchemaError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::compile(path, &text)
    }

    /// Compiles schema text read from `path`.
    fn compile(path: &Path, text: &str) -> Result<Self, SchemaError> {
        let document: Value = serde_json::from_str(text).map_err(|source| SchemaError::Json {
            path: path.to_owned(),
            source,
        })?;
        let validator =
            jsonschema::validator_for(&document).map_err(|e| SchemaError::NotASchema {
                path: path.to_owned(),
                message: crate::errors::chain(&e),
            })?;
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
    pub fn validate(&self, label: &str, instance: &Value) -> Result<(), SchemaViolations> {
        let mut violations = self.validator.iter_errors(instance);
        let mut listed = Vec::new();
        let mut more = 0usize;
        for error in violations.by_ref() {
            if listed.len() < MAX_LISTED_VIOLATIONS {
                listed.push(Violation {
                    label: label.to_owned(),
                    pointer: error.instance_path().to_string(),
                    message: crate::errors::chain(&error),
                });
            } else {
                more += 1;
            }
        }
        if listed.is_empty() {
            return Ok(());
        }
        Err(SchemaViolations { listed, more })
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
    pub(crate) fn load(p: &mut Problems, task: &TaskSpec, read: super::source::Reader<'_>) -> Self {
        let mut one = |key: &str, path: &Option<PathBuf>| {
            path.as_ref()
                .and_then(|path| match Schema::read_with(path, read) {
                    Ok(schema) => Some(schema),
                    Err(problem) => {
                        p.add(key, crate::errors::chain(&problem));
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
