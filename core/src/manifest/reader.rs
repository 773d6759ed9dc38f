//! A small reader over a parsed TOML table that records every problem with its dotted key and
//! rejects keys it was never asked for, so one pass reports everything wrong with a manifest.

use super::errors::Problem;
use toml::{Table, Value};

/// Collects problems in the order they are found.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub(crate) Vec<Problem>);

impl Problems {
    pub(crate) fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }
}

/// One TOML table and the keys read from it so far.
#[derive(Debug)]
pub(crate) struct Section<'a> {
    /// Dotted path of this table (`task`, `workspace.publish_budget`).
    path: String,
    table: &'a Table,
    read: Vec<&'static str>,
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a datetime",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

impl<'a> Section<'a> {
    pub(crate) fn new(path: impl Into<String>, table: &'a Table) -> Self {
        Self {
            path: path.into(),
            table,
            read: Vec::new(),
        }
    }

    /// The dotted key of `name` in this table.
    pub(crate) fn key(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    pub(crate) fn get(&mut self, name: &'static str) -> Option<&'a Value> {
        self.read.push(name);
        self.table.get(name)
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.table.contains_key(name)
    }

    fn wrong_type(&self, p: &mut Problems, name: &str, expected: &str, found: &Value) {
        p.add(
            self.key(name),
            format!("expected {expected}, found {}", type_name(found)),
        );
    }

    pub(crate) fn string(&mut self, p: &mut Problems, name: &'static str) -> Option<String> {
        match self.get(name)? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.wrong_type(p, name, "a string", other);
                None
            }
        }
    }

    pub(crate) fn required_string(
        &mut self,
        p: &mut Problems,
        name: &'static str,
        hint: &str,
    ) -> Option<String> {
        if !self.has(name) {
            self.read.push(name);
            p.add(self.key(name), format!("missing ({hint})"));
            return None;
        }
        self.string(p, name)
    }

    /// An integer in `min..=max`.
    pub(crate) fn integer(
        &mut self,
        p: &mut Problems,
        name: &'static str,
        min: i64,
        max: i64,
    ) -> Option<i64> {
        match self.get(name)? {
            Value::Integer(n) if *n < min => {
                p.add(self.key(name), format!("must be at least {min}, found {n}"));
                None
            }
            Value::Integer(n) if *n > max => {
                p.add(self.key(name), format!("must be at most {max}, found {n}"));
                None
            }
            Value::Integer(n) => Some(*n),
            other => {
                self.wrong_type(p, name, "an integer", other);
                None
            }
        }
    }

    /// A non-empty array of non-empty strings (a command line).
    pub(crate) fn argv(&mut self, p: &mut Problems, name: &'static str) -> Option<Vec<String>> {
        let value = self.get(name)?;
        let Value::Array(items) = value else {
            self.wrong_type(
                p,
                name,
                "an array of strings (a command and its arguments)",
                value,
            );
            return None;
        };
        if items.is_empty() {
            p.add(self.key(name), "must name a command: the array is empty");
            return None;
        }
        let mut argv = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) if s.contains('\0') => {
                    p.add(
                        format!("{}[{i}]", self.key(name)),
                        "contains a NUL character",
                    );
                    return None;
                }
                Value::String(s) => argv.push(s.clone()),
                other => {
                    p.add(
                        format!("{}[{i}]", self.key(name)),
                        format!("expected a string, found {}", type_name(other)),
                    );
                    return None;
                }
            }
        }
        if argv[0].is_empty() {
            p.add(
                format!("{}[0]", self.key(name)),
                "the command name is empty",
            );
            return None;
        }
        Some(argv)
    }

    /// One of `choices` (by their manifest spelling).
    pub(crate) fn choice<T: Copy>(
        &mut self,
        p: &mut Problems,
        name: &'static str,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let value = self.string(p, name)?;
        match choices.iter().find(|(spelling, _)| *spelling == value) {
            Some((_, v)) => Some(*v),
            None => {
                let names: Vec<&str> = choices.iter().map(|(s, _)| *s).collect();
                p.add(
                    self.key(name),
                    format!(
                        "unknown value {value:?} (expected one of {})",
                        names.join(", ")
                    ),
                );
                None
            }
        }
    }

    /// A sub-table.
    pub(crate) fn table(&mut self, p: &mut Problems, name: &'static str) -> Option<Section<'a>> {
        let key = self.key(name);
        match self.get(name)? {
            Value::Table(t) => Some(Section::new(key, t)),
            other => {
                self.wrong_type(p, name, "a table", other);
                None
            }
        }
    }

    /// The table itself, for free-form maps such as `body.env`.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'a String, &'a Value)> {
        self.table.iter()
    }

    /// Reports every key that no getter asked for.
    pub(crate) fn finish(self, p: &mut Problems) {
        let mut unknown: Vec<&String> = self
            .table
            .keys()
            .filter(|k| !self.read.contains(&k.as_str()))
            .collect();
        unknown.sort();
        if unknown.is_empty() {
            return;
        }
        let mut known = self.read.clone();
        known.sort_unstable();
        known.dedup();
        let section = if self.path.is_empty() {
            "the manifest".to_owned()
        } else {
            format!("[{}]", self.path)
        };
        for key in unknown {
            p.add(
                self.key(key),
                format!("unknown key (keys of {section}: {})", known.join(", ")),
            );
        }
    }
}
