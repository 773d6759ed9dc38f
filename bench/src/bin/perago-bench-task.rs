//! The benchmarks' Rust task body: returns its params. Started by the supervisor in place of
//! `perago-executor` (`body.executor`).

#![forbid(unsafe_code)]

use perago_executor::task::{Task, TaskContext, TaskError};
use serde_json::{Map, Value};

struct Echo;

impl Task for Echo {
    fn run(&self, _ctx: &TaskContext, params: &Map<String, Value>) -> Result<Value, TaskError> {
        Ok(Value::Object(params.clone()))
    }
}

fn main() {
    std::process::exit(perago_executor::task::main(Echo));
}
